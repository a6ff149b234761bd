"""The package, the job wrappers and the scripts use NVFlare's public API only (issue 34): no attribute or name
starting with ``_`` that this repository does not define itself, and no private NVFlare module. Any NVFlare release
may change what it keeps private (``recipe._job``, ``_deploy_map``, ``_add_client_components`` were all used
once)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# private-looking names that are documented public API
DOCUMENTED = {"_exit"}  # os._exit: leave a forked child without running the parent's cleanup
SOURCES = [REPO / "custom" / "treeflare", REPO / "jobs", REPO / "scripts", REPO / "app"]


def python_files():
    for root in SOURCES:
        yield from sorted(root.rglob("*.py"))


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def defined_here(trees) -> set[str]:
    """Every private name this repository defines: functions, classes, attributes it assigns, arguments, names."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.alias) and node.asname:
                names.add(node.asname)
    return {n for n in names if private(n)} | DOCUMENTED


def private_uses(path: Path, tree, ours: set[str]) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr) and node.attr not in ours:
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nvflare"):
            parts = (node.module or "").split(".")
            bad = [p for p in parts if private(p)] + [a.name for a in node.names if private(a.name)]
            found += [f"{path.relative_to(REPO)}:{node.lineno}: {node.module} {b}" for b in bad]
        elif isinstance(node, ast.Import):
            found += [f"{path.relative_to(REPO)}:{node.lineno}: {a.name}" for a in node.names
                      if a.name.startswith("nvflare") and any(private(p) for p in a.name.split("."))]
    return found


def test_no_private_nvflare_name_is_used():
    files = list(python_files())
    trees = {p: ast.parse(p.read_text(), filename=str(p)) for p in files}
    ours = defined_here(trees.values())
    uses = [u for p, t in trees.items() for u in private_uses(p, t, ours)]
    assert not uses, "private names this repository does not define:\n" + "\n".join(uses)


def test_the_check_finds_a_private_nvflare_attribute(tmp_path):
    """The scan itself: a recipe's private job and a private NVFlare module are found, our own privates are not."""
    source = ("from nvflare.recipe._helpers import x\n"
              "class Mine:\n    def __init__(self):\n        self._mine = 1\n"
              "def f(recipe, m):\n    return recipe._job, m._mine\n")
    path = REPO / "scripts" / "example.py"  # a name under the repository, for relative_to
    tree = ast.parse(source)
    uses = private_uses(path, tree, defined_here([tree]))
    assert [u.split(": ", 1)[1] for u in uses] == ["nvflare.recipe._helpers _helpers", ".\u005fjob"]
