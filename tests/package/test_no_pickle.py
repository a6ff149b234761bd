"""No pickle, eval, exec, marshal or shelve anywhere in the package: only FOBS-safe plain types cross the wire, and
nothing received is ever turned back into code or arbitrary objects."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "custom" / "treeflare"
FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}
TEXT_PATTERNS = [re.compile(p) for p in (r"allow_pickle\s*=\s*True", r"\bpickle\.", r"\bmarshal\.", r"\bshelve\.",
                                         r"pd\.read_pickle", r"\.to_pickle\(", r"yaml\.load\(", r"yaml\.unsafe_load")]


def _sources():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 20, f"package not found at {PACKAGE}"
    return files


def _violations(path: Path) -> list[str]:
    text = path.read_text()
    out = []
    for node in ast.walk(ast.parse(text, filename=str(path))):
        if isinstance(node, ast.Import):
            out += [f"import {a.name}" for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in FORBIDDEN_MODULES:
            out.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in FORBIDDEN_CALLS and not (isinstance(f, ast.Attribute) and name == "compile"):
                out.append(f"{name}(...) call at line {node.lineno}")
            if name == "load" and isinstance(f, ast.Attribute) and getattr(f.value, "id", "") == "np":
                kw = {k.arg: k.value for k in node.keywords}
                if "allow_pickle" in kw and getattr(kw["allow_pickle"], "value", None) is not False:
                    out.append(f"np.load(allow_pickle=...) at line {node.lineno}")
    for pat in TEXT_PATTERNS:
        out += [f"{pat.pattern!r} at line {text[:m.start()].count(chr(10)) + 1}" for m in pat.finditer(text)]
    return out


# `treeflare export --format sklearn` writes a joblib file, scikit-learn's own persistence, for the user's own use:
# it reads back only the bytes it has just written (to check them), never a file, and nothing crosses the wire
WRITES_ONLY = {"tools/export.py": ["import joblib"]}


def test_no_pickle_eval_exec_in_package():
    found = {str(p.relative_to(PACKAGE)): v for p in _sources() if (v := _violations(p))}
    for name, allowed in WRITES_ONLY.items():
        loads = [ast.unparse(node.args[0]) for node in ast.walk(ast.parse((PACKAGE / name).read_text()))
                 if isinstance(node, ast.Call) and ast.unparse(node.func) == "joblib.load"]
        assert loads == ["io.BytesIO(data)"], loads  # the buffer joblib.dump just filled, nothing else
        if found.get(name) == allowed:
            del found[name]
    assert not found, f"forbidden constructs: {found}"


def test_dask_only_in_its_pool_module():
    """Dask's protocol pickles task functions and results, inside a party's own cluster only (SECURITY.md): one
    module, crypto/dask_pool.py, may import it, and what it submits is its own top-level functions."""
    users = set()
    for p in _sources():
        text = p.read_text()
        if "dask" not in text and "distributed" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            if any(n.split(".")[0] in ("dask", "distributed") for n in names):
                users.add(str(p.relative_to(PACKAGE)))
    assert users == {"crypto/dask_pool.py"}
    tree = ast.parse((PACKAGE / "crypto" / "dask_pool.py").read_text())
    top = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    submitted = [c.args[0] for c in ast.walk(tree) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                 and c.func.attr in ("submit", "run") and getattr(c.func.value, "id", "") == "client"
                 or isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "submit"]
    assert submitted and all(isinstance(a, ast.Name) and a.id in top for a in submitted)


def test_the_scanner_catches_them(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import pickle\nfrom marshal import loads\nimport shelve\nx = eval('1')\nexec('y=2')\n"
                   "import numpy as np\nnp.load('f', allow_pickle=True)\n")
    v = _violations(bad)
    assert any("pickle" in s for s in v) and any("marshal" in s for s in v) and any("shelve" in s for s in v)
    assert any(s.startswith("eval") for s in v) and any(s.startswith("exec") for s in v)
    assert any("allow_pickle" in s for s in v)
    ok = tmp_path / "ok.py"
    ok.write_text("import re\npat = re.compile('x')\nimport numpy as np\nnp.load('f', allow_pickle=False)\n")
    assert _violations(ok) == []
