"""The coordinator's own analysis: each cell of a case is analysed once, here.

Sites whose index was built with the coordinator's feature schema then receive feature
vectors (about 1 KB per cell) instead of image, background and mask (about 150 KB per
cell), and only search; each still normalises and selects features with its own
statistics, so its matches are the ones it would find from the images. Sites with another
schema, or their own algorithm, get the images as before.

`CellAnalyser` is a Ray actor (a plain class, so tests can run it in-process): decode the
cell's parts, segment it and estimate its slide when they were not sent, extract features.
`Analysers` keeps a few of them and analyses a case's cells in parallel.
"""

from __future__ import annotations

import logging

import ray

from pathmaster.records import InvalidInput
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.site.cells import decode_cell

log = logging.getLogger("pathmaster.coordinator")


class CellAnalyser:
    """Turns one submitted cell into its raw feature vector (or a per-cell error)."""

    def __init__(self):
        from pathmaster.features.schema import feature_schema
        from pathmaster.site import analyse_cell

        self._analyse = analyse_cell
        self.schema = feature_schema()

    def ready(self) -> str:
        """The feature schema this analyser makes vectors in."""
        return self.schema

    def analyse(self, cell_id: str, image: bytes, background: bytes, mask: bytes) -> pb.CellFeatures | str:
        """The cell's raw feature vector as the wire carries it, or the text of what is
        wrong with the cell (naming it) when it cannot be analysed."""
        try:
            rgb, bg, labels = decode_cell(cell_id, image, background, mask)
            analysis = self._analyse(rgb, bg, labels, source=f"cell {cell_id!r}")
        except InvalidInput as exc:
            return str(exc)
        return pb.CellFeatures(cell_id=cell_id, values=[float(v) for v in analysis.features],
                               background_estimated=bool(analysis.background_estimated),
                               mask_estimated=bool(analysis.mask_estimated))


_RemoteAnalyser = ray.remote(max_restarts=-1, max_task_retries=0)(CellAnalyser)


class Analysers:
    """A few `CellAnalyser` actors; `analyse(cells)` spreads a case over them.

    Parameters
    ----------
    count : int
        Actors to start (each holds the feature code loaded once).
    cpus : float
        Ray CPUs reserved per actor.
    """

    def __init__(self, count: int, cpus: float):
        self.actors = [_RemoteAnalyser.options(num_cpus=cpus).remote() for _ in range(count)]
        self.schema = ""

    def wait_ready(self, timeout_s: float) -> str:
        """Wait until every actor has loaded; returns the feature schema (raises on failure)."""
        schemas = set(ray.get([a.ready.remote() for a in self.actors], timeout=timeout_s))
        if len(schemas) != 1:
            raise RuntimeError(f"coordinator analysers disagree on the feature schema: {schemas}")
        self.schema = schemas.pop()
        return self.schema

    def analyse(self, cells: list[pb.CellImage], timeout_s: float) -> list[pb.CellFeatures | str]:
        """Each cell's CellFeatures, or the error text for a cell that cannot be analysed,
        in the order of `cells`. Raises ray's GetTimeoutError when `timeout_s` passes."""
        refs = [self.actors[i % len(self.actors)].analyse.remote(c.cell_id, c.image, c.background, c.mask)
                for i, c in enumerate(cells)]
        try:
            return ray.get(refs, timeout=timeout_s)
        except BaseException:
            for ref in refs:
                ray.cancel(ref)
            raise

    def stop(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
