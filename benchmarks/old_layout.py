"""The core's names in a tree from before its rooms (sub-packages by concept), for benchmarks
that run an older revision beside this one.

A benchmark's worker imports by today's names (``pathmaster.analysis.cell``,
``pathmaster.site.search``, ...). In a tree whose core is still flat, ``install()`` makes those
names resolve to the modules that held them then: each new module is a view that looks a
name up in its old modules in turn (under its old private name too, ``_nearest`` for
``nearest``). It does nothing in a tree that has the rooms. Hand-written because it is a
fact of this project's history, not a library's: which module held what before the move.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path

# Each new module: the old modules that held its names, in the order they are looked in.
OLD_HOMES = {
    "pathmaster.analysis.budget": ("pathmaster.budget",),
    "pathmaster.analysis.cell": ("pathmaster.site", "pathmaster.embedding"),
    "pathmaster.analysis.uploads": ("pathmaster.uploads",),
    "pathmaster.evaluation.crossval": ("pathmaster.evaluate",),
    "pathmaster.evaluation.metrics": ("pathmaster.evaluate",),
    "pathmaster.evaluation.report": ("pathmaster.evaluate",),
    "pathmaster.eye._vectors": ("pathmaster.embedding",),
    "pathmaster.files": ("pathmaster.sitedb",),
    "pathmaster.image.io": ("pathmaster.imageio",),
    "pathmaster.image.morphology": ("pathmaster.morphology",),
    "pathmaster.image.optics": ("pathmaster.features.density",),
    "pathmaster.image.segmentation": ("pathmaster.segmentation",),
    "pathmaster.image.synth": ("pathmaster.synth",),
    "pathmaster.learning.abnormality": ("pathmaster.abnormality",),
    "pathmaster.learning.choice": ("pathmaster.learn",),
    "pathmaster.learning.folds": ("pathmaster.learn", "pathmaster.evaluate"),
    "pathmaster.learning.lens": ("pathmaster.embedding",),
    "pathmaster.learning.neighbours": ("pathmaster.embedding", "pathmaster.learn"),
    "pathmaster.learning.policy": ("pathmaster.embedding",),
    "pathmaster.learning.similarity": ("pathmaster.similarity",),
    "pathmaster.learning.thresholds": ("pathmaster.learn",),
    "pathmaster.site.database": ("pathmaster.sitedb",),
    "pathmaster.site.faiss_index": ("pathmaster.similarity",),
    "pathmaster.site.fitting": ("pathmaster.learnt",),
    "pathmaster.site.growth": ("pathmaster.growth",),
    "pathmaster.site.index": ("pathmaster.index",),
    "pathmaster.site.ingest": ("pathmaster.ingest",),
    "pathmaster.site.search": ("pathmaster.site",),
}
ROOMS = ("pathmaster.analysis", "pathmaster.evaluation", "pathmaster.image", "pathmaster.learning")


class _View(types.ModuleType):
    """A new module's names, read from its old modules."""

    def __init__(self, name: str, homes: tuple[str, ...]):
        super().__init__(name)
        self.__path__ = []  # a package too: pathmaster.site was a module and holds modules now
        self._homes = homes

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        for home in self._homes:
            try:
                module = importlib.import_module(home)
            except ImportError:
                continue
            for candidate in (name, f"_{name}"):
                if hasattr(module, candidate):
                    return getattr(module, candidate)
        raise AttributeError(f"none of {self._homes} has {name!r}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname in OLD_HOMES or fullname in ROOMS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _View(spec.name, OLD_HOMES.get(spec.name, ()))

    def exec_module(self, module):
        pass


def install() -> bool:
    """Resolve today's names in a flat core (True), or do nothing where the rooms exist (False)."""
    import pathmaster

    # the package's own directory: an editable install's finder would find another tree's rooms
    if (Path(pathmaster.__file__).parent / "learning").is_dir():
        return False
    old_site = importlib.import_module("pathmaster.site")
    if not hasattr(old_site, "__path__"):
        old_site.__path__ = []  # let pathmaster.site.<room module> be looked up
        search = _View("pathmaster.site.search", OLD_HOMES["pathmaster.site.search"])
        sys.modules["pathmaster.site.search"] = search
    sys.meta_path.insert(0, _Finder())
    return True
