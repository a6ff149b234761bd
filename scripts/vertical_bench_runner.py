"""One benchmark arm of scripts/bench_vertical.py, in its own process: run the in-process vertical
protocol on a saved dataset and print a JSON result on the last line of stdout.

It only uses the API that both today's package and the earlier one (the "legacy" arm, imported from
an extracted copy through PYTHONPATH) have: VerticalData, VerticalParams.from_dict, run_vertical,
crypto_report, canonical.

    python scripts/vertical_bench_runner.py DATA.npz PARAMS.json
"""
from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time

import numpy as np


def load_data(path):
    from treeflare.vertical import VerticalData

    z = np.load(path, allow_pickle=False)
    meta = json.loads(str(z["meta"]))
    k = meta["n_passive"]
    return VerticalData(
        X_active=z["Xa"], y=z["y"], X_passive=[z[f"Xp{i}"] for i in range(k)], X_active_test=z["Xat"],
        y_test=z["yt"], X_passive_test=[z[f"Xpt{i}"] for i in range(k)], names_active=meta["names_active"],
        names_passive=meta["names_passive"], n_classes=meta["n_classes"], ids_train=meta["ids_train"],
        ids_test=meta["ids_test"])


def main(argv):
    import treeflare
    from treeflare.vertical import VerticalParams, canonical, crypto_report, run_vertical

    data = load_data(argv[0])
    params = VerticalParams.from_dict(json.loads(open(argv[1]).read()))
    t0 = time.perf_counter()
    c0 = time.process_time()
    a, ps = run_vertical(data, params)
    wall = time.perf_counter() - t0
    trees = [float(v) for k, v in sorted(a.timings.items()) if k.startswith("tree_")]
    passive_t = {}
    for p in ps.values():
        for k, v in p.timings.items():
            passive_t[k] = passive_t.get(k, 0.0) + float(v)
    pred = np.asarray(a.test_pred, dtype=np.float64)
    score = np.asarray(a.test_score, dtype=np.float64)
    out = {
        "package": os.path.dirname(treeflare.__file__),
        "wall_s": wall, "main_cpu_s": time.process_time() - c0, "tree_s": trees,
        "per_tree_s": sum(trees) / max(1, len(trees)),
        "keygen_s": float(a.timings.get("keygen", 0.0)),
        "active_phases_s": {k: float(v) for k, v in a.timings.items() if not k.startswith("tree_")},
        "passive_phases_s": passive_t,
        "crypto": crypto_report(a),
        "layout": a.layout_info,
        "hist_nodes": int(a.comm.get("hist_nodes", 0)),
        "model_sha256": hashlib.sha256(canonical(a, ps).encode()).hexdigest(),
        "pred_sha256": hashlib.sha256(pred.tobytes() + score.tobytes()).hexdigest(),
        "pred": pred.tolist(), "score": score.tolist(),
        "peak_rss_mb_main": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
    }
    try:
        from treeflare.crypto import native          # absent in the earlier code
        out["native_kernel"] = native.status()
    except ImportError:
        out["native_kernel"] = "absent (earlier code)"
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
