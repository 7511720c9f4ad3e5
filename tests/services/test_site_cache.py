"""A cached site database is used only when this PathMaster would build it alike: same
feature schema and same site-building code (what a site learnt is not in its vectors)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pathmaster
from services import synthetic
from services.synthetic import READY, build_synthetic_site, builder_identity, is_current


def test_a_site_built_by_other_code_is_rebuilt(tmp_path):
    site = build_synthetic_site(tmp_path / "site", cells=14, seed=3)
    stamp = (site / READY).read_text()
    assert is_current(site) and f"builder={builder_identity()}" in stamp.split()
    assert {"cells=14", "seed=3"} <= set(stamp.split())

    (site / READY).write_text(stamp.replace(f"builder={builder_identity()}", "builder=0123456789abcdef"))
    (site / "left-by-the-old-build").touch()
    assert not is_current(site)
    build_synthetic_site(site, cells=14, seed=3)
    assert is_current(site) and not (site / "left-by-the-old-build").exists()

    (site / READY).write_text("cells=14 seed=3\n")  # a stamp from before builders were named
    assert not is_current(site)


def test_the_builder_changes_with_code_not_with_docstrings(tmp_path, monkeypatch):
    package = Path(pathmaster.__file__).resolve().parent
    copy = Path(shutil.copytree(package, tmp_path / "pathmaster", ignore=shutil.ignore_patterns("__pycache__")))

    def identity() -> str:
        builder_identity.cache_clear()
        return builder_identity()

    monkeypatch.setattr(pathmaster, "__file__", str(copy / "__init__.py"))
    try:
        before = identity()
        learn = copy / "learning" / "thresholds.py"
        source = learn.read_text()
        learn.write_text(source.replace('"""', '"""Reworded. ', 1) + "\n# a comment\n")
        assert identity() == before
        learn.write_text(source + "\nTARGET_SENSITIVITY = 0.9\n")
        assert identity() != before
    finally:
        monkeypatch.undo()
        synthetic.builder_identity.cache_clear()
