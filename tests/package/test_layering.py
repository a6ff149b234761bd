"""The layers docs/CONTRIBUTING.md names, held: pure cores never reach NVFlare or the FLARE glue (not even through
a function-level import), only ``treeflare.flare`` imports NVFlare, and nothing below the command line imports the
command line (``treeflare.command`` -> ``treeflare.jobs``/``treeflare.tools`` -> ``treeflare.flare`` -> cores)."""

from __future__ import annotations

import ast

from test_import_graph import PACKAGE, ROOT, import_graph, package_modules

GLUE = ("treeflare.flare",)
COMMAND_LINE = ("treeflare.command", "treeflare.jobs", "treeflare.tools")
# what may sit above the cores: the glue and the command line; everything else is a core
CORES_EXCEPT = GLUE + COMMAND_LINE + ("treeflare.cli",)


def under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def reachable(graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def imports_nvflare(path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "nvflare" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "nvflare":
            return True
    return False


def test_cores_never_reach_the_glue_or_the_command_line():
    graph = import_graph()
    cores = [m for m in graph if m != PACKAGE and not under(m, CORES_EXCEPT)]
    assert len(cores) > 40
    bad = {m: sorted(r for r in reachable(graph, m) if under(r, CORES_EXCEPT)) for m in cores}
    assert not {m: r for m, r in bad.items() if r}


def test_only_the_glue_imports_nvflare():
    modules = package_modules()
    direct = sorted(m for m, (path, _) in modules.items() if imports_nvflare(path))
    assert direct and all(under(m, GLUE) for m in direct), [m for m in direct if not under(m, GLUE)]


def test_the_glue_never_imports_the_command_line():
    graph = import_graph()
    bad = {m: sorted(r for r in graph[m] if under(r, COMMAND_LINE)) for m in graph if under(m, GLUE)}
    assert not {m: r for m, r in bad.items() if r}


def test_the_checks_see_a_core_that_reaches_the_glue(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "flare").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "flare" / "__init__.py").write_text("import nvflare\n")
    (pkg / "core.py").write_text("def f():\n    from .flare import x\n")
    graph = import_graph(tmp_path, PACKAGE)
    assert "treeflare.flare" in reachable(graph, "treeflare.core")
    assert imports_nvflare(pkg / "flare" / "__init__.py") and not imports_nvflare(pkg / "core.py")
    assert ROOT.is_dir()
