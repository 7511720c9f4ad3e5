"""Expand an experiment into its runs, in a shuffled but reproducible order.

Shuffling matters: run in order, a slow drift of the machine (another job, a warming
cache) would show up as a difference between strategies. The order is a pure function of
the experiment's seed, so an interrupted experiment resumes with the same order and
skips the runs whose raw data already exist.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import asdict, dataclass

from qos.experiment.spec import Experiment


@dataclass(frozen=True)
class Run:
    """One run: one cell of the matrix, one repetition."""

    strategy: str
    competing: float  # level, in the experiment's competing unit
    link: str
    request_class: str
    repetition: int  # 0-based

    @property
    def run_id(self) -> str:
        """A file-name-safe id, unique within the experiment."""
        level = f"{self.competing:g}".replace(".", "p")
        return f"{self.strategy}__c{level}__{self.link}__{self.request_class}__r{self.repetition:02d}"

    @property
    def cell(self) -> tuple[str, float, str, str]:
        """The matrix cell this run repeats: (strategy, competing, link, request_class)."""
        return (self.strategy, self.competing, self.link, self.request_class)

    def seed(self, experiment_seed: int) -> int:
        """The run's own seed (for workload content and traffic randomness), stable across resumes."""
        return random.Random(f"{experiment_seed}/{self.run_id}").randrange(2**31)

    def to_dict(self) -> dict:
        return asdict(self) | {"run_id": self.run_id}


def expand(experiment: Experiment) -> list[Run]:
    """Every run of the experiment, shuffled with the experiment's seed.

    With `order = "blocked"` the runs are grouped by competing level (levels in shuffled
    order, runs shuffled within each level), so the competing traffic stays running across
    a block instead of being restarted for every run; strategies are still compared within
    a shuffled block, which is what the randomisation is for. With `order = "rounds"`
    every repetition is a round of level blocks in a fresh random order (`_rounds`).
    """
    runs = [
        Run(strategy.name, level, link.name, cls, rep)
        for strategy, level, link, cls, rep in itertools.product(
            experiment.strategies,
            experiment.competing.levels,
            experiment.links,
            experiment.request_classes,
            range(experiment.repetitions),
        )
    ]
    rng = random.Random(experiment.seed)
    if experiment.order == "rounds":
        return _rounds(runs, list(experiment.competing.levels), rng)
    rng.shuffle(runs)
    if experiment.order == "blocked":
        levels = list(experiment.competing.levels)
        rng.shuffle(levels)
        rank = {level: i for i, level in enumerate(levels)}
        runs.sort(key=lambda run: rank[run.competing])  # stable: keeps the shuffle within a block
    return runs


def _rounds(runs: list[Run], levels: list[float], rng: random.Random) -> list[Run]:
    """Repetition r's runs form round r; each round visits every level once, in its own shuffled
    order, with that level's runs (strategies, links, classes) shuffled. So each level meets the
    machine at every time of the experiment (not one block of the day), and the competing
    traffic still stays warm within a level's block."""
    out: list[Run] = []
    for rep in sorted({run.repetition for run in runs}):
        order = list(levels)
        rng.shuffle(order)
        for level in order:
            block = [run for run in runs if run.repetition == rep and run.competing == level]
            rng.shuffle(block)
            out += block
    return out


def remaining(runs: list[Run], done: set[str]) -> list[Run]:
    """The runs, in order, whose ids are not in `done` (what a resumed experiment still has to do)."""
    return [run for run in runs if run.run_id not in done]
