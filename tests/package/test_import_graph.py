"""The package's own import graph has no circle.

Every module under ``custom/treeflare`` is parsed with ``ast`` (nothing is imported or run); every import
counts, at module level or inside a function, relative or absolute. An import of ``treeflare.a.b`` is an edge to
``treeflare/a/b.py`` and also to ``treeflare/a/__init__.py`` when the importer lives outside ``treeflare.a``
(importing a module first runs its package's ``__init__``); ``from .pkg import name`` is an edge to the submodule
``pkg.name`` when there is one, else to ``pkg`` itself. A circle is printed as the modules around it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "custom"
PACKAGE = "treeflare"


def package_modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is_package) for every module of the package."""
    modules = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    return modules


def _targets(dotted: str, importer: str, modules) -> set[str]:
    """``dotted`` and the packages above it that importing it runs and ``importer`` is not already inside."""
    out = set()
    parts = dotted.split(".")
    for k in range(1, len(parts) + 1):
        name = ".".join(parts[:k])
        if name in modules and not (importer == name or importer.startswith(name + ".")):
            out.add(name)
    return out


def import_edges(name: str, path: Path, is_package: bool, modules) -> set[str]:
    """Package modules that module ``name`` imports, anywhere in its body."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    edges = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                    edges |= _targets(alias.name, name, modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if not (source == PACKAGE or source.startswith(PACKAGE + ".")):
                continue
            edges |= _targets(source, name, modules)
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                if sub in modules:  # "from . import x" / "from .pkg import module": the submodule itself
                    edges |= _targets(sub, name, modules)
    edges.discard(name)
    return edges


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    modules = package_modules(root, package)
    return {name: import_edges(name, path, is_pkg, modules) for name, (path, is_pkg) in modules.items()}


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative): each is a set of modules
    that all reach one another through imports."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return components


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest circle per tangle."""
    return [_shortest_circle(graph, c) for c in tangles(graph)]


def _shortest_circle(graph, component: set[str]) -> list[str]:
    """The shortest path from the component's first module back to itself, inside the component."""
    first = min(component)
    previous, frontier = {first: None}, [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == first:
                    path = [node]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return path[::-1] + [first]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle through {first}")  # a strongly connected component always has one


def test_graph_sees_every_kind_of_import(tmp_path):
    """The parser finds imports inside functions, relative ones, ``from . import x`` and package ``__init__``
    runs, so that a circle hidden in any of them is found."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .leaf import thing\n")
    (pkg / "sub" / "leaf.py").write_text("def thing():\n    from ..top import value\n    return value\n")
    (pkg / "top.py").write_text("from .sub import leaf\nvalue = 1\n")
    (pkg / "other.py").write_text("import treeflare.sub.leaf\n")
    graph = import_graph(tmp_path)
    assert graph[f"{PACKAGE}.sub.leaf"] == {f"{PACKAGE}.top"}
    assert graph[f"{PACKAGE}.top"] == {f"{PACKAGE}.sub", f"{PACKAGE}.sub.leaf"}
    assert graph[f"{PACKAGE}.other"] == {f"{PACKAGE}.sub", f"{PACKAGE}.sub.leaf"}
    assert graph[f"{PACKAGE}.sub"] == {f"{PACKAGE}.sub.leaf"}
    found = cycles(graph)
    assert len(found) == 1 and found[0][0] == found[0][-1]
    assert set(found[0]) == {f"{PACKAGE}.sub", f"{PACKAGE}.top", f"{PACKAGE}.sub.leaf"}


def test_package_import_graph_is_acyclic():
    graph = import_graph()
    assert len(graph) > 50  # the package was found
    found = tangles(graph)
    assert not found, "import circles:\n" + "\n".join(
        f"{' -> '.join(_shortest_circle(graph, c))}  (modules that all reach one another: {sorted(c)}; "
        f"their imports among themselves: {sorted((a, b) for a in c for b in graph[a] & c)})" for c in found)
