#!/usr/bin/env python
"""Does every XGBoost from 2.0 to 3.4 load the engine's ``model.json`` and predict what its trees say? (issue 36)

For each version it installs the wheel into a cache folder (``pip install --no-deps --target``: ``xgboost-cpu`` where
it is published, 2.1.1 on, else ``xgboost``; numpy comes from this environment), then runs itself in a subprocess with
only that folder added to PYTHONPATH, which loads each document written by ``engine.native_model.model_document`` from
its bytes and predicts. The documents: seeded random trees, XGBoost-numbered, depth up to 5, every split with a
default direction, 10 rounds, for binary:logistic (base_score 0.3), multi:softprob (3 classes, 0.5) and
reg:squarederror (12.5), on 500 rows with a quarter of the values missing and some equal to a split condition
(``x < condition`` goes left). They are compared with the numpy traversal ``native_model.margins``: margins, and
predictions against the objective's transform in float64. A control row re-spells binary's base_score as 3.1+ write
it ("[3E-1]"), which older versions read as 0.5: it must show a difference there, or the check could not see one.

XGBoost 3.3 and 3.4 declare Python >= 3.12. When pip refuses a version for this Python, its Python 3.12 wheel
(pure Python around ``libxgboost.so``, ``py3-none``) is downloaded and unpacked instead and run here; the row says so.
Their JSON loaders were also read (``SOURCE_NOTES``).

    python scripts/check_xgb_versions.py                      # all versions; writes scripts/results/xgb_versions.*
    python scripts/check_xgb_versions.py --versions 2.0.3,3.2.0 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "scripts" / "results"
VERSIONS = ("2.0.3", "2.1.4", "3.0.5", "3.1.3", "3.2.0", "3.3.0", "3.4.1")  # the newest patch of each minor
CACHE = Path(tempfile.gettempdir()) / "treeflare-xgb-versions"
SEED, ROWS, FEATURES, ROUNDS, DEPTH = 0, 500, 6, 10, 5
DOCS = {  # name -> (objective, num_class, base_score)
    "binary": ("binary:logistic", 0, 0.3),
    "multi": ("multi:softprob", 3, 0.5),
    "regression": ("reg:squarederror", 0, 12.5),
}
CONTROL = "binary, base_score as '[3E-1]' (control)"
SOURCE_NOTES = [
    "Read in dmlc/xgboost at v3.3.0 (d5cd2b4) and v3.4.1 (6fe8c54), against v2.0.3 (82d846b) and v3.2.0 (7991260):",
    "src/learner.cc LearnerModelParamLegacy::FromJson: base_score parsed by common::ParamArray (src/common/"
    "param_array.cc: JSON text, a single number or a list); HandleOldFormat gives a single number to every class; "
    "2.0-3.0 parse it with from_chars (src/common/charconv.cc: at most 9 mantissa digits, no '[') and ignore a "
    "failure, keeping the default 0.5. LoadModel reads 'version' only to warn about files before 1.6.",
    "src/gbm/gbtree_model.cc GBTreeModel::LoadModel: iteration_indptr and cats optional (3.1+), tree id must equal "
    "its position (3.3+), weight_drop optional (3.4).",
    "src/tree/tree_model.cc TreeParam::FromJson / LoadModelImpl and src/tree/io_utils.h GetElem: size_leaf_vector "
    "> 1 only for multi-target trees; float arrays must hold JSON floats (an integer is refused), default_left may "
    "be 0/1 integers.",
    "src/common/json.cc ParseNumber: a float of more than 9 digits falls back to strtof (every version).",
    "src/objective/regression_obj.cu: reg_loss_param required before 3.1 (written always); multiclass_obj.cu: "
    "softmax_multiclass_param read; ProbToMargin: logit for binary:logistic, identity for the other two "
    "(multi:softprob starts each class at base_score).",
]


# ---------------------------------------------------------------------------------------------- documents
def random_tree(rng, depth: int) -> dict:
    """XGBoost's arrays of a random tree, nodes numbered as XGBoost's depth-wise growth does (children appended in
    pairs as their parents split)."""
    left, right, feature, cond, dleft, hess = [-1], [-1], [0], [0.0], [0], [100.0]
    frontier = [(0, 0)]
    while frontier:
        node, d = frontier.pop(0)
        if d >= depth or (node and rng.random() < 0.25):
            cond[node] = float(rng.normal(0, 0.5))  # a leaf holds its value in split_conditions
            continue
        k = len(left)
        left[node], right[node] = k, k + 1
        feature[node], cond[node] = int(rng.integers(FEATURES)), float(rng.normal())
        dleft[node] = int(rng.random() < 0.5)
        share = float(rng.uniform(0.2, 0.8))
        for child, h in ((k, hess[node] * share), (k + 1, hess[node] * (1 - share))):
            left.append(-1), right.append(-1), feature.append(0), cond.append(0.0), dleft.append(0), hess.append(h)
            frontier.append((child, d + 1))
    n = len(left)
    return {"left_children": left, "right_children": right, "split_indices": feature, "split_conditions": cond,
            "default_left": dleft, "base_weights": rng.normal(size=n).tolist(),
            "loss_changes": [float(rng.uniform(0, 5)) if c != -1 else 0.0 for c in left], "sum_hessian": hess}


def build(folder: Path) -> dict[str, dict]:
    """Write X.npy and one model per document into ``folder``; returns the documents."""
    from treeflare.xgb.engine.native_model import model_bytes, model_document

    rng = np.random.default_rng(SEED)
    docs = {}
    for name, (objective, k, base) in DOCS.items():
        groups = max(k, 1)
        trees = [random_tree(rng, DEPTH) for _ in range(ROUNDS * groups)]
        docs[name] = model_document(trees, [t % groups for t in range(len(trees))], n_features=FEATURES,
                                    objective=objective, num_class=k, base_score=base)
    control = json.loads(model_bytes(docs["binary"]))
    control["learner"]["learner_model_param"]["base_score"] = "[3E-1]"
    docs[CONTROL] = control
    X = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    splits = [(f, c) for d in docs.values() for t in d["learner"]["gradient_booster"]["model"]["trees"]
              for f, c, lc in zip(t["split_indices"], t["split_conditions"], t["left_children"]) if lc != -1]
    for r in range(0, ROWS, 10):  # a value equal to a split condition goes right
        f, c = splits[int(rng.integers(len(splits)))]
        X[r, f] = c
    X[rng.random(X.shape) < 0.25] = np.nan
    np.save(folder / "X.npy", X)
    for i, (name, doc) in enumerate(docs.items()):
        (folder / f"doc{i}.json").write_bytes(model_bytes(doc))
    return docs


def reference(doc: dict, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from treeflare.xgb.engine.native_model import margins

    m = margins(doc, X)
    objective = doc["learner"]["objective"]["name"]
    if objective == "binary:logistic":
        return m, 1.0 / (1.0 + np.exp(-m.astype(np.float64)))
    if objective == "multi:softprob":
        e = np.exp(m.astype(np.float64) - m.max(axis=1, keepdims=True))
        return m, e / e.sum(axis=1, keepdims=True)
    return m, m.astype(np.float64)


# ---------------------------------------------------------------------------------------------- installing
def install(version: str, cache: Path) -> tuple[Path | None, str]:
    """(folder holding that XGBoost, how it got there); (None, why) when the registry serves no wheel."""
    package = "xgboost-cpu" if tuple(map(int, version.split("."))) >= (2, 1, 1) else "xgboost"
    target = cache / version
    if (target / "xgboost" / "VERSION").is_file():
        how = (target / ".how").read_text() if (target / ".how").is_file() else "cached"
        return target, how
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    run = subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", str(target),
                          f"{package}=={version}"], capture_output=True, text=True)
    how = f"pip install --no-deps --target ({package})"
    if run.returncode != 0:  # 3.3+: Requires-Python >= 3.12; the wheel itself is py3-none
        with tempfile.TemporaryDirectory() as tmp:
            dl = subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                                 "-d", tmp, f"{package}=={version}"], capture_output=True, text=True)
            wheels = list(Path(tmp).glob("*.whl"))
            if dl.returncode != 0 or len(wheels) != 1:
                return None, (run.stderr.strip().splitlines() or ["pip failed"])[-1][:300]
            with zipfile.ZipFile(wheels[0]) as z:
                z.extractall(target)
        for lib in target.rglob("*.so*"):
            lib.chmod(0o755)
        how = f"{wheels[0].name} unpacked (pip: Requires-Python >= 3.12), run on Python {platform.python_version()}"
    (target / ".how").write_text(how)
    return target, how


# ---------------------------------------------------------------------------------------------- worker
def worker(folder: Path, out: Path) -> None:
    """In the subprocess: load every doc*.json with this XGBoost, save its margins and predictions."""
    import xgboost as xgb

    X = np.load(folder / "X.npy")
    out.mkdir(parents=True, exist_ok=True)
    print(json.dumps({"xgboost": xgb.__version__, "file": xgb.__file__}), flush=True)
    for path in sorted(folder.glob("doc*.json")):
        row = {"doc": path.stem}
        try:
            booster = xgb.Booster()
            booster.load_model(bytearray(path.read_bytes()))
            data = xgb.DMatrix(X, missing=np.nan)
            np.save(out / f"{path.stem}-margin.npy", booster.predict(data, output_margin=True).reshape(len(X), -1))
            np.save(out / f"{path.stem}-pred.npy", booster.predict(data).reshape(len(X), -1))
            param = json.loads(booster.save_raw("json"))["learner"]["learner_model_param"]
            row.update(loads=True, resaved_base_score=param["base_score"])
        except Exception as exc:  # noqa: BLE001 (an XGBoostError or a version's own API difference: recorded)
            row.update(loads=False, error=str(exc).strip().splitlines()[0][:300])
        print(json.dumps(row), flush=True)


def check(version: str, folder: Path, where: Path, docs: dict) -> tuple[dict, list[dict]]:
    env = {**os.environ, "PYTHONPATH": str(where), "PYTHONNOUSERSITE": "1", "OMP_NUM_THREADS": "1"}
    out = folder / f"out-{version}"
    proc = subprocess.run([sys.executable, __file__, "--worker", str(folder), str(out)], capture_output=True,
                          text=True, env=env, timeout=600)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:300]}, []
    head, rows = lines[0], lines[1:]
    X = np.load(folder / "X.npy")
    names = list(docs)
    for row in rows:
        name = names[int(row.pop("doc")[3:])]
        row["document"] = name
        row["objective"] = docs[name]["learner"]["objective"]["name"]
        if row["loads"]:
            ref_margin, ref_pred = reference(docs[name], X)
            margin, pred = np.load(out / f"doc{names.index(name)}-margin.npy"), np.load(
                out / f"doc{names.index(name)}-pred.npy")
            row["margin_max_abs_diff"] = float(np.abs(margin.astype(np.float64) - ref_margin).max())
            row["margin_exact"] = bool(np.array_equal(margin, ref_margin))
            row["prediction_max_abs_diff"] = float(np.abs(pred.astype(np.float64) - ref_pred).max())
    return head, rows


def table(results: list[dict]) -> str:
    lines = ["| XGBoost | document | loads | margins equal | max abs diff, margin | max abs diff, prediction | "
             "base_score as it writes it |", "|---|---|---|---|---|---|---|"]
    for r in results:
        for row in r["rows"] or [{"document": "-", "loads": False, "error": r.get("error", "")}]:
            if row["loads"]:
                cells = ["yes", "yes" if row["margin_exact"] else "no", f"{row['margin_max_abs_diff']:.3g}",
                         f"{row['prediction_max_abs_diff']:.3g}", f"`{row['resaved_base_score']}`"]
            else:
                cells = [f"no: {row.get('error', '')}", "", "", "", ""]
            lines.append(f"| {r['version']} | {row['document']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--versions", default=",".join(VERSIONS), help="comma-separated XGBoost versions")
    ap.add_argument("--cache", type=Path, default=CACHE, help=f"where wheels are unpacked (default {CACHE})")
    ap.add_argument("--no-write", action="store_true", help="print only; do not write scripts/results")
    ap.add_argument("--worker", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(*args.worker)
        return 0
    sys.path.insert(0, str(REPO / "scripts"))
    from bench_common import bench_settings
    from treeflare.files import write_json_atomic, write_text_atomic

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        docs = build(folder)
        for version in args.versions.split(","):
            where, how = install(version, args.cache)
            entry = {"version": version, "installed": how, "rows": []}
            if where is not None:
                head, entry["rows"] = check(version, folder, where, docs)
                entry.update(head)
                if head.get("xgboost") != version:  # the environment's own XGBoost answered: not this version
                    entry.update(rows=[], error=f"loaded XGBoost {head.get('xgboost')} from {head.get('file')}")
            else:
                entry["error"] = how
            results.append(entry)
            ok = [r for r in entry["rows"] if r["document"] != CONTROL]
            print(f"{version}: {sum(r['loads'] for r in ok)}/{len(ok)} load, max margin diff "
                  f"{max((r.get('margin_max_abs_diff', np.inf) for r in ok), default=np.inf):.3g} ({how})", flush=True)
    text = table(results)
    print(text)
    good = all(r["loads"] and r["margin_exact"] and r["prediction_max_abs_diff"] < 1e-6
               for e in results for r in e["rows"] if r["document"] != CONTROL) and all(e["rows"] for e in results)
    # the control must differ where the version cannot read a list: else the comparison is blind
    seen = all(r["margin_max_abs_diff"] > 0.1 for e in results for r in e["rows"]
               if r["document"] == CONTROL and tuple(map(int, e["version"].split(".")[:2])) < (3, 1))
    print(f"every document loads and predicts as its trees say in every version: {good}; control seen: {seen}")
    if not args.no_write:
        settings = bench_settings(seed=SEED, rows=ROWS, features=FEATURES, rounds=ROUNDS, max_depth=DEPTH,
                                  missing_share=0.25, python=platform.python_version(), numpy=np.__version__,
                                  documents={k: {"objective": o, "num_class": c, "base_score": b}
                                             for k, (o, c, b) in DOCS.items()})
        write_json_atomic(RESULTS / "xgb_versions.json", {"settings": settings, "all_pass": good,
                                                          "control_seen": seen, "versions": results,
                                                          "source_notes": SOURCE_NOTES})
        note = (f"`scripts/check_xgb_versions.py`, {settings['time']}, commit {settings['commit']}, Python "
                f"{settings['python']}, numpy {settings['numpy']}: documents written by "
                f"`treeflare.xgb.engine.native_model.model_document`, {ROUNDS} rounds of random trees (depth <= "
                f"{DEPTH}) on {ROWS} rows x {FEATURES} features, 25% missing, compared with `native_model.margins`; "
                f"all pass: {good}; the control (3.1+'s base_score spelling) differs before 3.1: {seen}.")
        installed = "\n".join(f"- {e['version']}: {e['installed']}" for e in results)
        write_text_atomic(RESULTS / "xgb_versions.md", "# The engine's model.json in each XGBoost\n\n" + text
                          + "\n\n" + note + "\n\nInstalled:\n\n" + installed + "\n\n"
                          + "\n".join(f"- {n}" for n in SOURCE_NOTES) + "\n")
        print(f"wrote {RESULTS / 'xgb_versions.json'} and .md")
    return 0 if good and seen else 1


if __name__ == "__main__":
    sys.exit(main())
