"""Benchmark of the vertical packed-Paillier tree protocol: four arms on the same data.

  (a) oracle      mock cipher (plaintext integers), same protocol
  (b) unpacked    one ciphertext per value (per label indicator / per g and h), one per returned statistic
  (c) packed      all values of a row in one plaintext (claims 3/4), one ciphertext per returned split
  (d) packed + compressed   several returned splits per ciphertext (claim 6) -- the patent's method

Every arm runs the in-process driver (the same party code the FLARE job runs), one core per party
(workers=1), in its own forked process (so peak RSS is per arm).  Arms that would take too long can be
*modelled* instead (``--model-slow-arms``): their exact operation counts come from a mock-cipher run of
that arm, multiplied by per-operation costs measured here; such rows are labelled "modelled".

    python scripts/bench_vertical.py --quick
    flock /tmp/treeflare-bench.lock nice -n 10 python scripts/bench_vertical.py --workloads credit_gbdt_p1 ...
"""
from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import os
import resource
import secrets
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "custom"))

from treeflare.crypto import PaillierKeyHolder  # noqa: E402
from treeflare.vertical import VerticalData, VerticalParams, crypto_report, run_vertical  # noqa: E402

ARMS = {
    "a": ("oracle (mock cipher)", dict(scheme="mock", packing=True, compress=True)),
    "b": ("unpacked", dict(packing=False, compress=False)),
    "c": ("packed only", dict(packing=True, compress=False)),
    "d": ("packed + compressed", dict(packing=True, compress=True)),
}


# ---------------------------------------------------------------------------------------- data
def credit_data(n_passive: int, n_rows: int | None, seed: int = 0) -> VerticalData:
    from treeflare.data import load_dataset, prepare_federation

    table = load_dataset("default_credit_card")
    if n_rows and n_rows < len(table):
        rows = np.sort(np.random.default_rng(seed).choice(len(table), n_rows, replace=False))
        table = table.subset(rows)
    fed = prepare_federation(table, n_sites=n_passive + 1, seed=seed, vertical=True, n_passive=n_passive)
    s = [fed.sites[k] for k in fed.site_names]
    Xa, na, _ = s[0].train.codes()
    return VerticalData(
        X_active=Xa, y=s[0].train.y_codes(), X_passive=[t.train.codes()[0] for t in s[1:]],
        X_active_test=s[0].test.codes()[0], y_test=s[0].test.y_codes(),
        X_passive_test=[t.test.codes()[0] for t in s[1:]], names_active=na,
        names_passive=[t.train.codes()[1] for t in s[1:]], n_classes=2,
        ids_train=list(map(str, s[0].train.ids)), ids_test=list(map(str, s[0].test.ids)))


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


def workloads(quick: bool):
    """name -> (description, data factory, params overrides)"""
    n_credit = 3000 if quick else None
    n_syn = 4000 if quick else 100_000
    depth = 3 if quick else 5
    out = {}
    for p in (1, 3):
        out[f"credit_gbdt_p{p}"] = (f"default_credit_card{' (3,000-row sample)' if quick else ''}, GBDT, {p} passive",
                                    lambda p=p: credit_data(p, n_credit), dict(model="gbdt", max_depth=depth))
        out[f"credit_tree_p{p}"] = (f"default_credit_card{' (3,000-row sample)' if quick else ''}, tree L=2, {p} passive",
                                    lambda p=p: credit_data(p, n_credit), dict(model="tree", max_depth=depth))
        out[f"syn_gbdt_p{p}"] = (f"synthetic {n_syn:,} x 20 passive feat, GBDT, {p} passive",
                                 lambda p=p: synthetic_data(n_syn, p, 2), dict(model="gbdt", max_depth=depth))
        out[f"syn_tree5_p{p}"] = (f"synthetic {n_syn:,} x 20 passive feat, tree L=5, {p} passive",
                                  lambda p=p: synthetic_data(n_syn, p, 5), dict(model="tree", max_depth=depth))
    return out


# ---------------------------------------------------------------------------------- micro
def micro(key_bits: int, seconds: float = 2.0) -> dict:
    """Single-core Paillier operation rates (best of 3 short bursts)."""
    out = {"key_bits": key_bits}
    for ob in ("full", "djn"):
        kh = PaillierKeyHolder.generate(key_bits, ob)
        best = 0.0
        for _ in range(3):
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds / 3:
                kh.key.encrypt(secrets.randbits(key_bits - 4))
                n += 1
            best = max(best, n / (time.perf_counter() - t0))
        out[f"enc_per_s_{ob}"] = best
    key = kh.key
    pub = kh.public
    cts = [key.encrypt(secrets.randbits(key_bits - 4)) for _ in range(64)]
    rates = {}
    for name, fn, reps in [("dec_per_s", lambda i: key.decrypt(cts[i % 64]), 200),
                           ("add_per_s", lambda i: pub.add(cts[i % 64], cts[(i + 1) % 64]), 20000),
                           ("shift139_per_s", lambda i: pub.shift(cts[i % 64], 139), 1000),
                           ("sub_per_s", lambda i: pub.sub(cts[i % 64], cts[(i + 1) % 64]), 2000)]:
        best = 0.0
        for _ in range(3):
            t0 = time.perf_counter()
            for i in range(reps // 3):
                fn(i)
            best = max(best, (reps // 3) / (time.perf_counter() - t0))
        rates[name] = best
    out.update(rates)
    out["bytes_per_ct"] = pub.ct_bytes
    return out


# ---------------------------------------------------------------------------------- arms
def _run_arm(factory, params, conn):
    try:
        data = factory()
        t0 = time.perf_counter()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        a, ps = run_vertical(data, params)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter() - t0
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        cr = crypto_report(a)
        passive_t = {}
        for p in ps.values():
            for k, v in p.timings.items():
                passive_t[k] = passive_t.get(k, 0.0) + v
        hist_nodes = sum(1 for t in a.trees for nd in t["nodes"] if not nd["leaf"]) or 1
        res = {
            "wall_s": wall, "cpu_s": cpu, "crypto": cr, "active_t": dict(a.timings), "passive_t": passive_t,
            "per_tree_s": [v for k, v in sorted(a.timings.items()) if k.startswith("tree_")],
            "open_nodes": int(a.comm.get("hist_nodes", 0)), "split_nodes": hist_nodes,
            "n_train": int(a.n), "layout": a.layout_info, "accuracy": float(np.mean(a.test_pred == data.y_test)),
            "canonical": __import__("treeflare.vertical.driver", fromlist=["canonical"]).canonical(a, ps),
            "pred": a.test_pred.tolist(),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        }
        conn.send(res)
    except Exception as exc:  # report, don't hang the parent
        import traceback
        conn.send({"error": f"{type(exc).__name__}: {exc}", "tb": traceback.format_exc()})
    finally:
        conn.close()


def run_arm(factory, params):
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_run_arm, args=(factory, params, child))
    proc.start()
    child.close()
    res = parent.recv()
    proc.join()
    if "error" in res:
        raise RuntimeError(res["error"] + "\n" + res.get("tb", ""))
    return res


def modelled(res_mock: dict, rates: dict, obfuscation: str, key: str = "wall_s") -> float:
    """Time of an arm from its exact op counts (mock run) and measured single-core op costs."""
    c = res_mock["crypto"]
    enc = c["encryptions"] / rates[f"enc_per_s_{obfuscation}"]
    dec = c["decryptions"] / rates["dec_per_s"]
    add = c["additions"] / rates["add_per_s"]
    shift = c["shifts"] / rates["shift139_per_s"]
    return res_mock[key] + enc + dec + add + shift


# ---------------------------------------------------------------------------------- main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small data (3-4k rows), depth 3: minutes, not hours")
    ap.add_argument("--key-bits", type=int, default=2048)
    ap.add_argument("--obfuscation", choices=["full", "djn"], default="djn",
                    help="randomness for encryption, the same in every arm (default djn)")
    ap.add_argument("--workloads", default=None, help="comma list (default: all for --quick, else credit_gbdt_p1)")
    ap.add_argument("--arms", default="a,b,c,d")
    ap.add_argument("--model-slow-arms", default="", help="arms to model from op counts instead of timing (e.g. b,c)")
    ap.add_argument("--trees", type=int, default=1, help="GBDT trees per run (default 1)")
    ap.add_argument("--out", default=str(REPO / "scripts" / "results" / "vertical_bench"))
    ap.add_argument("--append", action="store_true", help="add rows to an existing CSV/JSON instead of replacing")
    args = ap.parse_args(argv)

    wl = workloads(args.quick)
    names = args.workloads.split(",") if args.workloads else (list(wl) if args.quick else ["credit_gbdt_p1"])
    for n in names:
        if n not in wl:
            ap.error(f"unknown workload {n!r}; known: {', '.join(wl)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results_json = out.with_suffix(".json")
    state = json.loads(results_json.read_text()) if args.append and results_json.is_file() else {"rows": []}
    print(f"load average {os.getloadavg()}; cores {os.cpu_count()}", flush=True)
    t0 = time.perf_counter()
    rates = micro(args.key_bits)
    print(f"micro ({time.perf_counter() - t0:.0f}s): " + ", ".join(
        f"{k}={v:,.0f}" for k, v in rates.items() if isinstance(v, float)), flush=True)
    prev = state.setdefault("micro", {}).get(str(args.key_bits), {})
    # header rates: the best burst over all runs (the machine is shared; see the load averages)
    state["micro"][str(args.key_bits)] = {k: max(v, prev.get(k, 0)) if isinstance(v, float) else v
                                          for k, v in rates.items()}
    state.setdefault("meta", []).append({"argv": sys.argv[1:], "loadavg": os.getloadavg(), "cores": os.cpu_count(),
                                          "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())})
    for name in names:
        desc, factory, over = wl[name]
        base = VerticalParams(key_bits=args.key_bits, obfuscation=args.obfuscation, workers=1, bins=32,
                              n_trees=args.trees if over["model"] == "gbdt" else 1,
                              allow_insecure_key=args.key_bits < 2048, **over)
        oracle = None
        for arm in args.arms.split(","):
            label, arm_over = ARMS[arm]
            params = replace(base, **arm_over)
            model_it = arm in args.model_slow_arms.split(",") and arm != "a"
            t = time.perf_counter()
            res = run_arm(factory, replace(params, scheme="mock") if model_it else params)
            if arm == "a":
                oracle = res
            same = None if oracle is None else (res["canonical"] == oracle["canonical"] and res["pred"] == oracle["pred"])
            row = {"workload": name, "description": desc, "arm": arm, "arm_label": label,
                   "timing": "modelled" if model_it else "measured", "key_bits": args.key_bits,
                   "obfuscation": args.obfuscation, "n_train": res["n_train"], "depth": base.max_depth,
                   "trees": base.n_trees, "wall_s": modelled(res, rates, args.obfuscation) if model_it else res["wall_s"],
                   "cpu_s": modelled(res, rates, args.obfuscation, "cpu_s") if model_it else res["cpu_s"],
                   "per_tree_s": (None if model_it else res["per_tree_s"]),
                   "identical_to_oracle": same, "accuracy": res["accuracy"], "peak_rss_mb": res["peak_rss_mb"],
                   "split_nodes": res["split_nodes"], "open_nodes": res["open_nodes"], "layout": res["layout"],
                   **{k: res["crypto"][k] for k in ("encryptions", "decryptions", "additions", "shifts",
                                                    "ciphertexts_to_passive", "ciphertexts_to_active",
                                                    "bytes_to_passive", "bytes_to_active", "values_per_ciphertext")},
                   "active_phases_s": None if model_it else {k: v for k, v in res["active_t"].items()
                                                             if not k.startswith("tree_")},
                   "passive_phases_s": None if model_it else res["passive_t"],
                   "micro_this_run": rates}
            nodes = max(1, res["open_nodes"])
            row["cts_to_active_per_node"] = row["ciphertexts_to_active"] / nodes
            state["rows"] = [r for r in state["rows"] if not (r["workload"] == name and r["arm"] == arm
                                                              and r["key_bits"] == args.key_bits)]
            state["rows"].append(row)
            print(f"{name:16s} ({arm}) {label:22s} {row['timing']:8s} {row['wall_s']:9.1f}s  enc {row['encryptions']:>8,}"
                  f"  dec {row['decryptions']:>7,}  ct->act/node {row['cts_to_active_per_node']:7.1f}"
                  f"  same={same}  rss {row['peak_rss_mb']:.0f}MB  [{time.perf_counter() - t:.0f}s real]", flush=True)
            results_json.write_text(json.dumps(state, indent=1, default=float))
            write_outputs(state, out)
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.csv')}")


def write_outputs(state, out: Path):
    rows = state["rows"]
    cols = ["workload", "arm", "arm_label", "timing", "key_bits", "obfuscation", "n_train", "depth", "trees",
            "wall_s", "cpu_s", "identical_to_oracle", "encryptions", "decryptions", "additions", "shifts",
            "ciphertexts_to_passive", "ciphertexts_to_active", "cts_to_active_per_node", "bytes_to_passive",
            "bytes_to_active", "values_per_ciphertext", "peak_rss_mb", "accuracy", "open_nodes"]
    with open(out.with_suffix(".csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols + ["active_phases_s", "passive_phases_s"])
        for r in rows:
            w.writerow([r.get(c) for c in cols] + [json.dumps(r.get("active_phases_s")),
                                                   json.dumps(r.get("passive_phases_s"))])
    lines = ["# Vertical packed-Paillier benchmark", ""]
    for kb, m in sorted(state.get("micro", {}).items()):
        lines.append(f"Single-core Paillier rates at {kb} bits (best of 3 bursts): "
                     f"encrypt {m['enc_per_s_full']:,.0f}/s (full r^n, CRT) / {m['enc_per_s_djn']:,.0f}/s (DJN, CRT, "
                     f"fixed-base table); decrypt {m['dec_per_s']:,.0f}/s (CRT); add {m['add_per_s']:,.0f}/s; "
                     f"shift by 2^139 {m['shift139_per_s']:,.0f}/s; {m['bytes_per_ct']} bytes per ciphertext.")
    for meta in state.get("meta", []):
        lines.append(f"- run {meta['time']}: `{' '.join(meta['argv'])}`, load average {tuple(round(x, 2) for x in meta['loadavg'])}, "
                     f"{meta['cores']} cores (shared)")
    lines += ["", "All arms: one core per party (workers=1), in-process driver, same keys size and obfuscation; "
              "'modelled' = exact op counts from a mock-cipher run of that arm x measured single-core op costs.", ""]
    hdr = ["workload", "arm", "timing", "rows", "time s", "speedup vs (b)", "CPU s", "speedup (CPU)",
           "time s, full r^n (modelled)",
           "speedup, full r^n", "enc", "dec", "adds", "ct->passive",
           "ct->active", "ct->active/node", "MB->passive", "MB->active", "vals/ct", "same as oracle", "peak RSS MB"]
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|" + "---|" * len(hdr))
    by_wl = {}
    for r in rows:
        by_wl.setdefault((r["workload"], r["key_bits"]), {})[r["arm"]] = r
    micro_by_kb = state.get("micro", {})

    def full_time(r):
        """The same run with the default full r^n randomness: swap the encryption cost (modelled)."""
        m = r.get("micro_this_run") or micro_by_kb.get(str(r["key_bits"]))
        if r["arm"] == "a" or not m or r["obfuscation"] == "full":
            return r["wall_s"]
        return r["wall_s"] + r["encryptions"] * (1 / m["enc_per_s_full"] - 1 / m["enc_per_s_djn"])

    for (wl, kb), arms in by_wl.items():
        b = arms.get("b")
        for arm in sorted(arms):
            r = arms[arm]
            sp = f"{b['wall_s'] / r['wall_s']:.2f}x" if b and r["wall_s"] and arm != "a" else ""
            spf = f"{full_time(b) / full_time(r):.2f}x" if b and r["wall_s"] and arm != "a" else ""
            cpu = r.get("cpu_s")
            spc = f"{b['cpu_s'] / cpu:.2f}x" if b and b.get("cpu_s") and cpu and arm != "a" else ""
            lines.append("| " + " | ".join(str(x) for x in [
                f"{r['description']} ({kb}b)", f"({arm}) {r['arm_label']}", r["timing"], f"{r['n_train']:,}",
                f"{r['wall_s']:.1f}", sp, "" if cpu is None else f"{cpu:.1f}", spc, f"{full_time(r):.1f}", spf, f"{r['encryptions']:,}", f"{r['decryptions']:,}", f"{r['additions']:,}",
                f"{r['ciphertexts_to_passive']:,}", f"{r['ciphertexts_to_active']:,}",
                f"{r['cts_to_active_per_node']:.1f}", f"{r['bytes_to_passive'] / 1e6:.2f}",
                f"{r['bytes_to_active'] / 1e6:.3f}", r["values_per_ciphertext"], r["identical_to_oracle"],
                f"{r['peak_rss_mb']:.0f}"]) + " |")
    lines.append("")
    lines.append("Per-phase seconds (measured arms): active = keygen, quantise_pack, encrypt, serialize, deserialize, "
                 "decrypt, unpack, split_search, partition, predict; passive (summed over parties) = binning, "
                 "deserialize, histogram, cumulate_compress, partition, predict.")
    lines.append("")
    for r in rows:
        if r.get("active_phases_s"):
            a = ", ".join(f"{k} {v:.1f}" for k, v in r["active_phases_s"].items() if v >= 0.05 and k != "total")
            p = ", ".join(f"{k} {v:.1f}" for k, v in r["passive_phases_s"].items() if v >= 0.05)
            lines.append(f"- {r['workload']} ({r['arm']}): active [{a}]; passive [{p}]")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
