"""The package, the job wrappers and the scripts use NVFlare's public API only (issue 34). Any NVFlare release may
change what it keeps private (``recipe._job``, ``_deploy_map``, ``_add_client_components``, a communicator's
``_task_check_period`` and the admin API's ``_print_hci_message`` were all used once).

Three rules, each checked on the source (``ast``) and, for classes, on their real NVFlare bases:

1. no ``obj._name`` on another object (not ``self``/``cls``) unless this repository defines ``_name`` itself: a
   function, a class, or an attribute its own classes set on ``self`` that no NVFlare base class of theirs has;
2. a class derived from an NVFlare class neither overrides nor reads nor sets a private name of its NVFlare bases;
3. no import of a private NVFlare module or name.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = [REPO / "custom" / "treeflare", REPO / "jobs", REPO / "scripts", REPO / "app"]
# private-looking names that are documented public API
DOCUMENTED = {"_exit"}  # os._exit: leave a forked child without running the parent's cleanup
# scripts/xgb_profile/sitecustomize.py: a measurement probe for `scripts/bench_xgb.py --profile`, put on PYTHONPATH of
# a benchmark run only, never by a job: it times NVFlare's XGBoost relay from the inside, which has no public hook;
# a changed NVFlare breaks the probe (it says so), never a job
PROBES = {REPO / "scripts" / "xgb_profile" / "sitecustomize.py"}


def python_files():
    for root in SOURCES:
        yield from sorted(p for p in root.rglob("*.py") if p not in PROBES)


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def nvflare_privates(cls) -> set[str]:
    """The private names the NVFlare classes in ``cls``'s MRO define: methods, class attributes, and attributes
    their code sets on ``self``."""
    names = set()
    for base in inspect.getmro(cls):
        if not base.__module__.startswith("nvflare"):
            continue
        names |= {n for n in vars(base) if private(n)}
        try:
            tree = ast.parse(inspect.getsource(base).strip())
        except (OSError, TypeError, SyntaxError):
            continue
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                  and getattr(n.value, "id", "") == "self" and private(n.attr)}
    return names


def module_name(path: Path) -> str | None:
    rel = path.relative_to(REPO / "custom") if path.is_relative_to(REPO / "custom") else None
    return ".".join(rel.with_suffix("").parts).removesuffix(".__init__") if rel else None


def nvflare_classes(path: Path, tree) -> dict[str, set[str]]:
    """Class name -> the private names of its NVFlare bases, for this module's classes derived from NVFlare's."""
    name = module_name(path)
    if name is None:
        return {}
    module = importlib.import_module(name)
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            cls = getattr(module, node.name, None)
            if inspect.isclass(cls) and any(b.__module__.startswith("nvflare") for b in inspect.getmro(cls)[1:]):
                out[node.name] = nvflare_privates(cls)
    return out


def private_uses(path: Path, tree, ours: set[str], nv_classes: dict[str, set[str]]) -> list[str]:
    where = path.relative_to(REPO)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name in nv_classes:
            theirs = nv_classes[node.name]
            for inner in ast.walk(node):
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)) and inner.name in theirs:
                    found.append(f"{where}:{inner.lineno}: {node.name} overrides NVFlare's {inner.name}")
                elif (isinstance(inner, ast.Attribute) and getattr(inner.value, "id", "") in ("self", "cls")
                      and inner.attr in theirs):
                    found.append(f"{where}:{inner.lineno}: {node.name} uses NVFlare's self.{inner.attr}")
        elif (isinstance(node, ast.Attribute) and private(node.attr) and node.attr not in ours
              and getattr(node.value, "id", "") not in ("self", "cls")):
            found.append(f"{where}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nvflare"):
            parts = (node.module or "").split(".")
            bad = [p for p in parts if private(p)] + [a.name for a in node.names if private(a.name)]
            found += [f"{where}:{node.lineno}: {node.module} {b}" for b in bad]
        elif isinstance(node, ast.Import):
            found += [f"{where}:{node.lineno}: {a.name}" for a in node.names
                      if a.name.startswith("nvflare") and any(private(p) for p in a.name.split("."))]
    return found


def defined_here(trees: dict, nv_classes: dict) -> set[str]:
    """The private names this repository defines: functions, classes, and attributes its classes set on ``self``
    that are not an NVFlare base class's."""
    names = set(DOCUMENTED)
    for path, tree in trees.items():
        theirs = set().union(*nv_classes.get(path, {}).values()) if nv_classes.get(path) else set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and private(node.name):
                names.add(node.name)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and getattr(node.value, "id", "") in ("self", "cls") and private(node.attr)
                  and node.attr not in theirs):
                names.add(node.attr)
    return names


def test_no_private_nvflare_name_is_used():
    trees = {p: ast.parse(p.read_text(), filename=str(p)) for p in python_files()}
    nv_classes = {p: nvflare_classes(p, t) for p, t in trees.items()}
    assert sum(len(c) for c in nv_classes.values()) >= 15  # the controllers, executors, widgets, recipes seen
    ours = defined_here(trees, nv_classes)
    uses = [u for p, t in trees.items() for u in private_uses(p, t, ours, nv_classes[p])]
    assert not uses, "private names this repository does not define:\n" + "\n".join(uses)


def test_the_check_finds_each_kind_of_private_use(tmp_path):
    """The scan itself: a private NVFlare module, a recipe's private job, a private attribute set on NVFlare's object
    (it does not make the name ours), and a subclass setting or overriding its NVFlare base's private."""
    from nvflare.apis.impl.controller import Controller

    source = ("from nvflare.recipe._helpers import x\n"
              "class Mine:\n    def __init__(self):\n        self._mine = 1\n"
              "def f(recipe, m, comm, ctl):\n"
              "    comm._task_check_period = ctl._task_check_period\n"
              "    return recipe._job, m._mine\n"
              "class Flow(Controller):\n    def __init__(self):\n        self._task_check_period = 0.1\n"
              "        self._own = 1\n")
    path = REPO / "scripts" / "example.py"  # a name under the repository, for relative_to
    tree = ast.parse(source)
    nv = {"Flow": nvflare_privates(Controller)}
    uses = [u.split(": ", 1)[1] for u in private_uses(path, tree, defined_here({path: tree}, {path: nv}), nv)]
    assert sorted(uses) == sorted(["nvflare.recipe._helpers _helpers", "._task_check_period", "._task_check_period",
                                   "._job", "Flow uses NVFlare's self._task_check_period"]), uses
