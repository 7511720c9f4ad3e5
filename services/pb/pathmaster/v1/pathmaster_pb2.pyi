from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CellImage(_message.Message):
    __slots__ = ("cell_id", "image", "background", "mask")
    CELL_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    cell_id: str
    image: bytes
    background: bytes
    mask: bytes
    def __init__(self, cell_id: _Optional[str] = ..., image: _Optional[bytes] = ..., background: _Optional[bytes] = ..., mask: _Optional[bytes] = ...) -> None: ...

class CellFeatures(_message.Message):
    __slots__ = ("cell_id", "values", "background_estimated", "mask_estimated", "embedding", "model_sha256", "patch", "image_sha256")
    CELL_ID_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    MASK_ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    PATCH_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SHA256_FIELD_NUMBER: _ClassVar[int]
    cell_id: str
    values: _containers.RepeatedScalarFieldContainer[float]
    background_estimated: bool
    mask_estimated: bool
    embedding: bytes
    model_sha256: str
    patch: bytes
    image_sha256: bytes
    def __init__(self, cell_id: _Optional[str] = ..., values: _Optional[_Iterable[float]] = ..., background_estimated: _Optional[bool] = ..., mask_estimated: _Optional[bool] = ..., embedding: _Optional[bytes] = ..., model_sha256: _Optional[str] = ..., patch: _Optional[bytes] = ..., image_sha256: _Optional[bytes] = ...) -> None: ...

class Match(_message.Message):
    __slots__ = ("cell_id", "diagnosis", "distance", "thumbnail", "source_id", "image_sha256", "bethesda", "similarity", "measure_log2_ratio", "measure_share", "same_cell")
    CELL_ID_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSIS_FIELD_NUMBER: _ClassVar[int]
    DISTANCE_FIELD_NUMBER: _ClassVar[int]
    THUMBNAIL_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_SHA256_FIELD_NUMBER: _ClassVar[int]
    BETHESDA_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    MEASURE_LOG2_RATIO_FIELD_NUMBER: _ClassVar[int]
    MEASURE_SHARE_FIELD_NUMBER: _ClassVar[int]
    SAME_CELL_FIELD_NUMBER: _ClassVar[int]
    cell_id: str
    diagnosis: str
    distance: float
    thumbnail: bytes
    source_id: str
    image_sha256: str
    bethesda: str
    similarity: float
    measure_log2_ratio: _containers.RepeatedScalarFieldContainer[int]
    measure_share: _containers.RepeatedScalarFieldContainer[int]
    same_cell: bool
    def __init__(self, cell_id: _Optional[str] = ..., diagnosis: _Optional[str] = ..., distance: _Optional[float] = ..., thumbnail: _Optional[bytes] = ..., source_id: _Optional[str] = ..., image_sha256: _Optional[str] = ..., bethesda: _Optional[str] = ..., similarity: _Optional[float] = ..., measure_log2_ratio: _Optional[_Iterable[int]] = ..., measure_share: _Optional[_Iterable[int]] = ..., same_cell: _Optional[bool] = ...) -> None: ...

class CellResult(_message.Message):
    __slots__ = ("query_cell_id", "matches", "background_estimated", "mask_estimated", "error", "abnormal_score", "abnormal")
    QUERY_CELL_ID_FIELD_NUMBER: _ClassVar[int]
    MATCHES_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    MASK_ESTIMATED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ABNORMAL_SCORE_FIELD_NUMBER: _ClassVar[int]
    ABNORMAL_FIELD_NUMBER: _ClassVar[int]
    query_cell_id: str
    matches: _containers.RepeatedCompositeFieldContainer[Match]
    background_estimated: bool
    mask_estimated: bool
    error: str
    abnormal_score: float
    abnormal: bool
    def __init__(self, query_cell_id: _Optional[str] = ..., matches: _Optional[_Iterable[_Union[Match, _Mapping]]] = ..., background_estimated: _Optional[bool] = ..., mask_estimated: _Optional[bool] = ..., error: _Optional[str] = ..., abnormal_score: _Optional[float] = ..., abnormal: _Optional[bool] = ...) -> None: ...

class SiteTiming(_message.Message):
    __slots__ = ("transfer_s", "extraction_s", "search_s", "total_s", "site_wall_s", "queue_s", "service_s")
    TRANSFER_S_FIELD_NUMBER: _ClassVar[int]
    EXTRACTION_S_FIELD_NUMBER: _ClassVar[int]
    SEARCH_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    SITE_WALL_S_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    SERVICE_S_FIELD_NUMBER: _ClassVar[int]
    transfer_s: float
    extraction_s: float
    search_s: float
    total_s: float
    site_wall_s: float
    queue_s: float
    service_s: float
    def __init__(self, transfer_s: _Optional[float] = ..., extraction_s: _Optional[float] = ..., search_s: _Optional[float] = ..., total_s: _Optional[float] = ..., site_wall_s: _Optional[float] = ..., queue_s: _Optional[float] = ..., service_s: _Optional[float] = ...) -> None: ...

class ImageRequest(_message.Message):
    __slots__ = ("site", "cell_id")
    SITE_FIELD_NUMBER: _ClassVar[int]
    CELL_ID_FIELD_NUMBER: _ClassVar[int]
    site: str
    cell_id: str
    def __init__(self, site: _Optional[str] = ..., cell_id: _Optional[str] = ...) -> None: ...

class ImageReply(_message.Message):
    __slots__ = ("cell_id", "image", "diagnosis", "mask")
    CELL_ID_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSIS_FIELD_NUMBER: _ClassVar[int]
    MASK_FIELD_NUMBER: _ClassVar[int]
    cell_id: str
    image: bytes
    diagnosis: str
    mask: bytes
    def __init__(self, cell_id: _Optional[str] = ..., image: _Optional[bytes] = ..., diagnosis: _Optional[str] = ..., mask: _Optional[bytes] = ...) -> None: ...

class Reason(_message.Message):
    __slots__ = ("code", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CODE_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    code: str
    params: _containers.ScalarMap[str, str]
    def __init__(self, code: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ...) -> None: ...

class TermCount(_message.Message):
    __slots__ = ("bethesda", "count")
    BETHESDA_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    bethesda: str
    count: int
    def __init__(self, bethesda: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class CellConclusion(_message.Message):
    __slots__ = ("query_cell_id", "bethesda", "support", "total", "spread", "abnormal_score", "abnormal", "why", "abnormal_term", "abnormal_sites", "nilm_sites")
    QUERY_CELL_ID_FIELD_NUMBER: _ClassVar[int]
    BETHESDA_FIELD_NUMBER: _ClassVar[int]
    SUPPORT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    SPREAD_FIELD_NUMBER: _ClassVar[int]
    ABNORMAL_SCORE_FIELD_NUMBER: _ClassVar[int]
    ABNORMAL_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    ABNORMAL_TERM_FIELD_NUMBER: _ClassVar[int]
    ABNORMAL_SITES_FIELD_NUMBER: _ClassVar[int]
    NILM_SITES_FIELD_NUMBER: _ClassVar[int]
    query_cell_id: str
    bethesda: str
    support: int
    total: int
    spread: _containers.RepeatedCompositeFieldContainer[TermCount]
    abnormal_score: float
    abnormal: bool
    why: _containers.RepeatedCompositeFieldContainer[Reason]
    abnormal_term: str
    abnormal_sites: _containers.RepeatedScalarFieldContainer[str]
    nilm_sites: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, query_cell_id: _Optional[str] = ..., bethesda: _Optional[str] = ..., support: _Optional[int] = ..., total: _Optional[int] = ..., spread: _Optional[_Iterable[_Union[TermCount, _Mapping]]] = ..., abnormal_score: _Optional[float] = ..., abnormal: _Optional[bool] = ..., why: _Optional[_Iterable[_Union[Reason, _Mapping]]] = ..., abnormal_term: _Optional[str] = ..., abnormal_sites: _Optional[_Iterable[str]] = ..., nilm_sites: _Optional[_Iterable[str]] = ...) -> None: ...

class CaseConclusion(_message.Message):
    __slots__ = ("outcome", "bethesda", "cells_with", "cells_total", "cells", "why", "rule", "threshold")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    BETHESDA_FIELD_NUMBER: _ClassVar[int]
    CELLS_WITH_FIELD_NUMBER: _ClassVar[int]
    CELLS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    RULE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    outcome: str
    bethesda: str
    cells_with: int
    cells_total: int
    cells: _containers.RepeatedCompositeFieldContainer[CellConclusion]
    why: _containers.RepeatedCompositeFieldContainer[Reason]
    rule: str
    threshold: float
    def __init__(self, outcome: _Optional[str] = ..., bethesda: _Optional[str] = ..., cells_with: _Optional[int] = ..., cells_total: _Optional[int] = ..., cells: _Optional[_Iterable[_Union[CellConclusion, _Mapping]]] = ..., why: _Optional[_Iterable[_Union[Reason, _Mapping]]] = ..., rule: _Optional[str] = ..., threshold: _Optional[float] = ...) -> None: ...

class AnalyseRequest(_message.Message):
    __slots__ = ("case_id", "request_class", "cells", "k", "feature_schema", "features", "feature_columns", "concept_weights", "send_id")
    class ConceptWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CASE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    FEATURE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    CONCEPT_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    SEND_ID_FIELD_NUMBER: _ClassVar[int]
    case_id: str
    request_class: str
    cells: _containers.RepeatedCompositeFieldContainer[CellImage]
    k: int
    feature_schema: str
    features: _containers.RepeatedCompositeFieldContainer[CellFeatures]
    feature_columns: _containers.RepeatedScalarFieldContainer[int]
    concept_weights: _containers.ScalarMap[str, float]
    send_id: str
    def __init__(self, case_id: _Optional[str] = ..., request_class: _Optional[str] = ..., cells: _Optional[_Iterable[_Union[CellImage, _Mapping]]] = ..., k: _Optional[int] = ..., feature_schema: _Optional[str] = ..., features: _Optional[_Iterable[_Union[CellFeatures, _Mapping]]] = ..., feature_columns: _Optional[_Iterable[int]] = ..., concept_weights: _Optional[_Mapping[str, float]] = ..., send_id: _Optional[str] = ...) -> None: ...

class SiteLoad(_message.Message):
    __slots__ = ("waiting_cells", "workers", "seconds_per_cell", "waiting_s", "waiting_s_by_class")
    class SecondsPerCellEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class WaitingSByClassEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WAITING_CELLS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_PER_CELL_FIELD_NUMBER: _ClassVar[int]
    WAITING_S_FIELD_NUMBER: _ClassVar[int]
    WAITING_S_BY_CLASS_FIELD_NUMBER: _ClassVar[int]
    waiting_cells: int
    workers: int
    seconds_per_cell: _containers.ScalarMap[str, float]
    waiting_s: float
    waiting_s_by_class: _containers.ScalarMap[str, float]
    def __init__(self, waiting_cells: _Optional[int] = ..., workers: _Optional[int] = ..., seconds_per_cell: _Optional[_Mapping[str, float]] = ..., waiting_s: _Optional[float] = ..., waiting_s_by_class: _Optional[_Mapping[str, float]] = ...) -> None: ...

class AnalyseReply(_message.Message):
    __slots__ = ("site", "algorithm", "cells", "timing", "database_cells", "load")
    SITE_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    DATABASE_CELLS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    site: str
    algorithm: str
    cells: _containers.RepeatedCompositeFieldContainer[CellResult]
    timing: SiteTiming
    database_cells: int
    load: SiteLoad
    def __init__(self, site: _Optional[str] = ..., algorithm: _Optional[str] = ..., cells: _Optional[_Iterable[_Union[CellResult, _Mapping]]] = ..., timing: _Optional[_Union[SiteTiming, _Mapping]] = ..., database_cells: _Optional[int] = ..., load: _Optional[_Union[SiteLoad, _Mapping]] = ...) -> None: ...

class SiteInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SiteInfo(_message.Message):
    __slots__ = ("site", "algorithm", "database_cells", "diagnoses", "workers", "class_ports", "class_dscp", "feature_schema", "load", "vocabulary", "feature_columns", "feature_column_names", "database_origins", "representation", "representation_cells", "pixel_um", "similarity", "similarity_note", "model_sha256", "eye", "abnormal_score", "abnormal_threshold", "abnormal_sensitivity", "abnormal_specificity")
    class ClassPortsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ClassDscpEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class DatabaseOriginsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    SITE_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    DATABASE_CELLS_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    CLASS_PORTS_FIELD_NUMBER: _ClassVar[int]
    CLASS_DSCP_FIELD_NUMBER: _ClassVar[int]
    FEATURE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    VOCABULARY_FIELD_NUMBER: _ClassVar[int]
    FEATURE_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    FEATURE_COLUMN_NAMES_FIELD_NUMBER: _ClassVar[int]
    DATABASE_ORIGINS_FIELD_NUMBER: _ClassVar[int]
    REPRESENTATION_FIELD_NUMBER: _ClassVar[int]
    REPRESENTATION_CELLS_FIELD_NUMBER: _ClassVar[int]
    PIXEL_UM_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_NOTE_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    EYE_FIELD_NUMBER: _ClassVar[int]
    ABNORMAL_SCORE_FIELD_NUMBER: _ClassVar[int]
    ABNORMAL_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    ABNORMAL_SENSITIVITY_FIELD_NUMBER: _ClassVar[int]
    ABNORMAL_SPECIFICITY_FIELD_NUMBER: _ClassVar[int]
    site: str
    algorithm: str
    database_cells: int
    diagnoses: _containers.RepeatedScalarFieldContainer[str]
    workers: int
    class_ports: _containers.ScalarMap[str, int]
    class_dscp: _containers.ScalarMap[str, int]
    feature_schema: str
    load: SiteLoad
    vocabulary: Vocabulary
    feature_columns: _containers.RepeatedScalarFieldContainer[int]
    feature_column_names: _containers.RepeatedScalarFieldContainer[str]
    database_origins: _containers.ScalarMap[str, int]
    representation: str
    representation_cells: int
    pixel_um: float
    similarity: str
    similarity_note: str
    model_sha256: str
    eye: str
    abnormal_score: str
    abnormal_threshold: float
    abnormal_sensitivity: float
    abnormal_specificity: float
    def __init__(self, site: _Optional[str] = ..., algorithm: _Optional[str] = ..., database_cells: _Optional[int] = ..., diagnoses: _Optional[_Iterable[str]] = ..., workers: _Optional[int] = ..., class_ports: _Optional[_Mapping[str, int]] = ..., class_dscp: _Optional[_Mapping[str, int]] = ..., feature_schema: _Optional[str] = ..., load: _Optional[_Union[SiteLoad, _Mapping]] = ..., vocabulary: _Optional[_Union[Vocabulary, _Mapping]] = ..., feature_columns: _Optional[_Iterable[int]] = ..., feature_column_names: _Optional[_Iterable[str]] = ..., database_origins: _Optional[_Mapping[str, int]] = ..., representation: _Optional[str] = ..., representation_cells: _Optional[int] = ..., pixel_um: _Optional[float] = ..., similarity: _Optional[str] = ..., similarity_note: _Optional[str] = ..., model_sha256: _Optional[str] = ..., eye: _Optional[str] = ..., abnormal_score: _Optional[str] = ..., abnormal_threshold: _Optional[float] = ..., abnormal_sensitivity: _Optional[float] = ..., abnormal_specificity: _Optional[float] = ...) -> None: ...

class Vocabulary(_message.Message):
    __slots__ = ("name", "labels", "abnormal", "bethesda")
    class BethesdaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ABNORMAL_FIELD_NUMBER: _ClassVar[int]
    BETHESDA_FIELD_NUMBER: _ClassVar[int]
    name: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    abnormal: _containers.RepeatedScalarFieldContainer[str]
    bethesda: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ..., abnormal: _Optional[_Iterable[str]] = ..., bethesda: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CaseRequest(_message.Message):
    __slots__ = ("case_id", "request_class", "cells", "sites", "k", "deadline_s", "ship", "feature_schema", "features", "concept_weights")
    class ConceptWeightsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    CASE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    SHIP_FIELD_NUMBER: _ClassVar[int]
    FEATURE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    CONCEPT_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    case_id: str
    request_class: str
    cells: _containers.RepeatedCompositeFieldContainer[CellImage]
    sites: _containers.RepeatedScalarFieldContainer[str]
    k: int
    deadline_s: float
    ship: str
    feature_schema: str
    features: _containers.RepeatedCompositeFieldContainer[CellFeatures]
    concept_weights: _containers.ScalarMap[str, float]
    def __init__(self, case_id: _Optional[str] = ..., request_class: _Optional[str] = ..., cells: _Optional[_Iterable[_Union[CellImage, _Mapping]]] = ..., sites: _Optional[_Iterable[str]] = ..., k: _Optional[int] = ..., deadline_s: _Optional[float] = ..., ship: _Optional[str] = ..., feature_schema: _Optional[str] = ..., features: _Optional[_Iterable[_Union[CellFeatures, _Mapping]]] = ..., concept_weights: _Optional[_Mapping[str, float]] = ...) -> None: ...

class SiteResult(_message.Message):
    __slots__ = ("site", "status_code", "status_message", "algorithm", "cells", "timing", "bytes_sent", "bytes_received", "mode", "predicted_s", "request_class", "decisions", "why")
    SITE_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    STATUS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CELLS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_S_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    site: str
    status_code: int
    status_message: str
    algorithm: str
    cells: _containers.RepeatedCompositeFieldContainer[CellResult]
    timing: SiteTiming
    bytes_sent: int
    bytes_received: int
    mode: str
    predicted_s: float
    request_class: str
    decisions: _containers.RepeatedScalarFieldContainer[str]
    why: _containers.RepeatedCompositeFieldContainer[Reason]
    def __init__(self, site: _Optional[str] = ..., status_code: _Optional[int] = ..., status_message: _Optional[str] = ..., algorithm: _Optional[str] = ..., cells: _Optional[_Iterable[_Union[CellResult, _Mapping]]] = ..., timing: _Optional[_Union[SiteTiming, _Mapping]] = ..., bytes_sent: _Optional[int] = ..., bytes_received: _Optional[int] = ..., mode: _Optional[str] = ..., predicted_s: _Optional[float] = ..., request_class: _Optional[str] = ..., decisions: _Optional[_Iterable[str]] = ..., why: _Optional[_Iterable[_Union[Reason, _Mapping]]] = ...) -> None: ...

class CellVote(_message.Message):
    __slots__ = ("query_cell_id", "diagnosis", "votes", "total", "bethesda", "bethesda_votes", "bethesda_total")
    QUERY_CELL_ID_FIELD_NUMBER: _ClassVar[int]
    DIAGNOSIS_FIELD_NUMBER: _ClassVar[int]
    VOTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    BETHESDA_FIELD_NUMBER: _ClassVar[int]
    BETHESDA_VOTES_FIELD_NUMBER: _ClassVar[int]
    BETHESDA_TOTAL_FIELD_NUMBER: _ClassVar[int]
    query_cell_id: str
    diagnosis: str
    votes: int
    total: int
    bethesda: str
    bethesda_votes: int
    bethesda_total: int
    def __init__(self, query_cell_id: _Optional[str] = ..., diagnosis: _Optional[str] = ..., votes: _Optional[int] = ..., total: _Optional[int] = ..., bethesda: _Optional[str] = ..., bethesda_votes: _Optional[int] = ..., bethesda_total: _Optional[int] = ...) -> None: ...

class CaseSummary(_message.Message):
    __slots__ = ("case_id", "request_class", "total_s", "sites_ok", "sites_failed", "bytes_sent", "bytes_received", "votes", "predicted_s", "served_class", "decisions", "analysis_s", "why", "conclusion")
    CASE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_S_FIELD_NUMBER: _ClassVar[int]
    SITES_OK_FIELD_NUMBER: _ClassVar[int]
    SITES_FAILED_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    BYTES_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    VOTES_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_S_FIELD_NUMBER: _ClassVar[int]
    SERVED_CLASS_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_S_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    CONCLUSION_FIELD_NUMBER: _ClassVar[int]
    case_id: str
    request_class: str
    total_s: float
    sites_ok: int
    sites_failed: int
    bytes_sent: int
    bytes_received: int
    votes: _containers.RepeatedCompositeFieldContainer[CellVote]
    predicted_s: float
    served_class: str
    decisions: _containers.RepeatedScalarFieldContainer[str]
    analysis_s: float
    why: _containers.RepeatedCompositeFieldContainer[Reason]
    conclusion: CaseConclusion
    def __init__(self, case_id: _Optional[str] = ..., request_class: _Optional[str] = ..., total_s: _Optional[float] = ..., sites_ok: _Optional[int] = ..., sites_failed: _Optional[int] = ..., bytes_sent: _Optional[int] = ..., bytes_received: _Optional[int] = ..., votes: _Optional[_Iterable[_Union[CellVote, _Mapping]]] = ..., predicted_s: _Optional[float] = ..., served_class: _Optional[str] = ..., decisions: _Optional[_Iterable[str]] = ..., analysis_s: _Optional[float] = ..., why: _Optional[_Iterable[_Union[Reason, _Mapping]]] = ..., conclusion: _Optional[_Union[CaseConclusion, _Mapping]] = ...) -> None: ...

class SitePlan(_message.Message):
    __slots__ = ("site", "mode", "request_class", "predicted_s", "hedge_after_s", "reasons", "why")
    SITE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_S_FIELD_NUMBER: _ClassVar[int]
    HEDGE_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    site: str
    mode: str
    request_class: str
    predicted_s: float
    hedge_after_s: float
    reasons: _containers.RepeatedScalarFieldContainer[str]
    why: _containers.RepeatedCompositeFieldContainer[Reason]
    def __init__(self, site: _Optional[str] = ..., mode: _Optional[str] = ..., request_class: _Optional[str] = ..., predicted_s: _Optional[float] = ..., hedge_after_s: _Optional[float] = ..., reasons: _Optional[_Iterable[str]] = ..., why: _Optional[_Iterable[_Union[Reason, _Mapping]]] = ...) -> None: ...

class CasePlan(_message.Message):
    __slots__ = ("case_id", "request_class", "served_class", "deadline_s", "predicted_s", "sites", "analysis_s", "decisions", "why")
    CASE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    SERVED_CLASS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_S_FIELD_NUMBER: _ClassVar[int]
    SITES_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_S_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    WHY_FIELD_NUMBER: _ClassVar[int]
    case_id: str
    request_class: str
    served_class: str
    deadline_s: float
    predicted_s: float
    sites: _containers.RepeatedCompositeFieldContainer[SitePlan]
    analysis_s: float
    decisions: _containers.RepeatedScalarFieldContainer[str]
    why: _containers.RepeatedCompositeFieldContainer[Reason]
    def __init__(self, case_id: _Optional[str] = ..., request_class: _Optional[str] = ..., served_class: _Optional[str] = ..., deadline_s: _Optional[float] = ..., predicted_s: _Optional[float] = ..., sites: _Optional[_Iterable[_Union[SitePlan, _Mapping]]] = ..., analysis_s: _Optional[float] = ..., decisions: _Optional[_Iterable[str]] = ..., why: _Optional[_Iterable[_Union[Reason, _Mapping]]] = ...) -> None: ...

class CaseEvent(_message.Message):
    __slots__ = ("site_result", "summary", "plan")
    SITE_RESULT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    site_result: SiteResult
    summary: CaseSummary
    plan: CasePlan
    def __init__(self, site_result: _Optional[_Union[SiteResult, _Mapping]] = ..., summary: _Optional[_Union[CaseSummary, _Mapping]] = ..., plan: _Optional[_Union[CasePlan, _Mapping]] = ...) -> None: ...

class ClassStatsRequest(_message.Message):
    __slots__ = ("request_class",)
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    request_class: str
    def __init__(self, request_class: _Optional[str] = ...) -> None: ...

class ClassStats(_message.Message):
    __slots__ = ("request_class", "dscp", "cases", "mean_s", "std_s", "cv", "p50_s", "p95_s", "recent_s")
    REQUEST_CLASS_FIELD_NUMBER: _ClassVar[int]
    DSCP_FIELD_NUMBER: _ClassVar[int]
    CASES_FIELD_NUMBER: _ClassVar[int]
    MEAN_S_FIELD_NUMBER: _ClassVar[int]
    STD_S_FIELD_NUMBER: _ClassVar[int]
    CV_FIELD_NUMBER: _ClassVar[int]
    P50_S_FIELD_NUMBER: _ClassVar[int]
    P95_S_FIELD_NUMBER: _ClassVar[int]
    RECENT_S_FIELD_NUMBER: _ClassVar[int]
    request_class: str
    dscp: int
    cases: int
    mean_s: float
    std_s: float
    cv: float
    p50_s: float
    p95_s: float
    recent_s: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, request_class: _Optional[str] = ..., dscp: _Optional[int] = ..., cases: _Optional[int] = ..., mean_s: _Optional[float] = ..., std_s: _Optional[float] = ..., cv: _Optional[float] = ..., p50_s: _Optional[float] = ..., p95_s: _Optional[float] = ..., recent_s: _Optional[_Iterable[float]] = ...) -> None: ...

class ClassStatsReply(_message.Message):
    __slots__ = ("classes",)
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedCompositeFieldContainer[ClassStats]
    def __init__(self, classes: _Optional[_Iterable[_Union[ClassStats, _Mapping]]] = ...) -> None: ...

class SitesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SiteStatus(_message.Message):
    __slots__ = ("site", "address", "serving", "info")
    SITE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SERVING_FIELD_NUMBER: _ClassVar[int]
    INFO_FIELD_NUMBER: _ClassVar[int]
    site: str
    address: str
    serving: bool
    info: SiteInfo
    def __init__(self, site: _Optional[str] = ..., address: _Optional[str] = ..., serving: _Optional[bool] = ..., info: _Optional[_Union[SiteInfo, _Mapping]] = ...) -> None: ...

class SitesReply(_message.Message):
    __slots__ = ("sites",)
    SITES_FIELD_NUMBER: _ClassVar[int]
    sites: _containers.RepeatedCompositeFieldContainer[SiteStatus]
    def __init__(self, sites: _Optional[_Iterable[_Union[SiteStatus, _Mapping]]] = ...) -> None: ...

class CoordinatorInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CoordinatorInfo(_message.Message):
    __slots__ = ("class_ports", "class_dscp", "classes", "feature_schema")
    class ClassPortsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class ClassDscpEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    CLASS_PORTS_FIELD_NUMBER: _ClassVar[int]
    CLASS_DSCP_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    class_ports: _containers.ScalarMap[str, int]
    class_dscp: _containers.ScalarMap[str, int]
    classes: _containers.RepeatedCompositeFieldContainer[RequestClass]
    feature_schema: str
    def __init__(self, class_ports: _Optional[_Mapping[str, int]] = ..., class_dscp: _Optional[_Mapping[str, int]] = ..., classes: _Optional[_Iterable[_Union[RequestClass, _Mapping]]] = ..., feature_schema: _Optional[str] = ...) -> None: ...

class RequestClass(_message.Message):
    __slots__ = ("name", "dscp", "priority", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DSCP_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    dscp: int
    priority: int
    description: str
    def __init__(self, name: _Optional[str] = ..., dscp: _Optional[int] = ..., priority: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...
