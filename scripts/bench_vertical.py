"""Benchmark of the vertical packed-Paillier protocol.  Every figure is measured in this one run; nothing is
carried over from earlier runs, and the results files and the docs block are written by this script only.

Sections (``--sections``, default all):

  micro     single-core Paillier rates (median of ``--repeats`` bursts), both randomness modes
  speed     today's engine against the earlier code (``--legacy-ref``, extracted with ``git archive`` and
            imported through PYTHONPATH: its own code path, unchanged), same data, same settings, same
            cores, arms interleaved; plus today's engine on Python arithmetic only (TREEFLARE_NATIVE=0:
            what a site without the C kernel gets) and without histogram subtraction
  packing   the packing arms at one size per model, on Python arithmetic: (a) oracle (mock cipher), (b) unpacked,
            (c) packed only, (d) packed + compressed; beside the measured CPU seconds of every
            encrypted arm, the CPU seconds the operation-count model predicts (a check of the model)
  models    binary / softmax / squared-error GBDT on public data: metrics, identical to the plaintext
            oracle, and centralised XGBoost with the same settings
  capacity  how many classes' (g, h) fit one plaintext (arithmetic, from the slot layout)

Every arm runs in its own process (scripts/vertical_bench_runner.py) with ``--workers`` worker processes per
party; wall and CPU seconds (the process and its workers) are recorded per run with the load average.
Times are medians over ``--repeats`` interleaved runs.  Default randomness: ``full`` (the job's default).

    flock /tmp/treeflare-bench.lock python scripts/bench_vertical.py            # everything (~25 min idle)
    python scripts/bench_vertical.py --quick                                   # small data, 1 repeat

(Over 400 lines: every arm the docs quote is run by this one script, so one command reproduces every
figure; the protocol code it measures is in ``treeflare.vertical``.)
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import replace
from io import BytesIO
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "custom"))
# the docs page holding each block this script writes (tests/test_docs.py checks the markers are there)
BENCH_BLOCKS = {"vertical": "docs/vertical.md"}

from treeflare.crypto import PaillierKeyHolder, SlotLayout  # noqa: E402
from treeflare.reporting import bench_settings, write_json_atomic, write_bench_block, write_text_atomic  # noqa: E402
from treeflare.vertical import VerticalData, VerticalParams  # noqa: E402

LEGACY_REF = "9a11737"        # the vertical code before the packed-gradient rewrite: the "before" arm the tables compare against
RUNNER = REPO / "scripts" / "vertical_bench_runner.py"
PACK_ARMS = {"a": ("oracle (mock cipher)", dict(scheme="mock", workers=1)),
             "b": ("unpacked", dict(packing=False, compress=False)),
             "c": ("packed only", dict(packing=True, compress=False)),
             "d": ("packed + compressed", dict(packing=True, compress=True))}


# ---------------------------------------------------------------------------------------- data
def _fed_data(table, n_passive: int, seed: int = 0, regression_label: str | None = None) -> VerticalData:
    from treeflare.data import prepare_federation

    fed = prepare_federation(table, n_sites=n_passive + 1, seed=seed, vertical=True, n_passive=n_passive,
                             stratify=regression_label is None)
    s = [fed.sites[k] for k in fed.site_names]
    Xa, na, _ = s[0].train.codes()
    if regression_label:
        y = np.array([float(v) for v in s[0].train.y])
        yt = np.array([float(v) for v in s[0].test.y])
        n_classes = 0
    else:
        y, yt, n_classes = s[0].train.y_codes(), s[0].test.y_codes(), len(table.schema.classes)
    return VerticalData(
        X_active=Xa, y=y, X_passive=[t.train.codes()[0] for t in s[1:]], X_active_test=s[0].test.codes()[0],
        y_test=yt, X_passive_test=[t.test.codes()[0] for t in s[1:]], names_active=na,
        names_passive=[t.train.codes()[1] for t in s[1:]], n_classes=n_classes,
        ids_train=list(map(str, s[0].train.ids)), ids_test=list(map(str, s[0].test.ids)))


def credit_data(n_passive: int, n_rows: int | None = None, seed: int = 0) -> VerticalData:
    from treeflare.data import load_dataset

    table = load_dataset("default_credit_card")
    if n_rows and n_rows < len(table):
        table = table.subset(np.sort(np.random.default_rng(seed).choice(len(table), n_rows, replace=False)))
    return _fed_data(table, n_passive, seed)


def credit_limit_data(n_passive: int, n_rows: int | None = None, seed: int = 0) -> VerticalData:
    """Regression on real data with large targets: the credit limit (10,000 to 1,000,000) from the other columns."""
    from treeflare.data import load_csv, load_dataset

    table = load_dataset("default_credit_card")
    if n_rows and n_rows < len(table):
        table = table.subset(np.sort(np.random.default_rng(seed).choice(len(table), n_rows, replace=False)))
    frame = table.to_frame()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "credit_limit.csv"
        frame.to_csv(path, index=False)
        reg = load_csv(path, label="LIMIT_BAL", id_column=table.schema.id_column, name="credit_limit")
    return _fed_data(reg, n_passive, seed, regression_label="LIMIT_BAL")


def nursery_data(n_passive: int, seed: int = 0) -> VerticalData:
    from treeflare.data import load_dataset

    return _fed_data(load_dataset("nursery"), n_passive, seed)


def synthetic_data(n: int, n_passive: int, n_classes: int, passive_features: int = 20, active_features: int = 5,
                   seed: int = 0) -> VerticalData:
    rng = np.random.default_rng(seed)
    n_test = max(200, n // 10)
    m = n + n_test
    Xa = rng.normal(size=(m, active_features))
    split = np.array_split(np.arange(passive_features), n_passive)
    Xp = [rng.normal(size=(m, len(c))) for c in split]
    w = rng.normal(size=passive_features)
    z = Xa[:, :2].sum(axis=1) + np.hstack(Xp) @ w * 0.5 + 0.5 * rng.normal(size=m)
    qs = np.quantile(z, np.linspace(0, 1, n_classes + 1)[1:-1])
    y = np.searchsorted(qs, z).astype(np.int64)
    tr, te = slice(0, n), slice(n, m)
    return VerticalData(
        X_active=Xa[tr], y=y[tr], X_passive=[x[tr] for x in Xp], X_active_test=Xa[te], y_test=y[te],
        X_passive_test=[x[te] for x in Xp], names_active=[f"a{j}" for j in range(active_features)],
        names_passive=[[f"p{i}_{j}" for j in c] for i, c in enumerate(split)], n_classes=n_classes,
        ids_train=list(range(n)), ids_test=list(range(n, m)))


def save_data(d: VerticalData, path: Path) -> Path:
    meta = {"n_passive": len(d.X_passive), "names_active": list(d.names_active),
            "names_passive": [list(x) for x in d.names_passive], "n_classes": int(d.n_classes),
            "ids_train": [str(v) for v in d.ids_train], "ids_test": [str(v) for v in d.ids_test]}
    arrays = {"Xa": d.X_active, "y": np.asarray(d.y), "Xat": d.X_active_test, "yt": np.asarray(d.y_test),
              "meta": np.array(json.dumps(meta))}
    for i, (x, xt) in enumerate(zip(d.X_passive, d.X_passive_test)):
        arrays[f"Xp{i}"], arrays[f"Xpt{i}"] = x, xt
    np.savez(path, **arrays)
    return path


# ---------------------------------------------------------------------------------------- running arms
def extract_legacy(ref: str, dest: Path) -> Path:
    """The package as it was at ``ref`` (git archive of custom/), for the legacy arm."""
    raw = subprocess.run(["git", "archive", "--format=tar", ref, "custom"], cwd=REPO, capture_output=True,
                         check=True).stdout
    with tarfile.open(fileobj=BytesIO(raw)) as tf:
        tf.extractall(dest, filter="data")
    return dest / "custom"


def run_arm(data_path: Path, params: VerticalParams, tmp: Path, pythonpath: Path | None = None,
            env_extra: dict | None = None) -> dict:
    ppath = tmp / f"params_{secrets.token_hex(4)}.json"
    ppath.write_text(json.dumps(params.to_dict()))
    env = dict(os.environ)
    env.update(env_extra or {})
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    load = os.getloadavg()[0]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(RUNNER), str(data_path), str(ppath)], env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"arm failed ({params}):\n{proc.stderr[-4000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["process_wall_s"] = wall
    res["cpu_s"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    res["loadavg_1m_before"] = load
    return res


def median(xs):
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------- micro
def micro(key_bits: int, repeats: int, n_ops: int = 600) -> dict:
    """Single-core operation rates in this process: median over ``repeats`` bursts."""
    out = {"key_bits": key_bits, "repeats": repeats}

    def rate(fn, n):
        runs = []
        for _ in range(repeats):
            t = time.perf_counter()
            for i in range(n):
                fn(i)
            runs.append(n / (time.perf_counter() - t))
        return statistics.median(runs)

    def batch_rate(fn, n):                       # one call handles n items
        return n * rate(lambda _i: fn(), 1)

    from treeflare.crypto import native

    out["native_kernel"] = native.status()
    for ob in ("full", "djn"):
        kh = PaillierKeyHolder.generate(key_bits, ob)
        vals = [secrets.randbits(key_bits - 8) for _ in range(n_ops)]
        # what the job's key holder runs: batches (C kernel when usable; its tables built first, once per
        # process), and one by one in Python (the arithmetic without the kernel)
        kh.key.encrypt_many(vals[:8])
        out[f"enc_per_s_{ob}"] = batch_rate(lambda: kh.key.encrypt_many(vals), len(vals))
        out[f"enc_per_s_{ob}_python"] = rate(lambda i: kh.key.encrypt(vals[i]), n_ops)
    key, pub = kh.key, kh.public
    cts = [key.encrypt(secrets.randbits(key_bits - 8)) for _ in range(64)]
    out["dec_per_s"] = rate(lambda i: key.decrypt(cts[i % 64]), n_ops // 3)
    key.decrypt_many(cts[:8])                      # the kernel's decryption set up first, once per process
    many = cts * 4
    out["dec_per_s_batch"] = batch_rate(lambda: key.decrypt_many(many), len(many))
    out["add_per_s"] = rate(lambda i: pub.add(cts[i % 64], cts[(i + 1) % 64]), 20 * n_ops)
    out["shift139_per_s"] = rate(lambda i: pub.shift(cts[i % 64], 139), n_ops)
    out["bytes_per_ct"] = pub.ct_bytes
    return out


def modelled_cpu(res: dict, oracle_cpu: float, rates: dict, obfuscation: str) -> float:
    """CPU seconds predicted from the run's exact operation counts x single-core costs measured in this run,
    plus the plaintext oracle's own CPU seconds for everything that is not cryptography."""
    c = res["crypto"]
    widths = (res.get("layout") or {}).get("unit_widths") or [139]
    shift_bits = max(widths)
    return (oracle_cpu + c["encryptions"] / rates[f"enc_per_s_{obfuscation}_python"] + c["decryptions"] / rates["dec_per_s"]
            + c["additions"] / rates["add_per_s"] + c["shifts"] * (shift_bits / 139) / rates["shift139_per_s"])


# ---------------------------------------------------------------------------------------- sections
def speed_section(args, tmp: Path, legacy_path: Path, log) -> list:
    base = dict(key_bits=args.key_bits, obfuscation=args.obfuscation, workers=args.workers, bins=32)
    n_syn = 4000 if args.quick else 100_000
    credit_rows = 3000 if args.quick else None
    depth = 3 if args.quick else 5
    workloads = [
        ("credit_gbdt_p2", f"credit card ({'3,000-row sample' if args.quick else '24,000 training rows'}), "
                           f"binary GBDT, 2 passive, depth {depth}, 2 trees",
         lambda: credit_data(2, credit_rows), dict(model="gbdt", objective="binary", n_trees=2, max_depth=depth)),
        ("syn_tree5_p1", f"synthetic {n_syn:,} rows x 20 passive features, 5-label tree, 1 passive, depth {depth}",
         lambda: synthetic_data(n_syn, 1, 5), dict(model="tree", max_depth=depth)),
    ]
    rows = []
    for name, desc, factory, over in workloads:
        dpath = save_data(factory(), tmp / f"{name}.npz")
        P = VerticalParams(**base, **over)
        arms = [("new", P, None, None), ("legacy", P, legacy_path, None),
                ("new, Python arithmetic only (no C kernel)", P, None, {"TREEFLARE_NATIVE": "0"})]
        if name.startswith("credit"):
            arms.append(("new, no histogram subtraction", replace(P, hist_subtraction=False), None, None))
        runs = {a[0]: [] for a in arms}
        for rep in range(args.repeats):
            for arm, p, path, env in arms:
                res = run_arm(dpath, p, tmp, path, env)
                runs[arm].append(res)
                log(f"speed {name:16s} {arm:32s} rep {rep}: per tree {res['per_tree_s']:7.2f}s  cpu {res['cpu_s']:7.1f}s"
                    f"  load {res['loadavg_1m_before']:.2f}  [{res['package']}]")
        new_model = runs["new"][0]["model_sha256"]
        for arm, p, path, env in arms:
            rs = runs[arm]
            rows.append({"section": "speed", "workload": name, "description": desc, "arm": arm,
                         "engine": "legacy" if path else "new", "legacy_ref": args.legacy_ref if path else None,
                         "obfuscation": p.obfuscation, "key_bits": p.key_bits, "workers": p.workers,
                         "n_train": int(np.load(dpath)["y"].shape[0]), "trees": p.n_trees, "depth": p.max_depth,
                         "repeats": len(rs), "per_tree_s_runs": [r["per_tree_s"] for r in rs],
                         "per_tree_s": median([r["per_tree_s"] for r in rs]),
                         "cpu_s": median([r["cpu_s"] for r in rs]), "wall_s": median([r["wall_s"] for r in rs]),
                         "keygen_s": median([r["keygen_s"] for r in rs]),
                         "loadavg_runs": [r["loadavg_1m_before"] for r in rs],
                         "same_model_as_new": all(r["model_sha256"] == new_model for r in rs),
                         "native_kernel": rs[0].get("native_kernel", "absent (earlier code)"),
                         "active_phases_s": rs[0]["active_phases_s"], "passive_phases_s": rs[0]["passive_phases_s"],
                         "crypto": rs[0]["crypto"]})
        # the new engine against its own plaintext oracle
        orc = run_arm(dpath, replace(P, scheme="mock", workers=1), tmp)
        for r in rows:
            if r["workload"] == name and r["engine"] == "new":
                r["identical_to_oracle"] = orc["model_sha256"] == new_model and orc["pred"] == runs["new"][0]["pred"]
    return rows


def packing_section(args, tmp: Path, rates: dict, log) -> list:
    n_l5 = 3000 if args.quick else 20_000
    credit_rows = 3000 if args.quick else None
    depth = 3 if args.quick else 5
    workloads = [
        ("credit_gbdt_p1", f"credit card ({'3,000-row sample' if args.quick else '24,000 training rows'}), binary GBDT, "
                           f"1 passive, depth {depth}, 1 tree",
         lambda: credit_data(1, credit_rows), dict(model="gbdt", objective="binary", max_depth=depth)),
        ("syn_tree5_p1", f"synthetic {n_l5:,} rows x 20 passive features, 5-label tree, 1 passive, depth {depth}",
         lambda: synthetic_data(n_l5, 1, 5), dict(model="tree", max_depth=depth)),
    ]
    rows = []
    for name, desc, factory, over in workloads:
        dpath = save_data(factory(), tmp / f"pack_{name}.npz")
        P = VerticalParams(key_bits=args.key_bits, obfuscation=args.obfuscation, workers=args.workers, bins=32, **over)
        runs = {a: [] for a in PACK_ARMS}
        for rep in range(args.repeats):
            for arm, (label, o) in PACK_ARMS.items():
                # Python arithmetic (no C kernel), so the single-core rates above price every operation
                res = run_arm(dpath, replace(P, **o), tmp, env_extra={"TREEFLARE_NATIVE": "0"})
                runs[arm].append(res)
                log(f"packing {name:16s} ({arm}) {label:22s} rep {rep}: wall {res['wall_s']:7.1f}s  cpu {res['cpu_s']:7.1f}s"
                    f"  load {res['loadavg_1m_before']:.2f}")
        orc = runs["a"]
        orc_cpu = median([r["cpu_s"] - r["keygen_s"] for r in orc])
        for arm, (label, o) in PACK_ARMS.items():
            rs = runs[arm]
            c = rs[0]["crypto"]
            nodes = max(1, rs[0].get("hist_nodes") or 1)
            row = {"section": "packing", "workload": name, "description": desc, "arm": arm, "arm_label": label,
                   "obfuscation": P.obfuscation if arm != "a" else "none (mock)", "key_bits": P.key_bits,
                   "workers": 1 if arm == "a" else P.workers, "repeats": len(rs),
                   "n_train": int(np.load(dpath)["y"].shape[0]),
                   "wall_s": median([r["wall_s"] - r["keygen_s"] for r in rs]),
                   "cpu_s": median([r["cpu_s"] - r["keygen_s"] for r in rs]),
                   "per_tree_s": median([r["per_tree_s"] for r in rs]),
                   "modelled_cpu_s": None if arm == "a" else modelled_cpu(rs[0], orc_cpu, rates, P.obfuscation),
                   "identical_to_oracle": all(r["model_sha256"] == orc[0]["model_sha256"] for r in rs),
                   "loadavg_runs": [r["loadavg_1m_before"] for r in rs], "layout": rs[0]["layout"],
                   **{k: c[k] for k in ("encryptions", "decryptions", "additions", "shifts", "ciphertexts_to_passive",
                                        "ciphertexts_to_active", "bytes_to_passive", "bytes_to_active",
                                        "values_per_ciphertext")}}
            row["open_nodes"] = nodes
            rows.append(row)
    return rows


def models_section(args, tmp: Path, log) -> list:
    from treeflare.vertical import metrics, run_oracle, run_vertical
    from treeflare.vertical.baseline import xgboost_baseline
    from treeflare.vertical.driver import compare_runs

    rows_n = 3000 if args.quick else None
    cases = [
        ("credit_binary", "credit card default, 2 passive", "binary", lambda: credit_data(2, rows_n)),
        ("nursery_softmax", "nursery (5 classes), 2 passive", "softmax", lambda: nursery_data(2)),
        ("credit_limit_regression", "credit card limit (10k-1M), 2 passive", "squared_error",
         lambda: credit_limit_data(2, rows_n)),
    ]
    out = []
    for name, desc, obj, factory in cases:
        d = factory()
        P = VerticalParams(model="gbdt", objective=obj, n_trees=3, max_depth=3 if args.quick else 5, bins=32,
                           learning_rate=0.3, key_bits=args.key_bits, obfuscation=args.obfuscation, workers=args.workers)
        t = time.perf_counter()
        fed = run_vertical(d, P)
        wall = time.perf_counter() - t
        same = compare_runs(fed, run_oracle(d, P))["identical"]
        a = fed[0]
        m = metrics(d.y_test, a.test_pred, a.test_score, d.n_classes, obj)
        base = xgboost_baseline(d, P)
        log(f"models {name}: identical={same} {m} xgboost {base['global']}")
        out.append({"section": "models", "workload": name, "description": desc, "objective": obj,
                    "n_train": len(d.y), "n_test": len(d.y_test), "n_classes": d.n_classes, "trees": P.n_trees,
                    "depth": P.max_depth, "bins": P.bins, "learning_rate": P.learning_rate,
                    "obfuscation": P.obfuscation, "key_bits": P.key_bits, "identical_to_oracle": same,
                    "metrics": m, "xgboost": base, "wall_s_one_run": wall, "layout": a.layout_info,
                    "loadavg": os.getloadavg()[0]})
    return out


def capacity_section() -> list:
    rows = []
    for key_bits in (2048, 3072, 4096):
        usable = key_bits - 2
        for p in (53, 32):
            for n in (10_000, 100_000, 1_000_000):
                one = 1 << p
                lay = SlotLayout.for_channels([-one, 0], [one, one >> 2], n)
                rows.append({"key_bits": key_bits, "precision": p, "n_rows": n, "g_bits": lay.widths[0],
                             "h_bits": lay.widths[1], "classes_per_plaintext": usable // lay.total_width})
    return rows


# ---------------------------------------------------------------------------------------- output
def fmt(v, nd=1):
    return "" if v is None else f"{v:,.{nd}f}"


def markdown(state: dict) -> tuple[str, str]:
    """(full results page, docs block)."""
    S = state["settings"]
    lines = ["# Vertical packed-Paillier benchmark", "",
             f"Run {S['time']}, commit {S['commit']}, {S['cores']} cores shared with other work; load average at "
             f"start {S['loadavg']}, at end {state.get('loadavg_end')}; "
             f"`scripts/bench_vertical.py {' '.join(S['argv']) or '(default arguments)'}`. "
             f"Randomness: `{S['obfuscation']}` in every encrypted arm unless a row says otherwise; "
             f"{S['key_bits']}-bit keys; {S['workers']} worker processes per party; medians of {S['repeats']} "
             "interleaved runs; every arm in its own process.", ""]
    docs_block = []
    m = state.get("micro")
    if m:
        s = (f"Single-core Paillier rates at {m['key_bits']} bits measured in this run (median of {m['repeats']} "
             f"bursts): encryption {m['enc_per_s_full']:,.0f}/s with `full` randomness, {m['enc_per_s_djn']:,.0f}/s "
             f"with `djn`, in the key holder's batches (C kernel: {m['native_kernel']}); without the kernel "
             f"{m['enc_per_s_full_python']:,.0f}/s `full`, {m['enc_per_s_djn_python']:,.0f}/s `djn`; decryption "
             f"{m['dec_per_s_batch']:,.0f}/s in batches, {m['dec_per_s']:,.0f}/s one by one in Python; Python "
             f"addition {m['add_per_s']:,.0f}/s; Python shift by 2^139 "
             f"{m['shift139_per_s']:,.0f}/s. Target: >= 2,000 encryptions/s per core with `full` randomness: "
             f"{'met' if min(m['enc_per_s_full'], m['enc_per_s_full_python']) >= 2000 else 'MISSED'} "
             "(with and without the kernel).")
        lines += [s, ""]
        docs_block += [s, ""]
    sp = [r for r in state["rows"] if r["section"] == "speed"]
    if sp:
        hdr = ["workload", "engine", "per tree, s (median)", "runs, s", "CPU s per run", "speed-up vs earlier code",
               "same model as new engine", "C kernel", "load average per run"]
        tab = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        for r in sp:
            leg = next(x for x in sp if x["workload"] == r["workload"] and x["engine"] == "legacy")
            tab.append("| " + " | ".join([
                r["description"], r["arm"] + (f" (`{r['legacy_ref']}`)" if r["legacy_ref"] else ""),
                fmt(r["per_tree_s"], 2), ", ".join(f"{v:.2f}" for v in r["per_tree_s_runs"]), fmt(r["cpu_s"]),
                f"{leg['per_tree_s'] / r['per_tree_s']:.2f}x", str(r["same_model_as_new"]), r["native_kernel"],
                ", ".join(f"{v:.1f}" for v in r["loadavg_runs"])]) + " |")
        intro = (f"**Speed, today's engine against the earlier code** (same data, same settings: `{S['obfuscation']}` "
                 f"randomness, {S['key_bits']}-bit keys, {S['workers']} worker processes per party on the same "
                 f"{S['cores']} cores; per-tree wall time = tree building including encryption, excluding key "
                 "generation; target >= 2x):")
        ident = [f"{r['workload']}: {r.get('identical_to_oracle')}" for r in sp if r["arm"] == "new"]
        verdict = []
        for r in sp:
            if r["engine"] != "new" or "subtraction" in r["arm"]:
                continue
            leg = next(x for x in sp if x["workload"] == r["workload"] and x["engine"] == "legacy")
            ratio = leg["per_tree_s"] / r["per_tree_s"]
            verdict.append(f"{r['workload']} ({r['arm']}) {ratio:.2f}x per tree ({'met' if ratio >= 2 else 'MISSED'}), "
                           f"CPU seconds per run {leg['cpu_s'] / r['cpu_s']:.2f}x fewer")
        v = "Target >= 2x per tree: " + "; ".join(verdict) + "."
        lines += [intro, "", *tab, "", v, "", "New engine identical to its plaintext oracle: " + ", ".join(ident) + ".", ""]
        docs_block += [intro, "", *tab, "", v, ""]
    pk = [r for r in state["rows"] if r["section"] == "packing"]
    if pk:
        hdr = ["workload", "arm", "wall s", "CPU s, measured", "CPU s, modelled", "(b)/arm, CPU", "encryptions",
               "decryptions", "ct back per node", "values per ct", "same as oracle"]
        tab = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        for r in pk:
            b = next(x for x in pk if x["workload"] == r["workload"] and x["arm"] == "b")
            tab.append("| " + " | ".join([
                r["description"], f"({r['arm']}) {r['arm_label']}", fmt(r["wall_s"]), fmt(r["cpu_s"]),
                fmt(r["modelled_cpu_s"]), "" if r["arm"] == "a" else f"{b['cpu_s'] / r['cpu_s']:.2f}x",
                f"{r['encryptions']:,}", f"{r['decryptions']:,}", fmt(r["ciphertexts_to_active"] / r["open_nodes"]),
                str(r["values_per_ciphertext"]), str(r["identical_to_oracle"])]) + " |")
        intro = (f"**Packing arms, all measured** (`{S['obfuscation']}` randomness; Python arithmetic, without the C "
                 "kernel, so that the single-core Python rates above price every operation; wall and CPU seconds of "
                 "the whole run without key generation, CPU including every worker process; the unpacked arm is run, "
                 "not modelled; \"CPU s, modelled\" = this run's exact operation counts x those rates + the oracle's "
                 "own CPU, beside the measured value as a check of the cost model):")
        lines += [intro, "", *tab, ""]
        docs_block += [intro, "", *tab, ""]
    md = [r for r in state["rows"] if r["section"] == "models"]
    if md:
        hdr = ["data", "objective", "train rows", "federated", "XGBoost, centralised, same settings",
               "identical to oracle"]
        tab = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        for r in md:
            keys = ["rmse", "r2"] if r["objective"] == "squared_error" else \
                ["accuracy", "macro_f1", "auc" if r["n_classes"] == 2 else "mlogloss"]
            f = ", ".join(f"{k} {r['metrics'][k]:,.4g}" for k in keys)
            x = ", ".join(f"{k} {r['xgboost']['global'][k]:,.4g}" for k in keys)
            tab.append(f"| {r['description']} | {r['objective']} | {r['n_train']:,} | {f} | {x} | "
                       f"{r['identical_to_oracle']} |")
        intro = (f"**Models** ({md[0]['trees']} trees, depth {md[0]['depth']}, {md[0]['bins']} bins, learning rate "
                 f"{md[0]['learning_rate']}, global test set; XGBoost `hist` on the joined columns, softmax as one "
                 "multi-output tree per round):")
        lines += [intro, "", *tab, ""]
        docs_block += [intro, "", *tab, ""]
    cap = state.get("capacity")
    if cap:
        hdr = ["key bits", "precision", "rows", "g slot", "h slot", "classes per plaintext"]
        tab = ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        for r in cap:
            if r["precision"] == 53 or r["key_bits"] == 2048:
                tab.append(f"| {r['key_bits']} | {r['precision']} | {r['n_rows']:,} | {r['g_bits']} | {r['h_bits']} | "
                           f"{r['classes_per_plaintext']} |")
        intro = ("**Softmax capacity** (arithmetic from the slot layout: a class needs a signed g slot and an h slot "
                 "wide enough for a sum over every row):")
        lines += [intro, "", *tab, ""]
        docs_block += [intro, "", *tab, ""]
    lines += ["Per-phase seconds of the first run of each speed arm are in vertical_bench.json."]
    docs_block += [f"Measured {S['time']} (commit {S['commit']}), load average {S['loadavg']} at start, "
               f"{state.get('loadavg_end')} at end; full tables: `scripts/results/vertical_bench.md`."]
    return "\n".join(lines) + "\n", "\n".join(docs_block)


def write_csv(rows, path: Path):
    cols = sorted({k for r in rows for k, v in r.items() if not isinstance(v, (dict, list))})
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for r in rows:
            w.writerow([r.get(c) for c in cols])


# ---------------------------------------------------------------------------------------- main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small data, depth 3, 1 repeat (a smoke test; no docs block)")
    ap.add_argument("--sections", default="micro,speed,packing,models,capacity")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved runs per arm (default 3; 1 with --quick)")
    ap.add_argument("--key-bits", type=int, default=2048)
    ap.add_argument("--obfuscation", choices=["full", "djn"], default="full",
                    help="randomness of every encrypted arm (default full, the job's default)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes per party (default 2)")
    ap.add_argument("--legacy-ref", default=LEGACY_REF, help=f"git ref of the earlier code (default {LEGACY_REF})")
    ap.add_argument("--out", default=str(REPO / "scripts" / "results" / "vertical_bench"))
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite the docs block")
    args = ap.parse_args(argv)
    args.repeats = args.repeats or (1 if args.quick else 3)
    sections = args.sections.split(",")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    state = {"settings": bench_settings(argv=sys.argv[1:], quick=args.quick, repeats=args.repeats,
                                        obfuscation=args.obfuscation, key_bits=args.key_bits, workers=args.workers,
                                        legacy_ref=args.legacy_ref, seeds={"data": 0}),
             "rows": []}
    log(f"load average {os.getloadavg()}; cores {os.cpu_count()}")
    tmp = Path(tempfile.mkdtemp(prefix="treeflare-vbench-"))
    try:
        rates = None
        if "micro" in sections or "packing" in sections:
            rates = micro(args.key_bits, max(3, args.repeats), 300 if args.quick else 800)
            state["micro"] = rates
            log("micro: " + ", ".join(f"{k}={v:,.0f}" if isinstance(v, (int, float)) else f"{k}={v}"
                                      for k, v in rates.items()))
        if "speed" in sections:
            legacy = extract_legacy(args.legacy_ref, tmp / "legacy")
            state["rows"] += speed_section(args, tmp, legacy, log)
        if "packing" in sections:
            state["rows"] += packing_section(args, tmp, rates, log)
        if "models" in sections:
            state["rows"] += models_section(args, tmp, log)
        if "capacity" in sections:
            state["capacity"] = capacity_section()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    state["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    page, block = markdown(state)
    write_json_atomic(out.with_suffix(".json"), state)
    write_csv(state["rows"], out.with_suffix(".csv"))
    write_text_atomic(out.with_suffix(".md"), page)
    if not args.quick and not args.no_docs and set(sections) >= {"micro", "speed", "packing", "models", "capacity"}:
        write_bench_block(REPO / BENCH_BLOCKS["vertical"], "vertical", block)
    log(page)
    log(f"wrote {out.with_suffix('.md')}, .json, .csv")


if __name__ == "__main__":
    main()
