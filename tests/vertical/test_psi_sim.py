"""``scripts/psi.py`` in the FLARE simulator: 3 parties (active + 2 passive) at 70% overlap, as
``prepare_data.py --vertical --passive 2 --overlap 0.7`` writes them, with ``--psi ecdh`` (the default) and
``--psi nvflare``. One run of each, shared by the checks: each party keeps exactly the true intersection; the
report's counts; and, from what the server recorded of every task, result and aux message crossing it (``--audit``),
that no id, kind-prefixed item, or sha256/sha1/md5 of either (hex or raw) ever did."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from flare_helpers import run_script
from test_psi_inprocess import leaked

from treeflare.data import load_dataset, prepare_federation, write_federation
from treeflare.flare.psi.audit import read_audit

pytestmark = pytest.mark.flare
SITES = ["site-1", "site-2", "site-3"]


def ids_of(path: Path) -> list[str]:
    with path.open(newline="") as fh:
        return [row["row_id"] for row in csv.DictReader(fh)]


@pytest.fixture(scope="module", params=["ecdh", "nvflare"])
def psi_run(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("psi_sim")
    fed = prepare_federation(load_dataset("car"), 3, vertical=True, n_passive=2, overlap=0.7, seed=3)
    root = write_federation(fed, tmp / "fed")
    ws = tmp / "ws"
    proc = run_script("scripts/psi.py", ["--sites", "3", "--data-root", str(root), "--workspace", str(ws),
                                         "--audit", "--log-level", "WARNING", "--psi", request.param], tmp,
                      timeout=300)
    held = {s: {k: ids_of(root / s / f"{k}.csv") for k in ("train", "test")} for s in SITES}
    return proc, ws, held, request.param


def test_each_party_keeps_the_true_intersection_and_the_report_counts_it(psi_run):
    proc, ws, held, method = psi_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((ws / "report.json").read_text())
    psi = report["psi"]
    assert psi["status"] == "completed"
    truth = {k: sorted(set.intersection(*(set(held[s][k]) for s in SITES))) for k in ("train", "test")}
    assert 0 < len(truth["train"]) < min(len(held[s]["train"]) for s in SITES)  # a real partial overlap
    assert psi["intersection_size"] == len(truth["train"]) + len(truth["test"])
    for site in SITES:
        kept = json.loads(Path(psi["intersection_files"][site]).read_text())["ids"]
        assert kept == truth, site
        party = psi["parties"][site]
        assert party["rows_before"] == {k: len(held[site][k]) for k in ("train", "test")}
        assert party["rows_after"] == {k: len(truth[k]) for k in ("train", "test")}
        assert party["bytes_sent"] > 10_000 and party["bytes_received"] > 10_000 and party["seconds"] > 0
        assert f"{site}  " in proc.stdout and psi["intersection_files"][site] in proc.stdout
    assert "task_name" not in proc.stdout  # NVFlare's leftover print is silenced
    assert set(psi["timings_s"]) == {"check", "dh_psi" if method == "nvflare" else "ecdh", "result",
                                     "waiting_for_sites"}
    if method == "ecdh":  # the relay's own record: every list went around, sealed, in few rounds
        assert psi["ecdh"]["rounds"] <= 8 and psi["ecdh"]["bytes_relayed"] > 3 * 1209 * 32 and psi["max_ratio"] == 10


def test_the_server_never_sees_an_id_a_hash_of_one_or_the_intersection(psi_run):
    proc, ws, held, method = psi_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_audit(Path(json.loads((ws / "report.json").read_text())["audit"]).parent)
    tasks = {(r["chain"], r["task"]) for r in records}
    assert {("task_result", "treeflare_psi_check"), ("task_result", "treeflare_psi_result")} <= tasks
    if method == "nvflare":
        assert {("task_data", "PSI"), ("task_result", "PSI")} <= tasks
    else:  # every request and reply the relay passed on, the start included
        assert {("aux_request", "the ECDH-PSI start"), ("aux_reply", "ECDH-PSI round 1")} <= tasks
    leaves = [leaf for r in records for leaf in r["leaves"]]
    assert sum(len(v) // 2 for _, kind, v in leaves if kind == "bytes") > 200_000  # the PSI messages are in
    every_id = {i for h in held.values() for ids in h.values() for i in ids}
    assert leaked(leaves, every_id) == []
    # nor in what the server wrote: its result file and its logs
    server = ws / "flare" / "psi" / "server"
    written = [["/" + p.name, "str", p.read_text(errors="replace")] for p in server.rglob("*")
               if p.is_file() and p.suffix in (".json", ".txt") and p.stat().st_size < 5_000_000]
    assert written and leaked(written, every_id) == []
