"""End to end: the ICDTA4FL job in the FLARE simulator, and its exported job folder."""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig

import pytest

from data_helpers import set_cell
from flare_helpers import run_script
from treeflare.icdta4fl.pipeline import DEFAULT_MAX_LEAVES

pytestmark = pytest.mark.flare


# seed 4: on seed 1 the refinement grows two levels under a same-class split of the one-round tree (issue 24) and
# the adopt check refuses the result, 0.7 validation points lower; this test is about a round that is adopted
CAR = ["--dataset", "car", "--sites", "3", "--partition", "iid", "--seed", "4"]
# site-2 has 8 rows of class vgood whose safety is blank: scikit-learn splits these off with a threshold of +inf
MISSING_SITE, MISSING_ROWS = "site-2", 8


def _blank_safety(train_csv):
    lines = train_csv.read_text().splitlines()
    header = lines[0].split(",")
    rows = [i for i, line in enumerate(lines) if i and line.split(",")[-1] == "vgood"][:MISSING_ROWS]
    for i in rows:
        set_cell(train_csv, i + 1, header.index("safety"), "")
    return len(rows)


@pytest.fixture(scope="module")
def car_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("icdta4fl")
    ws = tmp / "ws"
    # the sites read their own copy of the federation (--data-root), in which one site has missing cells
    sites = tmp / "sites"
    prep = run_script("scripts/prepare_data.py", [*CAR, "--out", str(sites)], tmp, timeout=60)
    assert prep.returncode == 0, prep.stderr
    assert _blank_safety(sites / MISSING_SITE / "train.csv") == MISSING_ROWS
    proc = run_script("jobs/icdta4fl/job.py",
                      ["--algorithm", "cart", *CAR, "--max-depth", "4", "--workspace", str(ws), "--progress",
                       "--data-root", str(sites)], tmp, timeout=240)
    return proc, ws


def test_report_content(car_run):
    proc, ws = car_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((ws / "report.json").read_text())
    assert report["job"] == "icdta4fl" and report["algorithm"] == "cart" and report["dataset"] == "car"
    assert report["partition"] == {"kind": "iid", "alpha": None, "seed": 4}
    # site-2's missing cells are routed as its tree learned them: its tree is valid and the site is kept
    assert report["n_sites"] == 3 and not report["dropped_sites"]
    assert MISSING_SITE in report["sites"] and report["sites"][MISSING_SITE]["n_train"] > 0
    assert 1 <= len(report["selected_sites"]) <= 3
    assert set(report["selected_sites"]) <= set(report["sites"])
    assert set(report["thresholds"]) >= {"accuracy", "macro_f1"}
    g = report["global"]
    # Car is easy: a depth-4 tree on ~1,000 rows gets well past the 70% majority class.
    assert 0.75 < g["accuracy"] <= 1.0 and 0.0 < g["macro_f1"] <= 1.0
    assert g["n_leaves"] >= 2 and g["depth"] >= 1
    for site, info in report["sites"].items():
        assert info["n_train"] > 0 and info["n_test"] > 0
        assert 0 <= info["local"]["accuracy"] <= 1 and 0 <= info["global"]["accuracy"] <= 1
    b = report["baselines"]
    assert set(b) == {"centralized", "mean_local", "best_local"}
    assert b["best_local"]["macro_f1"] >= b["mean_local"]["macro_f1"]
    assert abs(b["centralized"]["accuracy"] - g["accuracy"]) < 0.15
    # the default refinement (growth from the root) ran on the 3 sites' masked counts, and the paper's tree is kept
    # beside it
    r = report["refinement"]
    assert r["status"] == "completed" and r["grow_from"] == "root" and r["adoption"][-1]["adopted"]
    assert 2 <= r["rounds_done"] == len(r["rounds"]) <= r["rounds_requested"] == 8
    assert all(e["sites"] == 3 and e["bytes_per_site"] > 0 for e in r["rounds"])
    assert r["cost"]["bytes_per_site"] == sum(e["bytes_per_site"] for e in r["rounds"])
    assert r["key_authentication"].startswith("none: keys unauthenticated")  # the simulator has no startup kits
    one = report["one_round"]
    assert one["n_leaves"] >= 1 and 0.7 < one["accuracy"] <= 1
    assert g["accuracy"] >= one["accuracy"] - 0.02  # more data behind every leaf; held-out noise aside
    # the depth budget of growth from the root is its rounds (the one-round tree's is the aggregation's)
    assert g["n_leaves"] <= report["aggregation"]["max_leaves"] and g["depth"] <= r["max_depth"] == 8
    assert report["aggregation"]["max_leaves"] == DEFAULT_MAX_LEAVES  # the pipeline's one default reaches the job
    assert f"global (ICDTA4FL, grown from the root in {r['rounds_done']} rounds)" in proc.stdout
    assert "one-round tree (the paper's)" in proc.stdout
    assert str(ws / "report.json") in proc.stdout
    # progress lines, printed while FLARE ran (--progress: stdout is not a terminal here), before the table
    for line in ("local training: 3/3 sites replied", "peer scoring: 3/3 sites replied", "aggregation: ",
                 "refinement round 1: masked counts: 3/3 sites replied", "refinement round 1/8: grown to 2 leaves",
                 f"refinement round {r['rounds_done']}/8: "):
        assert line in proc.stdout, line
    assert proc.stdout.index("local training: 3/3") < proc.stdout.index("model (global test set)")


def test_artifacts(car_run):
    proc, ws = car_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    from treeflare.icdta4fl.model import GlobalTree

    model = GlobalTree.load_json(ws / "global_tree.json")
    report = json.loads((ws / "report.json").read_text())
    assert model.get_n_leaves() == report["global"]["n_leaves"]
    rules = (ws / "rules.txt").read_text()
    assert rules.strip() and any(c in rules for c in ("unacc", "acc"))
    assert (ws / "global_tree.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (ws / "report.html").read_text()  # the run's page: its own tree and accuracy (report_html has the rest)
    assert page.startswith("<!DOCTYPE html>") and f"{report['global']['accuracy']:.4f}" in page
    one = GlobalTree.load_json(ws / "global_tree_one_round.json")
    assert one.get_n_leaves() == report["one_round"]["n_leaves"]
    # the workspace predicts on raw rows: scripts/predict.py on the server's test set scores as the report says
    predict = run_script("scripts/predict.py", ["--model", str(ws), "--csv", str(ws / "data" / "server" / "test.csv"),
                                                "--out", str(ws.parent / "p.csv"), "--explain"], ws.parent)
    assert predict.returncode == 0, predict.stderr
    import pandas as pd

    out = pd.read_csv(ws.parent / "p.csv", dtype=str)
    truth = pd.read_csv(ws / "data" / "server" / "test.csv", dtype=str)["class"]
    assert (out["predicted"] == truth).mean() == pytest.approx(report["global"]["accuracy"], abs=1e-12)
    assert out["explanation"].str.len().min() > 0 and set(out.columns) >= {"p_unacc", "p_acc"}


def test_export_runs_without_installed_package(tmp_path):
    """The exported job carries the whole package: it imports with only the job's custom/ on the path."""
    out = tmp_path / "export"
    proc = run_script("jobs/icdta4fl/job.py", ["--dataset", "car", "--sites", "2", "--workspace",
                                               str(tmp_path / "ws"), "--export", str(out)], tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = out / "icdta4fl"
    meta = json.loads((job / "meta.json").read_text())
    assert meta["name"] == "icdta4fl"
    server_cfg = next(job.glob("app*/config/config_fed_server.json"))
    assert '"treeflare.flare.icdta4fl.controller.ICDTA4FLController"' in server_cfg.read_text()
    client_cfg = next(job.glob("app*/config/config_fed_client.json"))
    assert '"treeflare.flare.icdta4fl.executor.ICDTA4FLExecutor"' in client_cfg.read_text()
    custom = next(job.glob("app*/custom"))
    assert (custom / "treeflare" / "icdta4fl" / "payloads.py").is_file()
    assert (custom / "treeflare" / "crypto" / "native" / "fixed_base.c").is_file()  # package data travels too
    # -S: no site-packages .pth processing, so the editable install of treeflare is invisible.
    site_packages = sysconfig.get_paths()["purelib"]
    code = (f"import sys; sys.path.append({site_packages!r}); sys.path.insert(0, {str(custom)!r}); "
            "import treeflare.flare.icdta4fl.controller as c, treeflare.flare.icdta4fl.executor as e; "
            f"assert c.__file__.startswith({str(custom)!r}), c.__file__; print('ok')")
    res = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
