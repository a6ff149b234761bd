"""End to end: the vertical packed-Paillier job in the FLARE simulator (small data, small key)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from treeflare.vertical.prediction import model_id

import flare_helpers
from flare_helpers import run_script

pytestmark = pytest.mark.flare


def _csv(path, n=240, seed=0, regression=False):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    z = X[:, 0] + X[:, 3] - X[:, 4] + 0.3 * rng.normal(size=n)
    lab = [f"{1e6 * v:.1f}" for v in z] if regression else ["yes" if v > 0 else "no" for v in z]
    lines = ["uid,f0,f1,f2,f3,f4,target"]
    lines += [f"u{i}," + ",".join(f"{v:.5f}" for v in X[i]) + f",{lab[i]}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


ARGS = ["--label", "target", "--id", "uid", "--passive", "2", "--max-depth", "2", "--bins", "8",
        "--key-bits", "512", "--allow-insecure-key", "--workers", "1", "--min-rows-node", "5"]


def test_vertical_job_end_to_end(tmp_path):
    """GBDT with 3 parties at 70% overlap (issue 22: PSI first, the model equal to the oracle on the intersection
    rows), then a prediction run whose new rows also overlap partly: the rows all parties hold are scored."""
    csv = _csv(tmp_path / "small.csv")
    ws = tmp_path / "ws"
    proc = run_script("jobs/vertical_tree/job.py",
                      ["--model", "gbdt", "--trees", "1", "--csv", str(csv), *ARGS, "--workspace", str(ws),
                       "--progress", "--overlap", "0.7"], tmp_path, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((ws / "report.json").read_text())
    assert r["job"] == "vertical_tree" and r["model"] == "gbdt" and r["dataset"] == "small"
    # one progress line per layer while FLARE ran, before the results table
    assert "tree 1/1, layer 1/2  elapsed" in proc.stdout and "tree 1/1, layer 2/2" in proc.stdout
    assert proc.stdout.index("tree 1/1, layer 1/2") < proc.stdout.index("global test set")
    assert r["objective"] == "binary" and r["baseline_xgboost"]["settings"]["max_depth"] == 2
    assert 0.6 < r["baseline_xgboost"]["global"]["accuracy"] <= 1
    assert r["n_sites"] == 3 and r["sites"] == {"active": "site-1", "passive": ["site-2", "site-3"]}
    assert r["identical_to_oracle"] is True
    p1 = r["psi"]["parties"]["site-1"]
    assert r["n_train"] == p1["rows_after"]["train"] < p1["rows_before"]["train"]     # the intersection only
    g = r["global"]
    assert 0.6 < g["accuracy"] <= 1 and 0 < g["macro_f1"] <= 1 and 0.6 < g["auc"] <= 1
    c = r["crypto"]
    for k in ("encryptions", "decryptions", "additions", "ciphertexts_to_passive", "ciphertexts_to_active",
              "bytes_to_passive", "bytes_to_active", "key_bits", "values_per_ciphertext"):
        assert k in c
    assert c["scheme"] == "paillier" and c["key_bits"] == 512 and c["values_per_ciphertext"] >= 2
    assert c["native_kernel"].startswith(("on", "off"))          # which arithmetic the key holder used
    assert c["encryptions"] == r["n_train"] and c["ciphertexts_to_passive"] == 2 * r["n_train"]
    assert r["params"]["key_bits"] == 512 and r["params"]["packing"] is True
    assert r["timings_s"]["active_encrypt"] > 0 and r["timings_s"]["passive_histogram"] > 0
    models = {p.name for p in (ws / "models").iterdir()}
    assert {"site-1_active_model.json", "site-2_passive_model.json", "site-3_passive_model.json"} <= models
    active = json.loads((ws / "models" / "site-1_active_model.json").read_text())
    for tree in active["trees"]:
        for nd in tree["nodes"]:
            if not nd["leaf"] and nd["owner"] != "site-1":
                assert "threshold" not in nd and "feature" not in nd and "split_id" in nd
    # the server's view holds no model, labels or thresholds
    server = json.loads(next((ws / "flare").rglob("vertical_result.json")).read_text())
    assert server["status"] == "completed" and '"nodes"' not in json.dumps(server)

    # predictions on new rows: a federated job in which each party loads only its own part; here the
    # training CSV's rows, which hold the training run's test rows
    wp = tmp_path / "wp"
    proc = run_script("jobs/vertical_tree/job.py", ["--predict", str(ws), "--csv", str(csv), "--workspace",
                                                     str(wp), "--workers", "1", "--overlap", "0.7"], tmp_path,
                      timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rp = json.loads((wp / "report.json").read_text())
    new_ids = {s: set(pd.read_csv(wp / "predict_data" / s / "predict.csv", dtype={"uid": str})["uid"])
               for s in ["site-1", "site-2", "site-3"]}
    shared = set.intersection(*new_ids.values())
    assert rp["status"] == "completed" and rp["mode"] == "predict" and rp["n_rows"] == len(shared) < 240
    assert rp["n_unscored"] == len(new_ids["site-1"]) - len(shared) > 0         # the active party's rows left out
    assert f"{rp['n_unscored']} of site-1's {len(new_ids['site-1'])} rows not scored" in proc.stdout
    assert rp["psi"]["parties"]["site-2"]["rows_after"] == {"predict": len(shared)}
    assert rp["model"]["dir"] == str(ws) and rp["model"]["model"] == "gbdt" and rp["model"]["n_trees"] == 1
    assert rp["model"]["model_id"] == model_id(active) and rp["predictions"] == "predictions.csv"
    pred = pd.read_csv(wp / "predictions.csv", dtype={"uid": str}).set_index("uid")
    assert list(pred.columns) == ["predicted", "p_no", "p_yes"] and set(pred.index) == shared
    trained = json.loads((ws / "models" / "site-1_test_predictions.json").read_text())
    # the training run's test rows among the scored ones: the same predictions (the oracle's, see above)
    both = [i for i in trained["ids"] if i in shared]
    assert len(both) >= 5
    at = {i: k for k, i in enumerate(trained["ids"])}
    trained = {key: [trained[key][at[i]] for i in both] for key in ("pred", "score")}
    rows = pred.loc[both]
    assert list(rows["predicted"]) == [active["schema"]["classes"][k] for k in trained["pred"]]
    assert np.array_equal(rows["p_yes"].to_numpy(), np.asarray(trained["score"]))      # bit for bit
    for site, own in [("site-1", "vertical_active_model.json"), ("site-2", "vertical_passive_model.json"),
                      ("site-3", "vertical_passive_model.json")]:
        assert sorted(p.name for p in (wp / "predict_data" / site).iterdir()) == ["predict.csv", own]
    server = json.loads(next((wp / "flare").rglob("vertical_result.json")).read_text())
    assert server["status"] == "completed" and server["mode"] == "predict"
    assert "threshold" not in json.dumps(server) and '"p_yes"' not in json.dumps(server)


def test_vertical_job_refused_key_fails_cleanly(tmp_path, monkeypatch):
    """A passive site whose policy demands 2048-bit keys refuses the 512-bit key: clear failure, rc 1."""
    csv = _csv(tmp_path / "small.csv", n=120)
    ws = tmp_path / "ws"
    orig = flare_helpers.isolated_env

    def env_with_policy(tmp, token):
        env = orig(tmp, token)
        env["TREEFLARE_VERTICAL_MIN_KEY_BITS"] = "2048"
        return env

    monkeypatch.setattr(flare_helpers, "isolated_env", env_with_policy)
    proc = run_script("jobs/vertical_tree/job.py",
                      ["--model", "tree", "--csv", str(csv), *ARGS, "--workspace", str(ws)], tmp_path, timeout=150)
    assert proc.returncode == 1
    assert "below this site's minimum" in proc.stderr
    r = json.loads((ws / "report.json").read_text())
    assert r["status"] == "failed" and "2048" in r["error"]


def test_vertical_regression_job_from_a_numeric_label(tmp_path):
    """A numeric label with many values: squared error chosen from the label, large targets (~1e6), RMSE/R2 in
    report.json beside XGBoost with the same settings, and the model equal to the plaintext oracle."""
    csv = _csv(tmp_path / "reg.csv", n=200, regression=True)
    ws = tmp_path / "ws"
    proc = run_script("jobs/vertical_tree/job.py",
                      ["--model", "gbdt", "--trees", "2", "--csv", str(csv), *ARGS, "--workspace", str(ws)],
                      tmp_path, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((ws / "report.json").read_text())
    assert r["objective"] == "squared_error" and r["params"]["objective"] == "squared_error"
    assert r["identical_to_oracle"] is True
    g, b = r["global"], r["baseline_xgboost"]["global"]
    assert set(g) == {"rmse", "mae", "r2"} and g["r2"] > 0.15 and b["r2"] > 0.15 and abs(g["r2"] - b["r2"]) < 0.2
    assert r["layout"]["widths"][0] > 53 + 19          # the residual slot holds ~1e6-sized targets
    assert "rmse" in proc.stdout and "XGBoost" in proc.stdout
