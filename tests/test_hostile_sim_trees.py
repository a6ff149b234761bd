"""A real simulator run with two hostile sites whose trees used to end the whole job (issue 14 items 1-2):

* site-3 sends a categorical code of 2**63 with no declared category counts: dropped at training, by the server's
  own schema, with the reason in the report;
* site-4 declares 10,000 categories per column (which used to turn ~60 rules into ~230,000 and exhaust memory):
  the server ignores the declaration, so its tree is as cheap as an honest one and the site stays.
The job completes on the remaining sites and reports both."""

from __future__ import annotations

import json

import numpy as np
import pytest

from flare_helpers import flare_lock, run_script

pytestmark = pytest.mark.flare


def _write_csv(path, n=2400, seed=0):
    rng = np.random.default_rng(seed)
    colour = rng.choice(["red", "green", "blue", "grey"], n)
    shape = rng.choice(["round", "square", "flat"], n)
    size = rng.uniform(0, 10, n)
    y = np.where((colour == "red") | ((shape == "flat") & (size > 5)), "yes", "no")
    flip = rng.random(n) < 0.05
    y = np.where(flip, np.where(y == "yes", "no", "yes"), y)
    lines = ["colour,shape,size,label"] + [f"{c},{s},{v:.3f},{t}" for c, s, v, t in zip(colour, shape, size, y)]
    path.write_text("\n".join(lines) + "\n")


def test_hostile_category_codes_cannot_end_the_job(tmp_path):
    ws = tmp_path / "ws"
    data = tmp_path / "shapes.csv"
    _write_csv(data)
    with flare_lock():
        proc = run_script("tests/hostile_job.py",
                          ["--hostile-mode", "huge_code@site-3", "--hostile-mode", "many_categories@site-4",
                           "--algorithm", "id3", "--csv", str(data), "--label", "label", "--sites", "4",
                           "--partition", "iid", "--seed", "1", "--max-depth", "3", "--min-clients", "2",
                           "--refine-rounds", "0", "--workspace", str(ws)],
                          tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    report = json.loads((ws / "report.json").read_text())
    assert report.get("status", "completed") == "completed"
    reason = report["dropped_sites"]["site-3"]
    assert reason.startswith("icdta4fl_train: invalid payload") and "is above" in reason, reason
    assert "site-4" not in report["dropped_sites"] and "site-4" in report["sites"]
    # site-4's tree yields as few rules as the honest trees, not thousands
    assert max(report["aggregation"]["n_rules_local"]) < 200, report["aggregation"]
    assert report["global"]["accuracy"] > 0.85
