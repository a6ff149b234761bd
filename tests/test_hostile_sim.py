"""A real simulator run in which site-3 is hostile: it trains, then sends the server a tree with a NaN threshold.
The job completes on the other sites, the report names site-3 and why it was dropped, the server logged the reason
and did not crash."""

from __future__ import annotations

import json

import pytest

from flare_helpers import flare_lock, run_script

pytestmark = pytest.mark.flare


def test_hostile_site_is_dropped_and_named(tmp_path):
    ws = tmp_path / "ws"
    with flare_lock():
        proc = run_script("tests/hostile_job.py",
                          ["--algorithm", "cart", "--dataset", "car", "--sites", "3", "--partition", "iid",
                           "--seed", "1", "--max-depth", "4", "--min-clients", "2", "--workspace", str(ws)],
                          tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    report = json.loads((ws / "report.json").read_text())
    assert report["n_sites"] == 2 and set(report["sites"]) == {"site-1", "site-2"}
    reason = report["dropped_sites"]["site-3"]
    assert reason.startswith("icdta4fl_train: invalid payload") and "not finite" in reason, reason
    assert "site-3" not in report["selected_sites"]
    assert report["global"]["n_leaves"] >= 2 and 0.7 < report["global"]["accuracy"] <= 1
    assert "dropped sites: {'site-3'" in proc.stdout
    # the server logged the reason and went on to the end of the protocol
    server = ws / "flare" / "icdta4fl" / "server"
    log = "".join(p.read_text(errors="replace") for p in server.rglob("log.txt"))
    assert "dropped site-3 at icdta4fl_train: invalid payload" in log
    result = json.loads((server / "simulate_job" / "icdta4fl_result.json").read_text())
    assert result["status"] == "completed" and "global" in result
    # site-3 really ran the hostile code (and only site-3)
    assert (ws / "flare" / "icdta4fl" / "site-3" / "simulate_job" / "app_site-3" / "custom" / "treeflare_hostile").is_dir()
    assert not (ws / "flare" / "icdta4fl" / "site-1" / "simulate_job" / "app_site-1" / "custom" / "treeflare_hostile").exists()
