"""No module of a package imports, however indirectly, a module that imports it back.

Imports inside functions count: they hide a circle from Python's start-up, not from a
reader. The graph is read from the source (``ast``), module by module; a package's
``__init__`` re-exporting its private files is its own business and not an edge to itself.
Every package is checked.

In services, the servers are rooms of their own: a site, the coordinator and the gateway
never import one another (what two of them need is in a module of services/ itself, such as
services/shared.py), and no module imports a command module (the `pathmaster` plug-in list
names them as strings).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_graph import import_graph

REPO = Path(__file__).resolve().parents[1]
CHECKED = ("pathmaster", "qos", "services")
SERVERS = ("services.site", "services.coordinator", "services.gateway")


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found


@pytest.mark.parametrize("package", CHECKED)
def test_no_import_circle_inside_the_package(package):
    assert circles(import_graph(REPO / package)) == []


def test_no_server_imports_another():
    graph = import_graph(REPO / "services")
    room = {name: next((s for s in SERVERS if name == s or name.startswith(s + ".")), None) for name in graph}
    crossing = sorted(f"{a} imports {b}" for a, targets in graph.items() for b in targets
                      if room[a] and room[b] and room[a] != room[b])
    assert crossing == []


def test_nothing_imports_a_command_module():
    from pathmaster.cli import COMMAND_MODULES

    commands = {name for name in COMMAND_MODULES if name.startswith("services.")}
    graph = import_graph(REPO / "services")
    assert commands <= set(graph)
    assert sorted(f"{a} imports {b}" for a, targets in graph.items() for b in targets & commands) == []


def test_the_check_finds_a_circle_hidden_in_a_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.c import g\n")
    (package / "c.py").write_text("from . import a\n")
    (package / "d.py").write_text("import pkg.a\n")
    assert circles(import_graph(package)) == [["pkg.a", "pkg.b", "pkg.c"]]
