"""The packages form layers you can draw (docs/ARCHITECTURE.md):

    pathmaster   the core: images, segmentation, features, search, site database
        ^
    qos          the network: request classes, DSCP transport, testbed, emulator, traffic,
        ^        the experiment engine (spec, runner, store, statistics, report)
    services     the product: sites, coordinator, clients, gateway, demo, and PathMaster as
                 the experiment's workload (services/experiment)

A lower package never imports a higher one, at module level or inside a function; the
only upward reference allowed is the `pathmaster` command's plug-in list (module names as
strings in pathmaster/cli.py). Inside the core, its rooms (sub-packages by concept) stand
the same way on the ones below them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("pathmaster", "qos", "services")  # bottom to top
# The core's rooms, bottom to top: a module of the core imports its own room and rooms below.
CORE_ROOMS = (
    ("records", "defaults", "files", "ids", "vocabulary", "conclusion", "environment", "_single_thread",
     "_forkserver_main"),
    ("image",),
    ("features",),
    ("eye",),
    ("importers",),
    ("analysis",),
    ("learning",),
    ("site",),
    ("evaluation",),
    ("commands", "cli", "__main__"),
)


def imported_packages(path: Path) -> set[tuple[str, int]]:
    """Top-level project packages imported anywhere in one file, with the line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in LAYERS:
                found.add((top, node.lineno))
    return found


@pytest.mark.parametrize("package", LAYERS)
def test_no_package_imports_a_higher_layer(package):
    rank = LAYERS.index(package)
    upward = []
    for path in sorted((REPO / package).rglob("*.py")):
        for top, line in imported_packages(path):
            if LAYERS.index(top) > rank:
                upward.append(f"{path.relative_to(REPO)}:{line} imports {top}")
    assert not upward, "lower layer imports a higher one:\n" + "\n".join(upward)


def test_the_check_sees_a_function_level_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from services.client import Client\n    import qos.classes\n")
    assert imported_packages(source) == {("services", 2), ("qos", 3)}


def test_the_cores_defaults_are_the_cores_own():
    """Each constant in pathmaster/defaults.py is read by the core itself; an upper layer's
    constant lives beside the rule that uses it, in that layer."""
    defaults = REPO / "pathmaster" / "defaults.py"
    names = {node.targets[0].id for node in ast.parse(defaults.read_text()).body if isinstance(node, ast.Assign)}
    used = set()
    for path in (REPO / "pathmaster").rglob("*.py"):
        if path == defaults:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "defaults":
                used.add(node.attr)
            elif isinstance(node, ast.ImportFrom) and node.module == "pathmaster.defaults":
                used.update(alias.name for alias in node.names)
    assert names and not names - used, f"not used by the core: {sorted(names - used)}"


def room_of(module: str) -> int:
    """The rank in CORE_ROOMS of a core module's dotted name (``pathmaster.site.index`` -> site's)."""
    part = module.split(".")[1]
    return next(rank for rank, names in enumerate(CORE_ROOMS) if part in names)


def core_imports(path: Path, root: Path = REPO) -> set[tuple[str, int]]:
    """The core modules one file imports anywhere in it (``from pathmaster import x`` names
    x; relative imports resolved), with the line."""
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            by_name = base == "pathmaster" or node.module is None  # the names are modules
            names = [f"{base}.{alias.name}" for alias in node.names] if by_name else [base]
        else:
            continue
        found.update((name, node.lineno) for name in names if name.startswith("pathmaster."))
    return found


def test_every_core_module_has_a_room():
    modules = {path.relative_to(REPO / "pathmaster").parts[0].removesuffix(".py")
               for path in (REPO / "pathmaster").rglob("*.py")} - {"__init__"}
    placed = {name for names in CORE_ROOMS for name in names}
    assert modules <= placed, f"not in CORE_ROOMS: {sorted(modules - placed)}"


def test_no_room_of_the_core_imports_a_higher_one():
    upward = []
    for path in sorted((REPO / "pathmaster").rglob("*.py")):
        if path.parent == REPO / "pathmaster" and path.name == "__init__.py":
            continue
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        for name, line in core_imports(path):
            if room_of(name) > room_of(module):
                upward.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not upward, "a room of the core imports a higher one:\n" + "\n".join(upward)


def test_the_room_check_sees_relative_and_function_level_imports(tmp_path):
    package = tmp_path / "pathmaster" / "image"
    package.mkdir(parents=True)
    source = package / "m.py"
    source.write_text("from . import io\nfrom pathmaster import site\ndef f():\n    from ..learning.choice import x\n")
    assert core_imports(source, tmp_path) == {("pathmaster.image.io", 1), ("pathmaster.site", 2),
                                    ("pathmaster.learning.choice", 4)}
    assert [room_of(name) > room_of("pathmaster.image.m") for name, _ in sorted(core_imports(source, tmp_path))] == [
        False, True, True]
