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

from tests.import_graph import import_graph

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


def test_every_core_module_has_a_room():
    modules = {path.relative_to(REPO / "pathmaster").parts[0].removesuffix(".py")
               for path in (REPO / "pathmaster").rglob("*.py")} - {"__init__"}
    placed = {name for names in CORE_ROOMS for name in names}
    assert modules <= placed, f"not in CORE_ROOMS: {sorted(modules - placed)}"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'module imports target' for each import of a core module from a higher room."""
    return sorted(f"{module} imports {target}" for module, targets in graph.items() if module != "pathmaster"
                  for target in targets if room_of(target) > room_of(module))


def test_no_room_of_the_core_imports_a_higher_one():
    upward = upward_imports(import_graph(REPO / "pathmaster"))
    assert not upward, "a room of the core imports a higher one:\n" + "\n".join(upward)


def test_the_room_check_sees_relative_and_function_level_imports(tmp_path):
    package = tmp_path / "pathmaster" / "image"
    for folder in (tmp_path / "pathmaster", package, tmp_path / "pathmaster" / "learning"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text("")
    for name in ("io.py", "../site.py", "../learning/choice.py"):
        (package / name).write_text("")
    (package / "m.py").write_text("from . import io\nfrom pathmaster import site\ndef f():\n"
                                  "    from ..learning.choice import x\n")
    assert upward_imports(import_graph(tmp_path / "pathmaster")) == [
        "pathmaster.image.m imports pathmaster.learning.choice", "pathmaster.image.m imports pathmaster.site"]
