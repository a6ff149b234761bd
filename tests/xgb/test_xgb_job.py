"""jobs/xgb_histogram end to end in the NVFlare simulator (small data, a few rounds, 3 sites): the direct transport
(the default) horizontal binary and multiclass, the flare transport once, and bad --xgb-port values. Vertical mode,
which now starts with a PSI phase: tests/xgb/test_xgb_vertical_psi.py.

Each run is a subprocess with its own HOME, FLARE log level WARNING, and everything it started is killed
afterwards (tests/flare_helpers.py). Results are checked from the files the run wrote, not from return codes.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from flare_helpers import run_script

pytest.importorskip("tensorboard")  # a hard import of nvflare.app_opt.xgboost
xgb = pytest.importorskip("xgboost")

JOB = "jobs/xgb_histogram/job.py"


def small_csv(path, n=900, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5))
    colour = rng.choice(["red", "green", "blue"], n)
    logit = x[:, 0] - x[:, 1] + (colour == "red") * 1.2 + 0.5 * rng.normal(size=n)
    y = (logit > 0.3).astype(int)
    with open(path, "w") as fh:
        fh.write("x0,x1,x2,x3,x4,colour,label\n")
        for row, c, t in zip(x, colour, y):
            fh.write(",".join(f"{v:.4f}" for v in row) + f",{c},{t}\n")
    return path


def run_job(tmp_path, *args, timeout=240):
    ws = tmp_path / "ws"
    port = [] if "--xgb-port" in args else ["--xgb-port", "0"]  # any free port: never clash with another run
    proc = run_script(JOB, [*args, *port, "--sites", "3", "--workspace", str(ws), "--log-level", "WARNING"],
                      tmp_path, timeout=timeout)
    report_path = ws / "report.json"
    assert report_path.is_file(), f"no report.json\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    return json.loads(report_path.read_text()), ws, proc


def check_direct(report, ranks=None):
    """The direct transport really ran: plain TCP in the simulator, ranks fixed by the job, every site replied,
    the federated server was stopped and left nothing listening."""
    from treeflare.xgb.fedserver import listening

    t = report["transport"]
    assert report["params"]["transport"] == "direct" and t["name"] == "direct"
    assert t["ranks"] == (ranks or {"site-1": 0, "site-2": 1, "site-3": 2})
    assert t["federated_server"]["tls"] is False and t["federated_server"]["bind"].startswith("0.0.0.0:")
    assert t["federated_server_stopped"] is True
    assert not listening(t["federated_server"]["port"])
    assert sorted(t["sites"]) == ["site-1", "site-2", "site-3"]
    assert all(s["rounds"] == report["params"]["rounds"] for s in t["sites"].values())
    assert report["timings_s"]["flare_train"] > 0
    assert all(n >= 1 for n in t["heartbeats"].values()), t["heartbeats"]  # sites' heartbeats reach the server


def centralized_reference(ws, report):
    """An independent centralized xgboost.train on the same federation files and parameters."""
    from treeflare.xgb import global_test, score_booster, union_train
    from treeflare.xgb.encoding import dmatrix

    train, test = union_train(ws / "federation"), global_test(ws / "federation")
    booster = xgb.train(report["params"]["xgb_params"], dmatrix(train), report["params"]["rounds"])
    return score_booster(booster, test, report["params"]["n_classes"])


@pytest.mark.flare
def test_horizontal_binary_report_matches_centralized(tmp_path):
    csv = small_csv(tmp_path / "small.csv")
    report, ws, proc = run_job(tmp_path, "--csv", str(csv), "--label", "label", "--rounds", "5", "--max-depth", "3",
                            "--eta", "0.3", "--baselines", "centralized", "--progress")
    assert report["job"] == "xgb_histogram" and report["mode"] == "horizontal" and report["n_sites"] == 3
    assert set(report["global"]) == {"auc", "accuracy", "logloss"}
    assert set(report["baselines"]) == {"centralized", "native_distributed"}
    assert report["params"]["xgb_params"]["nthread"] == 1 and report["params"]["early_stopping_rounds"] == 0
    ref_metrics, ref_proba = centralized_reference(ws, report)
    for k, v in ref_metrics.items():  # the report's centralized baseline is what xgboost.train gives
        assert report["baselines"]["centralized"][k] == pytest.approx(v, abs=1e-9)
    # federated histograms on 3 shards: quantile cuts are merged sketches, so close, not identical
    assert abs(report["global"]["auc"] - ref_metrics["auc"]) < 0.02
    assert report["global"]["auc"] > 0.75
    # the global model is on disk and scores as reported
    booster = xgb.Booster(model_file=str(ws / "model.json"))
    assert booster.num_boosted_rounds() == 5
    # per-round metrics went to TensorBoard through FLARE's experiment tracking
    assert list((ws / "tb_events").rglob("events.out.tfevents.*"))
    assert "NVFlare horizontal (direct)" in proc.stdout  # the short table
    check_direct(report)
    assert report["transport"]["models_identical"] is True  # every rank ends with the same model
    # horizontal sites hold different rows by design: no PSI phase ran, at the server or at any site
    from treeflare.flare.psi.protocol import RESULT_FILE as PSI_RESULT_FILE

    assert "psi" not in report and "psi_min_rows" not in report["params"]
    flare_job = ws / "flare" / "xgb_histogram"
    assert flare_job.is_dir() and not list(flare_job.rglob(PSI_RESULT_FILE))
    assert not list(flare_job.rglob("intersection.json"))
    configs = list(flare_job.rglob("config_fed_*.json"))
    assert configs and not [c for c in configs if "treeflare.flare.psi" in c.read_text()]
    # progress from the server's side, one line per round, printed while FLARE ran (--progress: stdout is a pipe)
    rounds = [line for line in proc.stdout.splitlines() if line.startswith("round ")]
    assert [r.split()[1] for r in rounds] == [f"{i}/5" for i in range(1, 6)] and " eval auc 0." in rounds[-1]
    assert proc.stdout.index("round 5/5") < proc.stdout.index("NVFlare horizontal (direct)")
    # the workspace predicts on raw rows: scripts/predict.py on the server's test set gives the report's model
    predict = run_script("scripts/predict.py", ["--model", str(ws), "--csv", str(ws / "federation" / "server" /
                                                "test.csv"), "--out", str(tmp_path / "p.csv")], tmp_path)
    assert predict.returncode == 0, predict.stderr
    import pandas as pd
    from treeflare.xgb import global_test, score_booster

    _, proba = score_booster(booster, global_test(ws / "federation"), 2)
    out = pd.read_csv(tmp_path / "p.csv")
    assert list(out.columns) == ["predicted", "p_0", "p_1"] and len(out) == report["n_test"]
    assert abs(out["p_1"].to_numpy() - proba).max() < 1e-6


@pytest.mark.flare
def test_multiclass_car(tmp_path):
    report, ws, _ = run_job(tmp_path, "--dataset", "car", "--rounds", "3", "--max-depth", "4", "--eta", "0.5",
                            "--baselines", "centralized")
    assert report["params"]["n_classes"] == 4 and report["params"]["xgb_params"]["num_class"] == 4
    assert report["params"]["xgb_params"]["objective"] == "multi:softprob"
    assert set(report["global"]) == {"accuracy", "macro_f1", "mlogloss"}
    ref_metrics, ref_proba = centralized_reference(ws, report)
    assert ref_proba.shape[1] == 4
    # car is all-categorical with few levels: federated hist cuts equal the centralized ones
    for k in ("accuracy", "mlogloss"):
        assert report["global"][k] == pytest.approx(ref_metrics[k], abs=1e-3)
    assert report["global"]["accuracy"] > 0.75
    check_direct(report)


@pytest.mark.flare
def test_flare_transport_relays_through_nvflare(tmp_path):
    csv = small_csv(tmp_path / "small.csv")
    report, ws, _ = run_job(tmp_path, "--csv", str(csv), "--label", "label", "--rounds", "3", "--max-depth", "3",
                            "--transport", "flare", "--baselines", "centralized")
    assert report["params"]["transport"] == "flare" and report["transport"]["name"] == "flare"
    assert set(report["global"]) == {"auc", "accuracy", "logloss"} and report["global"]["auc"] > 0.75
    assert xgb.Booster(model_file=str(ws / "model.json")).num_boosted_rounds() == 3
    assert list((ws / "tb_events").rglob("events.out.tfevents.*"))


@pytest.mark.parametrize("port,message", [("70000", "must be a port number in 1..65535"),
                                          ("-1", "must be a port number"), ("busy", "is already in use")])
def test_bad_xgb_port_fails_before_any_site_starts(tmp_path, port, message):
    import socket

    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        value = str(busy.getsockname()[1]) if port == "busy" else port
        ws = tmp_path / "ws"
        proc = run_script(JOB, ["--dataset", "car", "--xgb-port", value, "--workspace", str(ws)], tmp_path,
                          timeout=120)
    assert proc.returncode != 0
    assert "--xgb-port" in proc.stderr and message in proc.stderr, proc.stderr[-2000:]
    assert not (ws / "flare").exists() and not (ws / "report.json").exists()  # nothing started


def test_encrypt_fails_clearly_and_never_trains(tmp_path):
    ws = tmp_path / "ws"
    proc = run_script(JOB, ["--dataset", "car", "--encrypt", "--workspace", str(ws)], tmp_path, timeout=120)
    assert proc.returncode != 0
    assert "treeflare vertical" in proc.stderr and "--encrypt" in proc.stderr
    assert not (ws / "report.json").exists() and not (ws / "flare").exists()


@pytest.mark.flare
def test_unreachable_xgb_port_fails_naming_host_and_port(tmp_path):
    """Sites told to reach the XGBoost server at an address that does not answer: a clear failure within the
    connect timeout, in the report and on the command line, and the federated server stopped."""
    ws = tmp_path / "ws"
    t = time.perf_counter()
    proc = run_script(JOB, ["--dataset", "car", "--rounds", "2", "--baselines", "", "--sites", "3", "--xgb-port",
                            "0", "--xgb-server-host", "10.255.255.1", "--xgb-connect-timeout", "3",
                            "--workspace", str(ws)], tmp_path, timeout=180)
    assert proc.returncode != 0
    report = json.loads((ws / "report.json").read_text())
    assert report["status"] == "failed" and report["federated_server_stopped"] is True
    assert "cannot reach the XGBoost federated server at 10.255.255.1:" in report["error"], report["error"]
    assert "within 3 s" in report["error"] and "10.255.255.1" in proc.stderr
    assert time.perf_counter() - t < 90


@pytest.mark.parametrize("args,message", [
    (["--sites", "2"], "needs --sites >= 3"),
    (["--mode", "vertical"], "horizontal federations only"),
    (["--workers", "dask://scheduler:8786"], "$TREEFLARE_XGB_WORKERS"),
])
def test_engine_treeflare_refuses_what_it_cannot_do_before_anything_starts(tmp_path, args, message):
    ws = tmp_path / "ws"
    proc = run_script(JOB, ["--dataset", "car", "--engine", "treeflare", *args, "--workspace", str(ws)], tmp_path,
                      timeout=120)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
    assert not (ws / "flare").exists() and not (ws / "report.json").exists()
