"""The packages form layers you can draw (docs/ARCHITECTURE.md):

    pathmaster   the core: images, segmentation, features, search, site database
        ^
    qos          the network: request classes, DSCP transport, testbed, emulator, traffic,
        ^        the experiment engine (spec, runner, store, statistics, report)
    services     the product: sites, coordinator, clients, gateway, demo, and PathMaster as
                 the experiment's workload (services/experiment)

A lower package never imports a higher one, at module level or inside a function; the
only upward reference allowed is the `pathmaster` command's plug-in list (module names as
strings in pathmaster/cli.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("pathmaster", "qos", "services")  # bottom to top


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
