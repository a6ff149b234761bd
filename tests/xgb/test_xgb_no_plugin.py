"""The XGBoost job where XGBoost has no federated plugin (as every XGBoost from 3.4 on): ``--engine xgboost`` is
refused before anything starts, with what to do instead, and ``--engine treeflare`` trains in the simulator, its
model loaded and scored by that XGBoost and equal to XGBoost's hist on the pooled rows (car: few levels a column,
so the agreed bins are XGBoost's). The plugin-less XGBoost comes first on PYTHONPATH (``noplugin_env``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import noplugin_env
from flare_helpers import REPO, run_script

pytest.importorskip("tensorboard")
JOB = "jobs/xgb_histogram/job.py"


@pytest.fixture(scope="module")
def noplugin():
    folder = noplugin_env.ensure()
    if folder is None:
        pytest.skip(f"{noplugin_env.PACKAGE} could not be installed from the registry")
    probe = subprocess.run([sys.executable, "-c", "import xgboost as x; print(x.__version__, "
                            "bool(x.build_info().get('USE_FEDERATED')), x.__file__)"],
                           env={"PYTHONPATH": str(folder), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                           cwd=REPO)
    version, federated, where = probe.stdout.split()
    assert federated == "False" and where.startswith(str(folder)), probe.stdout + probe.stderr
    return str(folder)


def test_engine_xgboost_is_refused_with_what_to_do(tmp_path, noplugin):
    ws = tmp_path / "ws"
    proc = run_script(JOB, ["--dataset", "car", "--engine", "xgboost", "--workspace", str(ws)], tmp_path,
                      timeout=120, python_path=noplugin)
    assert proc.returncode != 0, proc.stderr[-2000:]
    assert "no federated support" in proc.stderr and "--engine treeflare" in proc.stderr
    assert "Traceback" not in proc.stderr and not (ws / "flare").exists()


@pytest.mark.flare
def test_engine_treeflare_trains_without_the_plugin(tmp_path, noplugin):
    ws = tmp_path / "ws"
    proc = run_script(JOB, ["--dataset", "car", "--engine", "treeflare", "--rounds", "3", "--max-depth", "4",
                            "--eta", "0.5", "--sites", "3", "--baselines", "centralized,native_distributed", "--xgb-port", "0",
                            "--workspace", str(ws), "--log-level", "WARNING"], tmp_path, timeout=300,
                      python_path=noplugin)
    assert (ws / "report.json").is_file(), proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads((ws / "report.json").read_text())
    assert report["params"]["engine"] == "treeflare" and report["transport"]["engine"] == "treeflare"
    assert report["baselines_skipped"] == {"native_distributed": "this XGBoost has no federated plugin"}
    # the same trees as XGBoost's hist on the pooled rows with the same parameters and base score
    assert report["comparison"]["centralized"]["max_abs_pred_diff"] < 1e-5
    assert report["global"]["accuracy"] > 0.75
    # the validation loss after every round, pooled over the sites' validation rows by masked sums
    history = report["validation"]["pooled"]["history"]
    assert report["validation"]["metrics"] == ["mlogloss"] and len(history) == 3 and history[-1] < history[0]
    t = report["transport"]
    # one sketch, 3 rounds, a level request per level below the last, a finish: the server summed every one
    assert t["rounds"] == 3 and t["requests"] >= 1 + 1 + 3 + 1 and t["values_summed"] > 0
    model = json.loads((ws / "model.json").read_text())
    assert len(model["learner"]["gradient_booster"]["model"]["trees"]) == 3 * 4  # 4 classes a round
    assert model["learner"]["attributes"].get("treeflare")  # the schema travels in the model
    site_copy = next((ws / "flare").rglob("site-1/**/model.json"))
    site_trees = json.loads(site_copy.read_text())["learner"]["gradient_booster"]["model"]["trees"]
    assert site_trees == model["learner"]["gradient_booster"]["model"]["trees"]
