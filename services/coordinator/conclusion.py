"""The case conclusion in the protocol: the sites' answers read by `pathmaster.conclusion`.

One place turns SiteResults into the core's plain data (`site_cells`) and the core's reading
into the CaseConclusion message (`conclusion_message`), so the coordinator's summary, and any
client reading it, see one rule. A site's own per-cell abnormality score and its reading at
the site's operating point (CellResult ``abnormal_score``, ``abnormal``) enter here as
``SiteCell.score`` and ``SiteCell.reading``, and replace that site's match share.
"""

from __future__ import annotations

from pathmaster.conclusion import DEFAULT_THRESHOLD, CaseReading, SiteCell, conclude_case
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.reasons import reasons


def _site_score(cell) -> dict:
    """A site's own score of the cell and its reading at its operating point, where the
    CellResult carries them (``abnormal_score`` present, ``abnormal``)."""
    if "abnormal_score" in cell.DESCRIPTOR.fields_by_name and cell.HasField("abnormal_score"):
        return {"score": cell.abnormal_score, "reading": cell.abnormal}
    return {}


def site_cells(results) -> list[SiteCell]:
    """Every answering site's answer for every cell, from SiteResults (failed sites left out)."""
    return [SiteCell(result.site, cell.query_cell_id, tuple(m.bethesda for m in cell.matches),
                     tuple(m.distance for m in cell.matches), **_site_score(cell))
            for result in results if result.status_code == 0
            for cell in result.cells if not cell.error]


def conclusion_message(reading: CaseReading, threshold: float = DEFAULT_THRESHOLD) -> pb.CaseConclusion:
    """The core's `CaseReading` as a CaseConclusion message."""
    message = pb.CaseConclusion(outcome=reading.outcome, bethesda=reading.term, cells_with=reading.cells_with,
                                cells_total=reading.cells_total, why=reasons(reading.why), rule=reading.rule,
                                threshold=threshold)
    for cell in reading.cells:
        message.cells.add(
            query_cell_id=cell.cell_id, bethesda=cell.term, support=cell.support, total=cell.total,
            spread=[pb.TermCount(bethesda=t, count=n) for t, n in cell.spread],
            abnormal_score=cell.abnormal_score if cell.abnormal_score is not None else 0.0,
            abnormal=cell.abnormal, why=reasons(cell.why), abnormal_term=cell.abnormal_term,
            abnormal_sites=sorted(s for s, r in cell.site_readings.items() if r),
            nilm_sites=sorted(s for s, r in cell.site_readings.items() if not r))
    return message


def case_conclusion(results, cell_ids=None, threshold: float = DEFAULT_THRESHOLD) -> pb.CaseConclusion:
    """The CaseConclusion of a case from its SiteResults (`pathmaster.conclusion.conclude_case`)."""
    return conclusion_message(conclude_case(site_cells(results), threshold, cell_ids=cell_ids), threshold)
