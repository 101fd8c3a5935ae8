"""The package's modules import each other without a circle (issue 12).

Every import counts, at module level or inside a function: a lazy import hides a circle from
Python but not from a reader. ``from a.b import c`` is an edge to the module ``a.b.c`` when there is
one, else to ``a.b``; a package's ``__init__`` is its own node, so a package face that opens its
backends lazily (``exactly.log`` -> ``exactly.log.sqlite`` -> ``exactly.log.base``) is no circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import exactly

ROOT = Path(exactly.__file__).parent


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ["exactly", *path.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Each module of ``exactly`` and the modules of ``exactly`` it imports."""
    known = modules()

    def owner(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        edges: set[str] = set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(t for a in node.names if (t := owner(a.name)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}" if base else anchor
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    target = full if full in known else owner(base)
                    if target:
                        edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_graph_is_read() -> None:
    graph = import_graph()
    assert "exactly.log.base" in graph["exactly.log.sqlite"]
    assert "exactly.log.sqlite" in graph["exactly.log"]  # the lazy import in open_log counts


def test_circles_are_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back() -> None:
    assert circles(import_graph()) == []


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module that importing ``start`` runs: what it imports, at module level or inside a
    function, and the packages (``__init__``) Python runs on the way to each of them."""
    found: set[str] = set()
    todo = [start]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        parts = name.split(".")
        packages = {".".join(parts[:n]) for n in range(1, len(parts))}
        todo.extend((graph[name] | packages) & graph.keys())
    return found


def test_the_plan_builders_sit_above_the_settings() -> None:
    """``exactly.config`` assembles the sections each stage package owns (its ``settings.py``),
    so importing it runs those packages' ``__init__``: none of that may reach back up to the
    registry of stages or a module that builds or drives a stage's plan, which import
    ``exactly.config`` (issue 41)."""
    graph = import_graph()
    below = reached(graph, "exactly.config")
    builders = {
        "exactly.dedupe.driver",
        "exactly.dedupe.job",
        "exactly.aggregate.driver",
        "exactly.aggregate.job",
        "exactly.delivery.route",
        "exactly.lake.query",
    }
    assert builders <= reached(graph, "exactly.stages")  # the registry's lazy imports count
    assert not below & (builders | {"exactly.stages"}), sorted(below & builders)
    above = {name for name, edges in graph.items() if "exactly.config" in edges}
    assert not below & above, sorted(below & above)  # nothing config runs imports config


def test_reached_follows_packages() -> None:
    graph = {"a.b.c": {"a.d"}, "a.b": set(), "a": set(), "a.d": set(), "e": {"a.b.c"}}
    assert reached(graph, "e") == {"e", "a.b.c", "a.b", "a", "a.d"}
