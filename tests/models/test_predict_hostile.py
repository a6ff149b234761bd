"""scripts/predict.py on hostile model files: a valid global_tree.json and model.json mutated in
many ways (wrong types, NaN and infinity, huge integers, negative, cyclic and out-of-range indices, missing keys,
a BOM, binary UBJSON) are each refused with exit 2 and one ``error:`` line, never a traceback or a crash.

The XGBoost cases run in one worker subprocess (tests/predict_worker.py): XGBoost itself dies with SIGSEGV on some
of them when they reach it unchecked, and that must fail this test, not end pytest.
"""

from __future__ import annotations

import importlib

import copy
import json
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest


from test_predict import tree_model, write_rows, xgb_model
from treeflare.data import load_csv

xgb = pytest.importorskip("xgboost")

TESTS = Path(__file__).resolve().parents[1]
predict_script = importlib.import_module("treeflare.tools.predict")
HUGE = "9" * 5000  # beyond Python's int-string limit (4300 digits)
LONG = "9" * 400  # an integer, but beyond any float
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile_models")
    train = load_csv(write_rows(tmp / "train.csv"), label="label", id_column="id", ordinal={"size": ["S", "M", "L"]})
    write_rows(tmp / "new.csv", n=20, seed=1)
    booster = xgb_model(train, tmp / "model.json")
    booster.save_model(str(tmp / "model.ubj"))
    tree_model(train, "cart", tmp / "cart.json")
    tree_model(train, "id3", tmp / "id3.json")
    docs = {name: json.loads((tmp / f"{name}.json").read_text()) for name in ("model", "cart", "id3")}
    return tmp, docs


# ------------------------------------------------------------------------------------------------ mutations
def paths(value, path=(), skip=()):
    """Every key path into a document; lists by their first and last item (a tree's ``nodes``: the first two
    and the last; a model's ``trees``: the first, which has a categorical split)."""
    yield path
    if path in skip:
        return
    if isinstance(value, dict):
        for k, v in value.items():
            yield from paths(v, path + (k,), skip)
    elif isinstance(value, list) and value:
        if path and path[-1] == "trees":
            picked = {0}
        elif path and path[-1] == "nodes":
            picked = {0, 1, len(value) - 1}
        else:
            picked = {0, len(value) - 1}
        for i in sorted(picked):
            yield from paths(value[i], path + (i,), skip)


def wrong_type(value):
    """A value of another JSON type than ``value``'s."""
    if isinstance(value, str):
        return 1.5
    if isinstance(value, (bool, int, float)) or value is None:
        return "x"
    return {"a": 1} if isinstance(value, list) else ["x"]


def mutated(doc, path, how, value=None):
    out = copy.deepcopy(doc)
    parent = out
    for k in path[:-1]:
        parent = parent[k]
    if how == "del":
        del parent[path[-1]]
    elif how == "type":
        parent[path[-1]] = wrong_type(parent[path[-1]])
    else:
        parent[path[-1]] = value
    return out


def generic_cases(doc, *, skip=(), optional=()):
    """{name: document}: every path deleted, set to null and to a value of another type; a number also to NaN and
    infinity. ``optional``: paths whose deletion (or null) is legitimate, left out."""
    cases = {}
    for path in paths(doc, skip=skip):
        if not path:
            continue
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        value = parent[path[-1]]
        hows = ["type"] + ([] if path in optional else ["del" if isinstance(parent, dict) else "null", "null"])
        if isinstance(value, float):
            hows += ["nan", "inf"]
        for how in dict.fromkeys(hows):
            special = {"null": None, "nan": float("nan"), "inf": float("inf")}.get(how)
            if how == "del" and not isinstance(parent, dict):
                continue
            cases[f"{'.'.join(map(str, path))}:{how}"] = mutated(doc, path, how if how in ("del", "type") else "set",
                                                               special)
    return cases


def with_long(doc, path) -> str:
    """The document as JSON text with a 400-digit integer at ``path`` (valid JSON; no float holds it)."""
    marker = 0.1234567891234
    return json.dumps(set_in(doc, path, marker)).replace(repr(marker), LONG, 1)


def write_cases(folder: Path, cases: dict, name: str) -> dict[str, Path]:
    """Each case in its own folder as ``name`` (a text case is written as it is, a document as JSON)."""
    out = {}
    for i, (label, case) in enumerate(cases.items()):
        path = folder / f"{i:04d}" / name
        path.parent.mkdir(parents=True)
        if isinstance(case, bytes):
            path.write_bytes(case)
        else:
            path.write_text(case if isinstance(case, str) else json.dumps(case))
        out[label] = path
    return out


def assert_refused(label, code, stderr, path):
    lines = stderr.strip().splitlines()
    assert code == 2, f"{label}: exit {code!r}\n{stderr[-2000:]}"
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{label}: {stderr[-2000:]}"
    assert "Traceback" not in stderr and str(path) in lines[0], f"{label}: {lines[0]}"


# ------------------------------------------------------------------------------------------------ XGBoost
def xgb_tree(doc, i=0):
    return doc["learner"]["gradient_booster"]["model"]["trees"][i]


def set_in(doc, path, value):
    return mutated(doc, tuple(path), "set", value)


def xgb_curated(doc) -> dict:
    """The faults that crashed libxgboost (SIGSEGV, at load or at the first prediction) and their neighbours."""
    t = ("learner", "gradient_booster", "model", "trees", 0)
    param = ("learner", "learner_model_param")
    tree = xgb_tree(doc)
    assert tree["categories_nodes"], "tree 0 of the fixture model has a categorical split"
    inner = [k for k, c in enumerate(tree["left_children"]) if c != -1]
    cases = {
        "left_children[0]=0": set_in(doc, t + ("left_children", 0), 0),
        "left_children[0]=1e6": set_in(doc, t + ("left_children", 0), 10 ** 6),
        "split_indices[0]=1e6": set_in(doc, t + ("split_indices", 0), 10 ** 6),
        "split_indices[0]=-1": set_in(doc, t + ("split_indices", 0), -1),
        "right_children[0]=-5": set_in(doc, t + ("right_children", 0), -5),
        "cycle: a child is its own parent": set_in(doc, t + ("left_children", inner[1]), inner[1]),
        "cycle: a child points back to the root": set_in(doc, t + ("left_children", inner[1]), 0),
        "two parents": set_in(doc, t + ("right_children", 0), tree["left_children"][inner[1]]),
        "a leaf with one child": set_in(doc, t + ("right_children", tree["left_children"].index(-1)), 1),
        "parents wrong": set_in(doc, t + ("parents", 1), 2),
        "arrays of unequal length": set_in(doc, t + ("split_conditions",), tree["split_conditions"][:-1]),
        "num_nodes too large": set_in(doc, t + ("tree_param", "num_nodes"), "100"),
        "tree num_feature": set_in(doc, t + ("tree_param", "num_feature"), "9"),
        "deleted nodes": set_in(doc, t + ("tree_param", "num_deleted"), "1"),
        "size_leaf_vector": set_in(doc, t + ("tree_param", "size_leaf_vector"), "100"),
        "tree id": set_in(doc, t + ("id",), 99),
        "categories_segments past the end": set_in(doc, t + ("categories_segments",), [1000]),
        "categories_sizes past the end": set_in(doc, t + ("categories_sizes",), [1000]),
        "categories_nodes not a node": set_in(doc, t + ("categories_nodes",), [1000]),
        "categories negative": set_in(doc, t + ("categories",), [-1]),
        "categories 2^31-1": set_in(doc, t + ("categories",), [2 ** 31 - 1]),
        "num_class 100000": set_in(doc, param + ("num_class",), "100000"),
        "num_class not the objective's": set_in(doc, param + ("num_class",), "5"),
        "base_score 2 for 3 classes": set_in(doc, param + ("base_score",), "[1,2]"),
        "base_score nan": set_in(doc, param + ("base_score",), "[nan,0,0]"),
        "num_feature 1": set_in(doc, param + ("num_feature",), "1"),
        "num_feature beyond the schema": set_in(
            set_in(set_in(doc, param + ("num_feature",), "5"), ("learner", "feature_names"), []),
            ("learner", "feature_types"), []),
        "num_target 2": set_in(doc, param + ("num_target",), "2"),
        "num_trees": set_in(doc, ("learner", "gradient_booster", "model", "gbtree_model_param", "num_trees"), "99"),
        "tree_info group 7": set_in(doc, ("learner", "gradient_booster", "model", "tree_info", 0), 7),
        "iteration_indptr": set_in(doc, ("learner", "gradient_booster", "model", "iteration_indptr"), [0, 100]),
        "recorded category encoding": set_in(doc, ("learner", "gradient_booster", "model", "cats", "feature_segments"),
                                             [5]),
        "regression objective": set_in(doc, ("learner", "objective", "name"), "reg:squarederror"),
        "gblinear": set_in(doc, ("learner", "gradient_booster", "name"), "gblinear"),
        "not a model": {"hello": 1},
        "a list": [1, 2],
    }
    text = json.dumps(doc)
    cases["NaN in a split condition"] = text.replace('"split_conditions": [', '"split_conditions": [NaN, ', 1)
    cases["a 5000-digit integer"] = text.replace('"id": 0', f'"id": {HUGE}', 1)
    cases["a 400-digit split condition"] = with_long(doc, ("learner", "gradient_booster", "model", "trees", 0,
                                                          "split_conditions", 0))
    cases["nested 100000 deep"] = text.replace('"attributes": {', f'"deep": {DEEP}, "attributes": {{', 1)
    cases["not UTF-8"] = text.encode().replace(b'"x0"', b'"\xff0"', 1)
    cases["truncated"] = text[: len(text) // 2]
    return cases


def ubjson(value) -> bytes:
    """A plain UBJSON encoder (untyped containers) for hostile binary models."""
    if value is None or isinstance(value, bool):
        return {None: b"Z", True: b"T", False: b"F"}[value]
    if isinstance(value, int):
        return b"L" + struct.pack(">q", value)
    if isinstance(value, float):
        return b"D" + struct.pack(">d", value)
    if isinstance(value, str):
        raw = value.encode()
        return b"SL" + struct.pack(">q", len(raw)) + raw
    if isinstance(value, list):
        return b"[" + b"".join(map(ubjson, value)) + b"]"
    return b"{" + b"".join(b"L" + struct.pack(">q", len(k.encode())) + k.encode() + ubjson(v)
                           for k, v in value.items()) + b"}"


def run_worker(csv: Path, out: Path, models: list[Path]) -> dict[str, dict]:
    proc = subprocess.run([sys.executable, str(TESTS / "predict_worker.py"), str(csv), str(out),
                           *map(str, models)], capture_output=True, text=True, cwd=TESTS, timeout=600)
    results, started = {}, None
    for line in proc.stdout.splitlines():
        r = json.loads(line)
        if "start" in r:
            started = r["start"]
        else:
            results[r["model"]], started = r, None
    assert proc.returncode == 0 and started is None, (
        f"the worker died (exit {proc.returncode}) reading {started}:\n{proc.stderr[-3000:]}")
    return results


def test_hostile_xgboost_models_are_refused_without_a_crash(models, tmp_path):
    tmp, docs = models
    doc = docs["model"]
    model = ("learner", "gradient_booster", "model")
    # the optional parts of a model: plain XGBoost works without feature names and types, without the iteration
    # offsets (older files), the category-encoding record, num_target and boost_from_average, and the schema
    optional = {("learner", "feature_names"), ("learner", "feature_types"), model + ("iteration_indptr",),
                model + ("cats",), ("learner", "learner_model_param", "num_target"),
                ("learner", "learner_model_param", "boost_from_average"), ("learner", "attributes"),
                ("learner", "attributes", "treeflare")}
    generic = generic_cases(doc, optional=optional, skip={("learner", "attributes")})
    # the schema the job stores in the model (a JSON string in attribute 'treeflare'), swept the same way
    info = json.loads(doc["learner"]["attributes"]["treeflare"])
    for label, case in generic_cases(info, optional={("schema", "id_column")}).items():
        generic[f"attribute treeflare: {label}"] = set_in(doc, ("learner", "attributes", "treeflare"), json.dumps(case))
    generic["attribute treeflare: a 5000-digit integer"] = set_in(
        doc, ("learner", "attributes", "treeflare"), doc["learner"]["attributes"]["treeflare"].replace(
            '"version": 1', f'"version": {HUGE}', 1))
    refused = write_cases(tmp_path / "curated", xgb_curated(doc), "model.json")
    refused |= write_cases(tmp_path / "generic", generic, "model.json")
    refused |= write_cases(tmp_path / "ubj", {
        "UBJSON left_children[0]=0": ubjson(set_in(doc, model + ("trees", 0, "left_children", 0), 0)),
        "UBJSON split_indices[0]=1e6": ubjson(set_in(doc, model + ("trees", 0, "split_indices", 0), 10 ** 6)),
        "UBJSON nested 100000 deep": b"[" * 100_000 + b"]" * 100_000,
        "UBJSON length past the end": b"{L" + struct.pack(">q", 2 ** 40) + b"x",
    }, "model.ubj")
    real = (tmp / "model.ubj").read_bytes()
    refused |= write_cases(tmp_path / "cut", {f"UBJSON cut at {n}": real[:n] for n in (1, 9, 100, len(real) // 2,
                                                                                        len(real) - 1)}, "model.ubj")
    rng = random.Random(0)  # flipped bytes may leave a valid model: no crash is asked, not a refusal
    flipped = {}
    for k in range(6):  # most leave a valid model (a float's byte), which is slow to predict with: a few
        data = bytearray(real)
        data[rng.randrange(len(data))] = rng.randrange(256)
        flipped[f"UBJSON byte flip {k}"] = bytes(data)
    flipped = write_cases(tmp_path / "flip", flipped, "model.ubj")
    good = write_cases(tmp_path / "good", {"JSON": doc, "UBJSON": real, "JSON with a BOM": "\ufeff" + json.dumps(doc),
                                           "untyped UBJSON": ubjson(doc)}, "model.json")
    results = run_worker(tmp / "new.csv", tmp_path / "out.csv", [*refused.values(), *flipped.values(),
                                                                  *good.values()])
    for label, path in refused.items():
        r = results[str(path)]
        assert_refused(label, r["code"], r["stderr"], path)
    for label, path in flipped.items():
        r = results[str(path)]
        if r["code"] != 0:
            assert_refused(label, r["code"], r["stderr"], path)
    for label, path in good.items():
        assert results[str(path)]["code"] == 0, f"{label}: {results[str(path)]['stderr']}"
    assert len(refused) > 250  # the sweep reached every field
    reported = results[str(refused["left_children[0]=0"])]["stderr"]  # the case of the report, in words
    assert "trees[0].left_children[0]: 0 is not a child of node 0 (expected -1 for a leaf, or 1.." in reported


# ------------------------------------------------------------------------------------------------ global tree
def tree_curated(doc) -> dict:
    nodes = doc["tree"]["nodes"]
    inner = [i for i, n in enumerate(nodes) if n["kind"] != "leaf"]
    numeric = [i for i, n in enumerate(nodes) if n["kind"] == "numeric"]
    categorical = [i for i, n in enumerate(nodes) if n["kind"] == "categorical"]
    child = ("tree", "nodes", inner[1], "children", 0)
    out = {
        "negative child": set_in(doc, child, -1),
        "child is itself": set_in(doc, child, inner[1]),
        "child is the root (a cycle)": set_in(doc, child, 0),
        "child out of range": set_in(doc, child, 10 ** 6),
        "child a float": set_in(doc, child, 1.5),
        "child a string": set_in(doc, child, "1"),
        "infinite counts": set_in(doc, ("tree", "nodes", 0, "counts", 0), float("inf")),
        "negative counts": set_in(doc, ("tree", "nodes", 0, "counts", 0), -1.0),
        "feature out of range": set_in(doc, ("tree", "nodes", 0, "feature"), 10 ** 6),
        "schema features hold strings": set_in(doc, ("data_schema", "features"), ["x0", "x1"]),
        "schema feature name a number": set_in(doc, ("data_schema", "features", 0, "name"), 7),
        "schema version true": set_in(doc, ("data_schema", "version"), True),
        "schema classes a string": set_in(doc, ("data_schema", "classes"), "abc"),
        "schema label is the id": set_in(doc, ("data_schema", "id_column"), doc["data_schema"]["label"]),
        "encoding unknown": set_in(doc, ("encoding",), "gbdt"),
        "a list": [doc],
    }
    if numeric:
        out["NaN threshold"] = set_in(doc, ("tree", "nodes", numeric[0], "thresholds", 0), float("nan"))
        out["infinite threshold"] = set_in(doc, ("tree", "nodes", numeric[0], "thresholds", 0), float("inf"))
    if categorical:
        out["category code out of range"] = set_in(doc, ("tree", "nodes", categorical[0], "values", 0), 10 ** 6)
    text = json.dumps(doc, indent=1)
    out["a 5000-digit integer"] = text.replace('"version": 1', f'"version": {HUGE}', 1)
    out["a 5000-digit count"] = text.replace('"counts": [\n', f'"counts": [\n{HUGE}, ', 1)
    out["a 400-digit count"] = with_long(doc, ("tree", "nodes", 0, "counts", 0))
    if numeric:
        out["a 400-digit threshold"] = with_long(doc, ("tree", "nodes", numeric[0], "thresholds", 0))
    out["nested 100000 deep"] = text.replace('"info": {', f'"deep": {DEEP}, "info": {{', 1)
    out["not UTF-8"] = text.encode().replace(b'"x0"', b'"\xff0"', 1)
    out["a BOM before broken JSON"] = "\ufeff" + text[:200]
    out["truncated"] = text[: len(text) // 2]
    return out


@pytest.mark.parametrize("algorithm", ["cart", "id3"])
def test_hostile_global_trees_are_refused(models, tmp_path, capsys, algorithm):
    tmp, docs = models
    doc = docs[algorithm]
    assert any(n["kind"] == "categorical" for n in doc["tree"]["nodes"]) == (algorithm == "id3")
    # optional parts: category names (display only), the tree's declared category counts (the receiver's
    # schema decides), a node's missing-value child (absent: NaN stops at the node), the id column, the info
    optional = {("category_names",), ("tree", "n_categories"), ("data_schema", "id_column"), ("info",)}
    optional |= {p for p in paths(doc) if p[:1] == ("category_names",) and len(p) == 2}
    optional |= {p for p in paths(doc) if p[:2] == ("tree", "n_categories") and len(p) == 3}
    optional |= {p for p in paths(doc) if p[:2] == ("tree", "nodes") and p[-1] == "missing"}
    generic = generic_cases(doc, optional=optional, skip={("info",)})
    # a category name may be any text; a count or a threshold may be any finite number: those are not faults
    generic = {k: v for k, v in generic.items() if not k.startswith("category_names.")}
    cases = write_cases(tmp_path / "curated", tree_curated(doc), "global_tree.json")
    cases |= write_cases(tmp_path / "generic", generic, "global_tree.json")
    out = tmp_path / "p.csv"
    for label, path in cases.items():
        with pytest.raises(SystemExit) as exc:
            predict_script.main(["--model", str(path), "--csv", str(tmp / "new.csv"), "--out", str(out)])
        stderr = capsys.readouterr().err
        assert_refused(label, exc.value.code, stderr, path)
        assert "XGBoost" not in stderr, f"{label}: read as an XGBoost model: {stderr}"
    assert not out.exists() and len(cases) > 150
    # a BOM before a valid tree (an editor's): read as the ICDTA4FL tree it is
    bom = tmp_path / "bom" / "global_tree.json"
    bom.parent.mkdir()
    bom.write_text("\ufeff" + json.dumps(doc))
    assert predict_script.main(["--model", str(bom), "--csv", str(tmp / "new.csv"), "--out", str(out)]) == 0
    assert "ICDTA4FL global tree" in capsys.readouterr().out
