"""The two references for the federated job, on the same federation folder and parameters.

* ``centralized``: one ``xgboost.train`` on the union of the sites' training data.
* ``native_distributed``: XGBoost's own distributed training -- its RabitTracker and one worker process per
  site, each reading only its own site folder (row split, or column split for a vertical federation).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from .encoding import dmatrix, federation_schema, federation_sites, global_test, is_vertical, load_site, union_train
from .metrics import score_booster


def centralized(root, params: dict, rounds: int, numeric: bool = False) -> dict:
    """Train on the union; return {"metrics", "train_s", "booster", "proba"}. ``numeric``: category codes as
    numbers (the treeflare engine's reference)."""
    import dataclasses

    import xgboost as xgb

    train = union_train(root)
    test = global_test(root)
    if numeric:
        train, test = (dataclasses.replace(a, feature_types=["q"] * len(a.feature_types)) for a in (train, test))
    n_classes = len(federation_schema(root).classes)
    dtrain = dmatrix(train)
    t0 = time.perf_counter()
    booster = xgb.train(params, dtrain, rounds)
    train_s = time.perf_counter() - t0
    metrics, proba = score_booster(booster, test, n_classes)
    return {"metrics": metrics, "train_s": train_s, "booster": booster, "proba": proba}


def _worker(spec: dict) -> None:
    """One rank of the native run (executed as ``python -m treeflare.xgb.baselines SPEC.json``)."""
    import json

    import xgboost as xgb

    rank, out_dir = spec["rank"], spec["out_dir"]
    t_start = time.time()
    if spec["communicator"] == "federated":
        from .fedserver import ClientTLS, communicator_args

        tls = spec["tracker"].get("tls")
        comm = communicator_args(spec["tracker"]["host"], spec["tracker"]["port"], spec["world"], rank,
                                 ClientTLS(**tls[spec["site"]]) if tls else None)
    else:
        comm = {"dmlc_communicator": "rabit", "dmlc_task_id": str(rank), **spec["tracker"]}
    with xgb.collective.CommunicatorContext(**comm):
        train, valid = load_site(spec["root"], spec["site"], vertical=spec["vertical"])
        if spec["vertical"] and train.y is None and spec["communicator"] == "rabit":
            # XGBoost's non-federated (rabit) column split needs the label on every worker: this baseline is
            # the trusted reference, so passive ranks read the label owner's (id-aligned) labels.
            owner_train, owner_valid = load_site(spec["root"], spec["label_owner"], vertical=True)
            train.y, valid.y = owner_train.y, owner_valid.y
        mode = xgb.core.DataSplitMode.COL if spec["vertical"] else xgb.core.DataSplitMode.ROW
        # as in NVFlare's client runner: evaluate on the site's validation and training data every round
        dtrain = dmatrix(train, data_split_mode=mode)
        dvalid = dmatrix(valid, data_split_mode=mode)
        t0 = time.time()
        booster = xgb.train(spec["params"], dtrain, spec["rounds"], evals=[(dvalid, "eval"), (dtrain, "train")],
                            verbose_eval=False)
        t1 = time.time()
        if rank == 0:
            booster.save_model(os.path.join(out_dir, "model.json"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump({"start": t_start, "train_start": t0, "train_end": t1}, fh)


def native_distributed(root, params: dict, rounds: int, *, timeout: float = 1800.0,
                       communicator: str = "rabit", tls_kits: dict | None = None) -> dict:
    """RabitTracker on 127.0.0.1 plus one worker process per site (each in its own process group).

    ``communicator="federated"`` runs XGBoost's own federated gRPC server instead of the tracker (the star
    topology the job's transports use, without NVFlare): the benchmark's floor for the federated protocol. The
    server is always stopped when this returns or raises. ``tls_kits`` ({"server": kit dir, "<site>": kit dir,
    ...}, e.g. a POC's) turns on mutual TLS with those startup kits' certificates (the server's name in its
    certificate must be ``localhost``, as in a POC).

    Returns {"metrics", "train_s" (first worker's xgb.train start to last one's end), "wall_s" (tracker start
    to all workers done, process start-up included), "booster", "proba"}.
    """
    import json
    import signal
    import subprocess
    import sys

    import xgboost as xgb
    from xgboost.tracker import RabitTracker

    root = str(Path(root).resolve())
    sites = federation_sites(root)
    vertical = is_vertical(root)
    n_classes = len(federation_schema(root).classes)
    world = len(sites)
    with tempfile.TemporaryDirectory(prefix="xgb_native_") as out_dir:
        t0 = time.perf_counter()
        if communicator == "federated":
            from .fedserver import ClientTLS, FederatedServer, ServerTLS, free_port

            port = free_port()
            server_tls = ServerTLS.from_kit(Path(tls_kits["server"]) / "startup") if tls_kits else None
            tracker = FederatedServer(world, port, server_tls, log_path=Path(out_dir, "server.log")).start()
            targs = {"host": "localhost", "port": port,
                     "tls": {s: ClientTLS.from_kit(Path(tls_kits[s]) / "startup").__dict__ for s in sites}
                     if tls_kits else None}
        else:
            tracker = RabitTracker(n_workers=world, host_ip="127.0.0.1", port=0, timeout=int(timeout))
            tracker.start()
            targs = tracker.worker_args()
        procs = []
        try:
            for r, s in enumerate(sites):
                spec = {"rank": r, "tracker": targs, "root": root, "site": s, "vertical": vertical,
                        "params": params, "rounds": rounds, "out_dir": out_dir, "label_owner": sites[0],
                        "communicator": communicator, "world": world}
                path = Path(out_dir, f"spec{r}.json")
                path.write_text(json.dumps(spec))
                procs.append(subprocess.Popen([sys.executable, "-m", "treeflare.xgb.baselines", str(path)],
                                              start_new_session=True))
            deadline = time.monotonic() + timeout
            for p in procs:
                p.wait(max(1.0, deadline - time.monotonic()))
            if communicator != "federated":
                tracker.wait_for(timeout=60)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            if communicator == "federated":
                tracker.stop()  # xgboost's federated server never ends on its own
        wall_s = time.perf_counter() - t0
        if any(p.returncode != 0 for p in procs):
            raise RuntimeError(f"native distributed XGBoost: worker exit codes {[p.returncode for p in procs]}")
        stamps = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
        booster = xgb.Booster(model_file=os.path.join(out_dir, "model.json"))
    train_s = max(s["train_end"] for s in stamps) - min(s["train_start"] for s in stamps)
    metrics, proba = score_booster(booster, global_test(root), n_classes)
    return {"metrics": metrics, "train_s": train_s, "wall_s": wall_s, "booster": booster, "proba": proba}


if __name__ == "__main__":
    import json
    import sys

    _worker(json.loads(Path(sys.argv[1]).read_text()))
