"""A small Python client of the coordinator (used by `pathmaster query`, benchmarks, tests).

    with CoordinatorClient("127.0.0.1:50051") as client:
        for event in client.submit(cells_from_files(["c1.png", "c1-mask.png"]), "urgent"):
            ...   # pb.CaseEvent: a site_result per site as it answers, then the summary
        client.class_stats("urgent")

The coordinator's request classes are the client's: it asks the coordinator once (Info,
on the control port) for its class table (`client.classes`: names, DSCPs, order,
descriptions; services/classinfo.py) and which port serves each class. A case then travels
with its class's DSCP both ways: on a channel marked with the DSCP of the coordinator's
table to that class's port, whose socket marks the streamed replies too (qos/transport.py).
A coordinator that advertises no class ports (an older one) gets every case on its control
port: requests still marked, replies not.

Cells analysed here (`analyse_locally`, `pathmaster query --analyse-locally`) travel as
their feature vectors. A site that looks through a pretrained eye (SiteInfo.model_sha256,
its id; SiteInfo.eye, its description) needs each cell's eye vector too. The eye is public
(a frozen network from a registry package), so the client opens the same eye, computes each
cell's vector here and sends it with the features (a few kB a cell, where the cell's patch
would be 150 kB); the site applies its own lens on top. Sites that look through another eye
than the first get the images; sites that compare features alone never see the vectors.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path, PurePath

import grpc

from pathmaster import defaults
from pathmaster.ids import id_from_name
from pathmaster.records import InvalidInput
from qos.classes import ClassTable, RequestClass, UnknownClass
from qos import channels as transport_channels
from qos.transport import STALE_PORT_CODES, ClassChannels, TLSFiles, files_signature
from services.classinfo import table_from_info
from services.shared import QUERY_DEADLINE_S
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc
from services.tracing import case_span, end_span, end_span_code

log = logging.getLogger("pathmaster.client")

# Extra time the client allows past the case deadline for the coordinator's last events.
REPLY_MARGIN_S = 5.0
QUICK_CALL_S = 10.0
INFO_TIMEOUT_S = 5.0   # asking for the classes and their ports; a coordinator that is down fails at once
COORDINATOR = "coordinator"  # the one target of this client's ClassChannels


def cells_from_files(paths) -> list[pb.CellImage]:
    """Read cell files into CellImages, pairing NAME.EXT with NAME-background.EXT and
    NAME-mask.EXT or Herlev's NAME-d.bmp (the gateway's rule). Raises InvalidInput naming a file that cannot be
    read, does not pair or is not of an accepted format (from its header: `accepted_format`)."""
    from pathmaster.image.io import accepted_format
    from services.gateway.pairing import mask_labels, pair_files

    pairing = pair_files(str(p) for p in paths)
    if pairing.problems:
        name, problem = pairing.problems[0]
        raise InvalidInput(problem, name)
    cells = []
    for files in pairing.cells:
        parts = {role: _read(getattr(files, role)) for role in ("image", "background", "mask")
                 if getattr(files, role)}
        for role, data in parts.items():
            accepted_format(data, getattr(files, role))
        if "mask" in parts:
            parts["mask"] = mask_labels(files.mask, parts["mask"])
        cells.append(pb.CellImage(cell_id=id_from_name(PurePath(files.image).name), **parts))
    return cells


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise InvalidInput("file not found", path) from None
    except OSError as exc:
        raise InvalidInput(f"cannot read: {exc.strerror}", path) from None


class CoordinatorClient:
    """Calls to one coordinator at `address` ("host:port"), TLS when `tls` is given.

    Thread-safe: the batch and the gateway share one client between many cases.
    """

    def __init__(self, address: str, tls: TLSFiles | None = None):
        self.address = address
        self.tls = tls
        # No class channel before the coordinator has said which classes it has.
        self._channels = ClassChannels({COORDINATOR: address}, ClassTable({}), tls)
        self._old_channels: list[ClassChannels] = []  # of an earlier table: calls in flight finish
        self._learnt: tuple[ClassTable, dict[str, int]] | None = None  # None: not asked yet (or to ask again)
        self._learn_lock = threading.Lock()

    def _stub(self, request_class: str | None = None) -> pb_grpc.CoordinatorStub:
        return pb_grpc.CoordinatorStub(self._channels.channel(COORDINATOR, request_class))

    def class_address(self, request_class: str) -> str:
        """Where this client sends `request_class`'s cases (the control address until the
        coordinator's class ports are known, or when it has none)."""
        return self._channels.address(COORDINATOR, request_class)

    def _learn(self) -> tuple[ClassTable, dict[str, int]]:
        """The coordinator's class table and class ports, asked once (Info) and used from
        then on. Raises grpc.RpcError when the coordinator cannot be asked now (down, TLS
        refused); the next call asks again."""
        with self._learn_lock:
            if self._learnt is None:
                try:
                    info = self._stub().Info(pb.CoordinatorInfoRequest(), timeout=INFO_TIMEOUT_S)
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                        raise
                    log.info("coordinator %s has no Info: no class ports, its replies are unmarked", self.address)
                    info = None
                classes = table_from_info(info)
                ports = dict(info.class_ports) if info is not None else {}
                if classes != self._channels.classes:  # first answer, or a coordinator with a new table
                    self._old_channels.append(self._channels)
                    self._channels = ClassChannels({COORDINATOR: self.address}, classes, self.tls)
                self._channels.set_class_ports(COORDINATOR, ports)
                self._learnt = (classes, ports)
            return self._learnt

    @property
    def classes(self) -> ClassTable:
        """The coordinator's request classes, most favoured first (asked once). Raises
        grpc.RpcError when the coordinator cannot be asked."""
        return self._learn()[0]

    def request_class(self, name: str) -> RequestClass:
        """`name` in the coordinator's table. Raises UnknownClass naming the coordinator's
        classes, grpc.RpcError when the coordinator cannot be asked."""
        return self.classes[name]

    def learn_class_ports(self) -> dict[str, int]:
        """Ask the coordinator (once) for its classes and which port serves each, and use
        them from now on; returns the ports ({} from an older coordinator, which has none).
        When the coordinator cannot be asked now (down, TLS refused), cases go to the
        control port, where the same failure is reported, and the next case asks again."""
        try:
            return dict(self._learn()[1])
        except grpc.RpcError:
            return {}

    def _forget_class_ports(self, call) -> None:
        """A case that failed on a class port as a stale port map does (STALE_PORT_CODES)
        makes the next case ask again: the coordinator may have restarted on other ports
        (or with another class table). (Runs on a gRPC thread: no lock.)"""
        self.case_ended_on_class_port(call.code())

    def case_ended_on_class_port(self, code: grpc.StatusCode) -> None:
        """A case sent to a class port ended with `code`: a stale port map's code
        (STALE_PORT_CODES) makes the next case ask the coordinator again."""
        if code in STALE_PORT_CODES:
            self._learnt = None

    def learnt_classes(self) -> ClassTable | None:
        """The coordinator's class table if it has been asked already, else None (not yet,
        or to be asked again). Never calls the coordinator."""
        learnt = self._learnt
        return learnt[0] if learnt is not None else None

    def case_route(self, request_class: str) -> tuple[str, int | None, bool]:
        """(address, DSCP or None, whether a class port) of `request_class`'s cases: its
        class's port, marked with its DSCP, when the coordinator has the class; else the
        control port, unmarked (the coordinator then refuses the class by name). Asks the
        coordinator for its classes first when not asked yet (`_learn`)."""
        try:
            table = self._learn()[0]
        except grpc.RpcError:
            return self.address, None, False
        if request_class not in table:
            return self.address, None, False
        address = self.class_address(request_class)
        return address, table[request_class].dscp, address != self.address

    def feature_schema(self) -> str:
        """The feature schema the coordinator analyses with ("" while it does not)."""
        return self._stub().Info(pb.CoordinatorInfoRequest(), timeout=INFO_TIMEOUT_S).feature_schema

    def submit(self, cells: list[pb.CellImage], request_class: str = "routine", *, k: int = defaults.K,
               deadline_s: float = QUERY_DEADLINE_S, sites: list[str] | None = None, case_id: str = "",
               ship: str = "auto", features: list[pb.CellFeatures] | None = None, feature_schema: str = "",
               concept_weights: dict[str, float] | None = None):
        """Submit a case; returns the gRPC stream of pb.CaseEvent (iterate it; `.cancel()`
        cancels the case): the plan (how each site gets the case and its predicted time),
        a site_result per site as it answers, then the summary. Raises grpc.RpcError when
        iterated if the case is refused. The case goes to its class's port (marked both
        ways); an unknown class goes to the control port unmarked, and the coordinator
        refuses it by name.

        ship: "auto" (features to sites with the coordinator's feature schema, images to
        the rest), "features" or "images". features/feature_schema: cells analysed here
        (`analyse_locally`); `cells` then carry only their ids. concept_weights: refine by
        concept ({concept: weight}, services/site/explain.py): the sites re-rank."""
        request = case_request(cells, request_class, k=k, deadline_s=deadline_s, sites=sites,
                               case_id=case_id, ship=ship, features=features,
                               feature_schema=feature_schema, concept_weights=concept_weights)
        _, dscp, on_class_port = self.case_route(request_class)
        stub = self._stub(request_class if dscp is not None else None)  # None: unknown class, control port
        span, metadata = case_span(request_class, len(cells) or len(features or []))
        call = stub.SubmitCase(request, timeout=deadline_s + REPLY_MARGIN_S, metadata=metadata)
        call.add_done_callback(lambda done: end_span(span, done))  # the case's trace root
        if on_class_port:
            call.add_done_callback(self._forget_class_ports)
        return call

    def class_stats(self, request_class: str = "") -> list[pb.ClassStats]:
        """Per-class completion-time statistics (every class when empty)."""
        reply = self._stub().GetClassStats(pb.ClassStatsRequest(request_class=request_class),
                                           timeout=QUICK_CALL_S)
        return list(reply.classes)

    def sites(self) -> list[pb.SiteStatus]:
        return list(self._stub().ListSites(pb.SitesRequest(), timeout=QUICK_CALL_S).sites)

    def image(self, site: str, cell_id: str, request_class: str | None = None) -> pb.ImageReply:
        """The full image (PNG), diagnosis and mask of a database cell at `site`; with
        `request_class`, on that class's port, marked as it is both ways (the page fetches
        larger images in the lowest class, behind every case)."""
        stub = self._stub()
        if request_class is not None:
            _, dscp, _ = self.case_route(request_class)
            stub = self._stub(request_class if dscp is not None else None)
        return stub.GetImage(pb.ImageRequest(site=site, cell_id=cell_id), timeout=QUICK_CALL_S)

    def describe(self, error: grpc.RpcError) -> str:
        """`describe_error`, plus which TLS setting to check when the failure looks like a
        TLS mismatch between this client and the coordinator; for a coordinator that
        cannot be reached at all, "UNAVAILABLE: " and `unreachable` instead of gRPC's text."""
        hint = tls_hint(error, self.tls)  # a TLS mismatch also looks unreachable: say which
        if not hint and is_unreachable(error):
            log.debug("coordinator %s: %s", self.address, describe_error(error))
            return f"{error.code().name}: {unreachable(self.address)}"
        return describe_error(error) + hint

    def close(self) -> None:
        for channels in [*self._old_channels, self._channels]:
            channels.close()

    def __enter__(self) -> "CoordinatorClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def case_request(cells: list[pb.CellImage], request_class: str, *, k: int = defaults.K,
                 deadline_s: float = QUERY_DEADLINE_S, sites: list[str] | None = None,
                 case_id: str = "", ship: str = "auto", features: list[pb.CellFeatures] | None = None,
                 feature_schema: str = "", concept_weights: dict[str, float] | None = None) -> pb.CaseRequest:
    """The CaseRequest of `CoordinatorClient.submit`'s arguments (concept_weights: refine
    by concept, services/site/explain.py)."""
    return pb.CaseRequest(case_id=case_id, request_class=request_class, cells=cells,
                          sites=sites or [], k=k, deadline_s=deadline_s, ship=ship,
                          features=features or [], feature_schema=feature_schema,
                          concept_weights=concept_weights or {})


class AsyncCases:
    """Cases sent with asyncio (grpc.aio) for an asyncio server such as the gateway: a case
    is awaited on the event loop, so it holds no thread while the sites work, and as many
    cases stream at once as the server lets connections in.

    Where a case goes and how it is marked are `client`'s (a CoordinatorClient: the
    coordinator's class table and class ports, asked once; its TLS files); the channels are
    this object's, bound to the event loop they are first used on. Use it on one loop;
    `await close()` on that loop.
    """

    def __init__(self, client: CoordinatorClient):
        self.client = client
        self._channels: dict[tuple, grpc.aio.Channel] = {}

    def _channel(self, address: str, dscp: int | None) -> grpc.aio.Channel:
        tls = self.client.tls
        signature = files_signature([Path(p) for p in (tls.cert, tls.key, tls.ca) if p]) if tls else ()
        key = (address, dscp, signature)  # rotated TLS files: new connections with the new files
        if key not in self._channels:
            self._channels[key] = transport_channels.open_channel(address, dscp, tls, aio=True)  # as ClassChannels does
        return self._channels[key]

    async def submit(self, cells: list[pb.CellImage], request_class: str, *, k: int = defaults.K,
                     deadline_s: float = QUERY_DEADLINE_S, case_id: str = "",
                     concept_weights: dict[str, float] | None = None):
        """The case's pb.CaseEvents as they arrive (an async generator), as
        `CoordinatorClient.submit` sends it. Raises grpc.aio.AioRpcError (a grpc.RpcError)
        when the case is refused or fails. Closing the generator cancels the call, which
        frees the sites."""
        if self.client.learnt_classes() is None:  # asks the coordinator: off the event loop
            route = await asyncio.to_thread(self.client.case_route, request_class)
        else:
            route = self.client.case_route(request_class)
        address, dscp, on_class_port = route
        request = case_request(cells, request_class, k=k, deadline_s=deadline_s, case_id=case_id,
                               concept_weights=concept_weights)
        span, metadata = case_span(request_class, len(cells))
        stub = pb_grpc.CoordinatorStub(self._channel(address, dscp))
        call = stub.SubmitCase(request, timeout=deadline_s + REPLY_MARGIN_S, metadata=metadata)
        code = grpc.StatusCode.CANCELLED  # unless it ends otherwise
        try:
            async for event in call:
                yield event
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()
            raise
        finally:
            call.cancel()  # nothing when the call has ended
            end_span_code(span, code)
            if on_class_port:
                self.client.case_ended_on_class_port(code)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


def analyse_locally(cells: list[pb.CellImage], *, eye=None, identity: str = ""
                    ) -> tuple[list[pb.CellImage], list[pb.CellFeatures], str]:
    """Analyse a case's cells in this process, as the coordinator would, so that only
    their feature vectors (about 1 KB a cell) are uploaded.

    eye, identity: a pretrained eye (``pathmaster.eye.Eye``) and its id: each cell's vector
    by it goes with its features, for the sites that look through it (``local_analysis_plan``).
    Returns (cells with only their ids, their CellFeatures, the feature schema). Raises
    InvalidInput naming the first cell that cannot be analysed.
    """
    from pathmaster.eye._vectors import eye_vectors_of, pack_eye_vector
    from pathmaster.features.schema import feature_schema
    from pathmaster.analysis.cell import analyse_cell
    from pathmaster.site.database import image_hash
    from services.cells import decode_cell

    ids, vectors = [], []
    for cell in cells:
        rgb, background, mask = decode_cell(cell.cell_id, cell.image, cell.background, cell.mask)
        analysis = analyse_cell(rgb, background, mask, source=f"cell {cell.cell_id!r}")
        ids.append(pb.CellImage(cell_id=cell.cell_id))
        features = pb.CellFeatures(cell_id=cell.cell_id, values=[float(v) for v in analysis.features],
                                   background_estimated=analysis.background_estimated,
                                   mask_estimated=analysis.mask_estimated,
                                   image_sha256=bytes.fromhex(image_hash(rgb)))
        if eye is not None:
            features.embedding = pack_eye_vector(eye_vectors_of(eye, analysis.patch[None])[0])
            features.model_sha256 = identity
        vectors.append(features)
    return ids, vectors, feature_schema()


def local_analysis_plan(statuses: list[pb.SiteStatus], only: list[str] | None = None
                        ) -> tuple[list[str], list[str], tuple[str, str]]:
    """(the sites the cells' eye vectors go to, the sites that get the cells' images instead,
    (the eye's id, its description) or ("", "")): the eyed sites are those looking through
    the first eye a site names that this client can open; sites that read an eye
    (``policy.reads_network``) the coordinator does not name (``ListSites`` names it only
    when it can open it), or another eye, get the images. ``only``: the case's sites (None:
    every one)."""
    from pathmaster.learning.policy import reads_network
    from services.coordinator.learnt import SiteEyes

    eyes, eyed, images, chosen = SiteEyes(), [], [], ("", "")
    for status in statuses:
        if only and status.site not in only:
            continue
        identity = status.info.model_sha256
        if identity and not chosen[0]:
            try:
                eyes.get(identity, status.info.eye)
                chosen = (identity, status.info.eye)
            except Exception:  # noqa: BLE001 - an eye this client cannot open: that site gets the images
                pass
        if identity and identity == chosen[0]:
            eyed.append(status.site)
        elif identity or reads_network(status.info.similarity, status.info.abnormal_score):
            images.append(status.site)
    return sorted(eyed), sorted(images), chosen


def images_without_network_why(sites: list[str]):
    """Why a case analysed here still carries its images (``local_analysis_plan``)."""
    from pathmaster.records import Why

    return Why("images_without_network", {"sites": ", ".join(sites)})


def local_analysis_why(cells: int, eyed_sites: list[str]):
    """Why a case analysed here went as it did (a `pathmaster.records.Why`; words in
    services/reasons.py): features alone, or with eye vectors for `eyed_sites`."""
    from pathmaster.records import Why

    if not eyed_sites:
        return Why("analysed_here", {"cells": cells})
    return Why("analysed_here_with_eye", {"cells": cells, "sites": ", ".join(eyed_sites)})


def describe_error(error: grpc.RpcError) -> str:
    """"STATUS: details" of a failed call, for people."""
    return f"{error.code().name}: {error.details()}"


def unknown_class_message(error: UnknownClass, coordinator: str) -> str:
    """What a client says of a class the coordinator at `coordinator` does not have (`error`:
    from the client's learnt table), naming the coordinator's classes, in the words of the
    coordinator's own refusal."""
    return (f"INVALID_ARGUMENT: the coordinator at {coordinator} has no request class "
            f"{error.name!r}; its classes: {', '.join(error.known)}")


# What gRPC says when nothing accepts the connection (refused, no route, unknown host).
UNREACHABLE_DETAILS = ("failed to connect to all addresses", "connection refused",
                       "dns resolution failed", "no route to host", "name or service not known")


def is_unreachable(error: grpc.RpcError) -> bool:
    """True when a call failed because the coordinator could not be connected to at all."""
    details = (error.details() or "").lower()
    return error.code() == grpc.StatusCode.UNAVAILABLE and any(d in details for d in UNREACHABLE_DETAILS)


def unreachable(address: str) -> str:
    """What to tell a person whose coordinator at `address` cannot be reached."""
    return (f"The coordinator at {address} is not reachable; is it running? "
            "(start one with `pathmaster demo` or `pathmaster serve coordinator`)")


def tls_hint(error: grpc.RpcError, tls: TLSFiles | None) -> str:
    """" (what to check)" when a call to the coordinator failed the way a TLS mismatch
    fails, else "". gRPC only says "Socket closed" when a plaintext client meets a TLS
    server, and "handshake failed" when the certificates do not fit."""
    if error.code() != grpc.StatusCode.UNAVAILABLE:
        return ""
    details = error.details() or ""
    if tls is None and "Socket closed" in details:
        return (" (the coordinator closed the connection: if it serves TLS, connect with "
                "--tls-ca, and --tls-cert/--tls-key when it demands a client certificate)")
    if tls is not None and "handshake" in details.lower():
        return (" (the TLS handshake failed: does the coordinator serve TLS, did --tls-ca "
                "sign its certificate, does it demand a client certificate "
                "(--tls-cert/--tls-key)?)")
    return ""
