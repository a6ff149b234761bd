"""Jobs on a real local POC system driven by scripts/poc.sh (up K | run JOB | down), as a user would.

One POC for the module, started under the machine-wide FLARE lock with a temporary HOME and POC workspace, on a
free port instead of 8002 (TREEFLARE_POC_PORT), and stopped in teardown even when a test fails.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from flare_helpers import REPO, flare_lock, free_port, isolated_env, kill_token, processes_with_token, run_cmd

pytestmark = pytest.mark.flare

POC_SH = str(REPO / "scripts" / "poc.sh")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


@pytest.fixture(scope="module")
def poc(tmp_path_factory):
    root = tmp_path_factory.mktemp("poc")
    token = uuid.uuid4().hex
    env = isolated_env(root, token)
    port = free_port()  # not 8002: a developer's own POC may be running
    env.update({"TREEFLARE_POC_ROOT": str(root / "system"), "TREEFLARE_FLARE_LOCK_HELD": "1",
                "TREEFLARE_POC_PORT": str(port), "PYTHON": sys.executable})
    timings = {}
    with flare_lock():
        try:
            t = time.perf_counter()
            up = run_cmd(["bash", POC_SH, "up", "3"], env, timeout=240)
            timings["up"] = time.perf_counter() - t
            assert up.returncode == 0, up.stderr[-3000:] + up.stdout[-2000:]
            yield {"root": root, "env": env, "timings": timings, "up": up, "port": port}
        finally:
            t = time.perf_counter()
            down = run_cmd(["bash", POC_SH, "down"], env, timeout=120)
            timings["down"] = time.perf_counter() - t
            left = processes_with_token(token)
            kill_token(token)
            print(f"\nPOC timings: {timings}")
            assert down.returncode == 0, down.stderr[-2000:]
            assert not left, f"processes left behind after poc.sh down: {left}"
            assert _port_free(port)


def test_poc_up_and_status(poc):
    assert "site-1, site-2, site-3" in poc["up"].stdout and f"localhost:{poc['port']}" in poc["up"].stdout
    st = run_cmd(["bash", POC_SH, "status"], poc["env"], timeout=60)
    assert st.returncode == 0, st.stderr
    assert "connected: ['site-1', 'site-2', 'site-3']" in st.stdout
    # isolated: the POC's own HOME got the nvflare config, not the user's
    assert (poc["root"] / "system" / "home" / ".nvflare" / "config.conf").is_file()
    assert not (poc["root"] / "home" / ".nvflare").exists()


def test_poc_refuses_a_second_system(poc):
    again = run_cmd(["bash", POC_SH, "up", "2"], poc["env"], timeout=60)
    assert again.returncode != 0 and "already running" in again.stderr


def test_icdta4fl_through_poc(poc):
    """scripts/poc.sh run icdta4fl: the same outputs in --workspace as a simulator run, plus the server result
    and each site's run folder gathered under flare/poc_result/."""
    ws = poc["root"] / "icdta4fl"
    t = time.perf_counter()
    proc = run_cmd(["bash", POC_SH, "run", "icdta4fl", "--algorithm", "cart", "--dataset", "car", "--sites", "3",
                    "--partition", "iid", "--seed", "1", "--max-depth", "4", "--task-timeout", "60",
                    "--workspace", str(ws)], poc["env"], timeout=240)
    poc["timings"]["icdta4fl"] = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    report = json.loads((ws / "report.json").read_text())
    assert report["job"] == "icdta4fl" and report["dataset"] == "car" and report["params"]["env"] == "poc"
    assert report["n_sites"] == 3 and report["dropped_sites"] == {}
    assert set(report["sites"]) == {"site-1", "site-2", "site-3"}
    g = report["global"]
    assert 0.75 < g["accuracy"] <= 1.0 and g["n_leaves"] >= 2
    assert set(report["baselines"]) == {"centralized", "mean_local", "best_local"}
    # the POC's startup kits sign every site's masking key, and every site checked every certificate
    assert report["refinement"]["key_authentication"].startswith("certificates"), report["refinement"]
    assert len(report["refinement"]["adoption"]) == 1
    for name in ("global_tree.json", "rules.txt", "global_tree.png"):
        assert (ws / name).is_file(), name
    result = ws / "flare" / "poc_result"
    job_id = next(p.name for p in result.iterdir() if p.is_dir() and not p.name.startswith("site-"))
    assert (result / job_id / "workspace" / "icdta4fl_result.json").is_file()
    for site in ("site-1", "site-2", "site-3"):
        assert "icdta4fl_train" in (result / site / job_id / "log.txt").read_text()


def test_icdta4fl_on_the_sites_own_data_discovers_the_schema(poc, tmp_path):
    """No --dataset/--csv on a POC: the schema is discovered from the sites' files (--schema discover is the default
    there), written to schema.json, and the job trains on those files. The sites' CSVs differ in row order,
    column order and a rare value (3 rows at site-3), which stays out of the schema. Car's ordered columns are
    declared with --ordinal (discovery cannot know an order); lug_boot is left to be discovered as categorical."""
    from dataclasses import replace

    import pandas as pd

    from treeflare.data import Feature, load_dataset, prepare_federation, write_federation
    from treeflare.data.embedded import ORDINAL

    rare = "rare-value-4711"
    data = write_federation(prepare_federation(load_dataset("car"), n_sites=3, seed=2), tmp_path / "data")
    site2, site3 = data / "site-2" / "train.csv", data / "site-3" / "train.csv"
    pd.read_csv(site2, dtype=str).sample(frac=1.0, random_state=0).to_csv(site2, index=False)
    third = pd.read_csv(site3, dtype=str)
    third.loc[:2, "lug_boot"] = rare
    third[third.columns[::-1]].to_csv(site3, index=False)
    ws = poc["root"] / "icdta4fl_sites"
    t = time.perf_counter()
    ordinal = [f"{c}={'<'.join(levels)}" for c, levels in ORDINAL["car"].items() if c != "lug_boot"]
    proc = run_cmd(["bash", POC_SH, "run", "icdta4fl", "--label", "class", "--sites", "3", "--data-root", str(data),
                    *[a for spec in ordinal for a in ("--ordinal", spec)], "--max-depth", "4", "--task-timeout", "60",
                    "--workspace", str(ws)],
                   poc["env"], timeout=240)
    poc["timings"]["icdta4fl_discover"] = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    assert "schema discovery on site-1, site-2, site-3" in proc.stdout
    schema = json.loads((ws / "schema.json").read_text())
    car = load_dataset("car").schema
    expected = replace(car, features=tuple(Feature("lug_boot", "categorical", ("big", "med", "small"))
                                           if f.name == "lug_boot" else f for f in car.features), _index={})
    assert schema == {**expected.to_dict(), "discovery": schema["discovery"]}
    assert rare not in (ws / "schema.json").read_text()
    report = json.loads((ws / "report.json").read_text())
    assert report["params"]["env"] == "poc" and report["dataset"] == "the sites' own data"
    assert report["schema_source"]["schema"] == "discovered" and report["baselines"]["centralized"] is None
    assert report["dropped_sites"] == {} and set(report["sites"]) == {"site-1", "site-2", "site-3"}
    assert 0.75 < report["global"]["accuracy"] <= 1.0  # the server's test set is in --data-root here
    # the sites' own data: no partition settings; each site's score of the final tree on its validation rows
    assert report["partition"] == {"kind": "site-held"}
    scored = report["validation"]["final_tree"]["sites"]
    assert set(scored) == set(report["sites"]) and all(0 < v["accuracy"] <= 1 for v in scored.values())
    assert all(scored[s]["n_test"] == report["sites"][s]["n_test"] for s in scored)
    outputs = proc.stdout[proc.stdout.index("\noutputs:\n"):]  # every output named with where it went
    for name in ("report.json", "global_tree.json", "rules.txt", "global_tree.png", "schema.json"):
        assert str(ws / name) in outputs, name
    assert sum(info["n_train"] for info in report["sites"].values()) == \
        sum(info["n_rows"] for info in schema["discovery"]["sites"].values())
    # the refinement round ran on POC (real mTLS messaging): encrypted counts from all three sites
    assert report["refinement"]["status"] == "completed" and report["refinement"]["history"][0]["sites"] == 3
    # the operator's last step: the downloaded model predicts on new rows (raw values, no label column)
    new_rows = tmp_path / "new.csv"
    pd.read_csv(data / "server" / "test.csv", dtype=str).drop(columns=["class"]).head(20).to_csv(new_rows, index=False)
    out = tmp_path / "predictions.csv"
    pred = run_cmd([sys.executable, str(REPO / "scripts" / "predict.py"), "--model", str(ws), "--csv", str(new_rows),
                    "--out", str(out), "--explain"], poc["env"], timeout=60)
    assert pred.returncode == 0, pred.stderr[-2000:]
    table = pd.read_csv(out)
    assert len(table) == 20 and set(table["predicted"]) <= set(schema["classes"])
    assert {f"p_{c}" for c in schema["classes"]} <= set(table.columns) and table["explanation"].str.len().min() > 0


def _vertical_ready() -> bool:
    return (REPO / "jobs" / "vertical_tree" / "job.py").is_file() and \
        (REPO / "custom" / "treeflare" / "flare" / "vertical" / "executor.py").is_file()


@pytest.mark.skipif(not _vertical_ready(), reason="the vertical job has not landed")
def test_vertical_through_poc(poc, tmp_path):
    """The vertical packed-Paillier job (small data, small test key) through the same POC."""
    import numpy as np

    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 5))
    y = X[:, 0] + X[:, 3] - X[:, 4] + 0.3 * rng.normal(size=240) > 0
    lines = ["uid,f0,f1,f2,f3,f4,target"] + [
        f"u{i}," + ",".join(f"{v:.5f}" for v in X[i]) + f",{'yes' if y[i] else 'no'}" for i in range(240)]
    csv = tmp_path / "small.csv"
    csv.write_text("\n".join(lines) + "\n")
    ws = poc["root"] / "vertical"
    t = time.perf_counter()
    proc = run_cmd(["bash", POC_SH, "run", "vertical_tree", "--model", "gbdt", "--trees", "1", "--csv", str(csv),
                    "--label", "target", "--id", "uid", "--passive", "2", "--max-depth", "2", "--bins", "8",
                    "--key-bits", "512", "--allow-insecure-key", "--workers", "1", "--task-timeout", "120",
                    "--workspace", str(ws)], poc["env"], timeout=300)
    poc["timings"]["vertical"] = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    r = json.loads((ws / "report.json").read_text())
    assert r["job"] == "vertical_tree" and r["n_sites"] == 3
    assert r["sites"] == {"active": "site-1", "passive": ["site-2", "site-3"]}
    g = r["global"]
    assert 0.6 < g["accuracy"] <= 1 and 0.6 < g["auc"] <= 1
    assert r["crypto"]["scheme"] == "paillier" and r["crypto"]["key_bits"] == 512


def test_run_without_poc_is_a_clear_error(tmp_path):
    env = isolated_env(tmp_path, uuid.uuid4().hex)
    env["TREEFLARE_POC_ROOT"] = str(tmp_path / "nothing")
    proc = run_cmd(["bash", POC_SH, "run", "icdta4fl", "--dataset", "car"], env, timeout=60)
    assert proc.returncode == 2 and "no POC running" in proc.stderr and "scripts/poc.sh up" in proc.stderr
    proc = run_cmd(["bash", POC_SH, "run", "no_such_job"], env, timeout=60)
    assert proc.returncode == 2 and "no job 'no_such_job'" in proc.stderr
    proc = run_cmd(["bash", POC_SH, "up", "zero"], env, timeout=60)
    assert proc.returncode == 2 and "usage" in proc.stderr
    assert os.environ.get("HOME") != env["HOME"]
