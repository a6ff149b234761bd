"""The PSI phase (``treeflare.flare.psi``) in one process: our check and result workflows, NVFlare's own DH-PSI
workflow and task handler (real openmined-psi crypto) and every site's components, wired by a fake communicator
that sends each task and reply through NVFlare's serializer (FOBS) and records it. Bad input, a DH-PSI failure
and what crosses the server are checked here, with no simulator; ``test_psi_sim`` runs the same in FLARE."""

from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path
from types import SimpleNamespace

import pytest
from nvflare.apis.controller_spec import TaskCompletionStatus
from nvflare.apis.shareable import Shareable
from nvflare.apis.signal import Signal
from nvflare.app_common.decomposers import common_decomposers
from nvflare.app_common.psi.psi_executor import PSIExecutor
from nvflare.fuel.utils import fobs

from treeflare.data.intersection import INTERSECTION_FILE, read_intersection
from treeflare.flare.psi import protocol
from treeflare.flare.psi.audit import leaves
from treeflare.flare.psi.controller import (MeteredDhPSIController, PsiCheckController, PsiResultController,
                                            evaluate_check, evaluate_result)
from treeflare.flare.psi.executor import DH_PSI_ID, LOCAL_PSI_ID, MeteredDhPSITaskHandler, PsiSiteExecutor, SiteIds
from treeflare.flare.psi.protocol import payload_bytes
from treeflare.flare.workflow import JobFailed

common_decomposers.register()
SITES = ["site-1", "site-2", "site-3"]
LOGS = ("log_info", "log_warning", "log_error", "log_exception", "log_debug")


# ---- data: three parties at 70% overlap, written the way prepare_data.py --vertical writes them ----------------------

def write_party(folder: Path, train_ids, test_ids, column="pid"):
    folder.mkdir(parents=True, exist_ok=True)
    for kind, ids in (("train", train_ids), ("test", test_ids)):
        rows = "".join(f"{i},{n % 7}\n" for n, i in enumerate(ids))
        (folder / f"{kind}.csv").write_text(f"{column},x_{folder.name[-1]}\n{rows}")


def three_parties(root: Path, n_shared=70, n_own=30, n_test=20, seed=0, pair_only=0):
    """Each party: ``n_shared`` training ids all hold, ``n_own`` of its own (70% overlap), in its own order; the
    same ``n_test`` test ids everywhere. ``pair_only``: that many more ids site-1 and site-2 both hold and site-3
    does not (site-3 then holds as many more of its own, and 5 more: the largest set). Returns {site: {"train":
    ids, "test": ids}}."""
    token = lambda: secrets.token_hex(8)  # noqa: E731 -- random ids, as prepare_data gives data without ids
    shared, test = [token() for _ in range(n_shared)], [token() for _ in range(n_test)]
    pair = [token() for _ in range(pair_only)]
    held = {}
    for k, site in enumerate(SITES):
        own = [token() for _ in range(n_own + (pair_only + 5 if pair_only and k == 2 else 0))]
        train = shared + own + (pair if k < 2 else [])
        order = sorted(range(len(train)), key=lambda i: hashlib.sha256(f"{seed}{k}{i}".encode()).digest())
        held[site] = {"train": [train[i] for i in order], "test": test[k:] + test[:k]}
        write_party(root / site, held[site]["train"], held[site]["test"])
    return held


# ---- the harness -------------------------------------------------------------------------------------------------

def wire(shareable):
    return fobs.loads(fobs.dumps(shareable))


class InProcessPSI:
    def __init__(self, data_root: Path, run_root: Path, kinds=("train", "test"), min_rows=10, sites=SITES,
                 schema={"id_column": "pid"}):  # noqa: B006 -- read only
        self.sites, self.kinds, self.min_rows = list(sites), list(kinds), min_rows
        self.run_root = Path(run_root)
        self.messages = []  # (direction, site, task name, Shareable as it arrived)
        self.panics = []
        self.warnings = []  # what the server's workflows logged at WARNING
        self.comps = {}
        for site in self.sites:
            comps = {LOCAL_PSI_ID: SiteIds(kinds=kinds, data_root=str(data_root), schema=schema),
                     DH_PSI_ID: MeteredDhPSITaskHandler(), "psi": PSIExecutor(psi_algo_id=DH_PSI_ID),
                     "tasks": PsiSiteExecutor()}
            for comp in comps.values():
                for level in LOGS:
                    setattr(comp, level, lambda *a, **k: None)
            self.comps[site] = comps
            (self.run_root / site).mkdir(parents=True, exist_ok=True)
        (self.run_root / "server").mkdir(parents=True, exist_ok=True)

    def site_ctx(self, site):
        workspace = SimpleNamespace(get_run_dir=lambda job_id: str(self.run_root / site))
        engine = SimpleNamespace(get_component=self.comps[site].get, get_workspace=lambda: workspace)
        return SimpleNamespace(get_identity_name=lambda: site, get_engine=lambda: engine, get_job_id=lambda: "job",
                               get_prop=lambda key, default=None: default, get_peer_context=lambda: None)

    def server_ctx(self):
        props = {}
        workspace = SimpleNamespace(get_run_dir=lambda job_id: str(self.run_root / "server"))
        engine = SimpleNamespace(get_clients=lambda: [SimpleNamespace(name=s) for s in self.sites],
                                 get_workspace=lambda: workspace)
        return SimpleNamespace(get_engine=lambda: engine, get_job_id=lambda: "job", get_identity_name=lambda: "server",
                               get_peer_context=lambda: None,
                               get_prop=lambda key, default=None: props.get(key, default),
                               set_prop=lambda key, value, private=True, sticky=True: props.__setitem__(key, value))

    def deliver(self, task, targets, fl_ctx):
        task.client_tasks = getattr(task, "client_tasks", None) or []
        for site in targets or self.sites:
            site = getattr(site, "name", site)
            data = wire(task.data)
            self.messages.append(("to_site", site, task.name, data))
            runner = self.comps[site]["psi" if task.name == protocol.PSI_TASK else "tasks"]
            reply = wire(runner.execute(task.name, data, self.site_ctx(site), Signal()))
            self.messages.append(("to_server", site, task.name, reply))
            ct = SimpleNamespace(client=SimpleNamespace(name=site), result=reply, task=task)
            task.client_tasks.append(ct)
            if task.result_received_cb is not None:
                task.result_received_cb(ct, fl_ctx)
        task.completion_status = TaskCompletionStatus.OK  # as NVFlare's monitor, once every target answered

    def run(self) -> dict:
        abort, ctx = Signal(), self.server_ctx()
        for site in self.sites:  # START_RUN at each site
            self.comps[site]["psi"].initialize(self.site_ctx(site))
        common = {"sites": self.sites, "kinds": self.kinds, "min_rows": self.min_rows}
        workflows = [PsiCheckController(**common), MeteredDhPSIController(**common), PsiResultController(**common)]
        for wf in workflows:
            wf.broadcast_and_wait = lambda task, fl_ctx, targets=None, *a, **k: self.deliver(task, targets, fl_ctx)
            wf.broadcast = lambda task, fl_ctx, targets=None, *a, **k: self.deliver(task, targets, fl_ctx)
            wf.send = lambda task, fl_ctx, targets=None, *a, **k: self.deliver(task, targets, fl_ctx)
            wf.get_num_standing_tasks = lambda: 0
            for level in LOGS:
                setattr(wf, level, lambda *a, **k: None)
            wf.log_warning = lambda fl_ctx, msg, *a, **k: self.warnings.append(msg)
            wf.system_panic = lambda reason, fl_ctx: (self.panics.append(reason), abort.trigger(reason))
        for wf in workflows:  # as FLARE's ServerRunner: in order, none after a panic
            wf.start_controller(ctx)
            wf.control_flow(abort, ctx)
            wf.stop_controller(ctx)
            if abort.triggered:
                break
        return json.loads((self.run_root / "server" / protocol.RESULT_FILE).read_text())

    def kept(self, site):
        return read_intersection(protocol.intersection_dir(self.run_root / site), site=site)

    def tasks_seen(self):
        return {name for _, _, name, _ in self.messages}

    def prepares(self):
        """Each DH-PSI run's PREPARE stage, in order: (its index in ``messages``, True for the identity check)."""
        from nvflare.app_common.app_constant import PSIConst

        seen, out = set(), []
        for n, (d, site, name, m) in enumerate(self.messages):
            if d == "to_site" and name == protocol.PSI_TASK and m.get(PSIConst.TASK_KEY) == PSIConst.TASK_PREPARE:
                if site in seen or not out:
                    seen, out = set(), out + [(n, m.get(protocol.VERIFY_KEY) is True)]
                seen.add(site)
        return out

    def main_run(self):
        """The messages of the first DH-PSI run (before its identity check)."""
        runs = self.prepares()
        return self.messages[:runs[1][0]] if len(runs) > 1 else self.messages


# ---- what must never cross the server -------------------------------------------------------------------------

def needles(ids) -> tuple[set, set]:
    """(text needles, byte needles) for every id: the id, its kind-prefixed items, their sha256/sha1/md5 hex
    digests (as text) and raw digests (as bytes)."""
    text, raw = set(), set()
    for i in ids:
        for form in (i, *(f"{k}:{i}" for k in ("train", "test", "predict"))):
            text.add(form)
            for algo in (hashlib.sha256, hashlib.sha1, hashlib.md5):
                digest = algo(form.encode()).digest()
                text.add(digest.hex())
                raw.add(digest)
    return text, raw


def leaked(records, ids) -> list:
    """Every needle of ``ids`` found in the records' leaves (``audit.leaves`` form): text needles in the text and
    bytes (case folded), raw digests in the bytes. One pass over the data, looking up each window of the shortest
    needle's length among the needles' prefixes, so it stays linear in the data."""
    text, raw = needles(ids)
    wanted = {t.lower().encode() for t in text} | raw
    parts = [value.encode() if kind == "str" else bytes.fromhex(value) for _, kind, value in records
             if kind in ("str", "bytes")]
    hay = b"\x00".join(parts)
    k = min(len(n) for n in wanted)
    by_prefix: dict = {}
    for n in wanted:
        by_prefix.setdefault(n[:k], []).append(n)
    found = set()
    for h in (hay, hay.lower()):
        for j in range(len(h) - k + 1):
            candidates = by_prefix.get(h[j:j + k])
            if candidates:
                found.update(n for n in candidates if h.startswith(n, j))
    return sorted(found)


def all_leaves(messages, direction=None) -> list:
    return [leaf for d, site, name, shareable in messages if direction in (None, d)
            for leaf in leaves(dict(shareable))]


# ---- tests ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good(tmp_path_factory):
    root = tmp_path_factory.mktemp("psi_good")
    held = three_parties(root / "data", pair_only=10)
    run = InProcessPSI(root / "data", root / "runs")
    saves = run.saves = {s: [] for s in SITES}
    for site in SITES:  # what each party's DH-PSI passes hand it (the last one stays, in intersection.json)
        comp = run.comps[site][LOCAL_PSI_ID]
        comp.save = lambda items, _c=comp, _s=site: (saves[_s].append(sorted(items)), SiteIds.save(_c, items))
    return run, run.run(), held


def true_intersection(held, kind):
    return sorted(set.intersection(*(set(h[kind]) for h in held.values())))


def test_each_party_keeps_exactly_the_intersection_sorted(good):
    run, result, held = good
    assert result["status"] == "completed", result
    for site in SITES:
        kept = run.kept(site)
        assert kept["train"] == true_intersection(held, "train") and len(kept["train"]) == 70
        assert kept["test"] == true_intersection(held, "test") and len(kept["test"]) == 20
    assert result["intersection_size"] == 90
    for site, party in result["parties"].items():
        assert party["rows_before"] == {"train": 115 if site == "site-3" else 110, "test": 20}
        assert party["rows_after"] == {"train": 70, "test": 20}
        assert party["bytes_sent"] > 0 and party["bytes_received"] > 0 and party["seconds"] > 0


def test_the_bytes_counted_are_the_psi_messages_each_site_sent_and_received(good):
    run, result, _ = good
    for site in SITES:
        to_site = sum(payload_bytes(m.get("DXO") or {}) + sum(payload_bytes(v) for k, v in m.items()
                                                                  if str(k).startswith("PSI_"))
                      for d, s, name, m in run.messages if s == site and name == "PSI" and d == "to_site")
        sent = sum(payload_bytes((m.get("DXO") or {}).get("data") or {})
                   for d, s, name, m in run.messages if s == site and name == "PSI" and d == "to_server")
        assert result["parties"][site]["bytes_received"] == to_site
        assert result["parties"][site]["bytes_sent"] == sent


def test_no_id_nor_hash_of_an_id_crosses_the_server(good):
    """Every field of every task and reply (FOBS-decoded, recursively) is scanned for each id of every party, its
    kind-prefixed items, and their sha256/sha1/md5 hex and raw digests."""
    run, result, held = good
    every_id = {i for h in held.values() for ids in h.values() for i in ids}
    records = all_leaves(run.messages)
    assert sum(len(v) for _, kind, v in records if kind == "bytes") > 50_000  # the DH-PSI messages were scanned
    assert leaked(records, every_id) == []
    # the scan finds what it looks for: an id, a digest and an item planted in a reply
    planted = sorted(every_id)[:3]
    probe = [["/x", "str", planted[0]], ["/y", "bytes", hashlib.sha256(f"train:{planted[1]}".encode()).digest().hex()],
             ["/z", "str", hashlib.md5(planted[2].encode()).hexdigest().upper()]]
    assert len(leaked(probe, every_id)) == 3
    assert json.dumps(result).count(planted[0]) == 0


def test_the_workflow_order_reveals_a_pairwise_intersection_to_one_party_and_its_size_to_the_server(good):
    """What SECURITY.md says NVFlare's DH-PSI order reveals. Sites sorted by set size (site-1 130 items, site-2 130,
    site-3 135); the first pass pairs the first half with the second (site-1 with site-2): site-2 learns which of
    its ids site-1 holds -- the 10 they share without site-3 too -- before the pass with site-3 narrows it; the
    server sees every party's set size and every pass's intersection size."""
    run, result, held = good
    final = sorted(f"{k}:{i}" for k in ("train", "test") for i in true_intersection(held, k))
    pair = sorted(set(held["site-1"]["train"]) & set(held["site-2"]["train"]) - set(held["site-3"]["train"]))
    assert len(pair) == 10
    first = run.saves["site-2"][0]
    assert first == sorted(final + [f"train:{i}" for i in pair])  # site-2's first pass: its intersection with site-1
    assert all(run.saves[s][-1] == final for s in SITES) and len(run.saves["site-1"]) == 1
    sizes = [int(v) for d, s, name, m in run.messages if d == "to_server" and name == "PSI"
             for path, kind, v in leaves(dict(m)) if path.endswith("PSI_ITEMS_SIZE")]
    assert sizes[:3] == [130, 130, 135]  # prepare: every party's set size (train + test items)
    assert sizes[3:7] == [100, 90, 90, 90]  # site-2's pairwise intersection, then the final one, three times
    # then the identity check: a constant in every count (VERIFY_ITEMS per set size, pass and final intersection)
    assert sizes[7:] == [protocol.VERIFY_ITEMS] * 7 and [v for _, v in run.prepares()] == [False, True]
    # the parties learn set sizes too: site-1 its partner's, site-3 (last) site-1's and the size site-2 had left
    told = [(s, path.rsplit("/", 1)[-1], v) for d, s, name, m in run.main_run() if d == "to_site" and name == "PSI"
            for path, kind, v in leaves(dict(m)) if "PSI_ITEMS_SIZE" in path]
    assert ("site-1", "PSI_ITEMS_SIZE", "130") in told
    assert sorted(v for s, key, v in told if s == "site-3") == ["100", "130"]


def test_a_party_that_lies_about_its_ids_learns_which_of_them_every_other_party_holds(tmp_path):
    """A party may put any ids in its file: those every other party holds come back in its intersection."""
    held = three_parties(tmp_path / "data", n_shared=20, n_own=5, n_test=5, pair_only=6)
    probes = sorted(set(held["site-1"]["train"]) & set(held["site-2"]["train"]) - set(held["site-3"]["train"]))
    guesses = probes[:3] + [secrets.token_hex(8) for _ in range(3)]  # 3 right guesses, 3 wrong
    write_party(tmp_path / "data" / "site-3", held["site-3"]["train"] + guesses, held["site-3"]["test"])
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs")
    assert run.run()["status"] == "completed"
    assert set(run.kept("site-3")["train"]) & set(guesses) == set(probes[:3])


def test_a_server_that_runs_dh_psi_itself_can_probe_a_site(tmp_path):
    """Not semi-honest: the sites answer DH-PSI tasks from the server without knowing whose request they serve,
    so a server playing a PSI client with ids of its choosing learns which of them a site holds."""
    from nvflare.app_common.app_constant import PSIConst
    from nvflare.app_opt.psi.dh_psi.dh_psi_client import PSIClient

    held = three_parties(tmp_path / "data", n_shared=20, n_own=5, n_test=5)
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs")
    site, ctx = "site-1", run.site_ctx("site-1")
    executor = run.comps[site]["psi"]
    executor.initialize(ctx)

    def ask(**fields):
        reply = wire(executor.execute("PSI", wire(Shareable(fields)), ctx, Signal()))
        return reply["DXO"]["data"]

    ask(**{PSIConst.TASK_KEY: PSIConst.TASK_PREPARE, PSIConst.BLOOM_FILTER_FPR: 1e-11})
    setup = ask(**{PSIConst.TASK_KEY: PSIConst.TASK_SETUP, PSIConst.ITEMS_SIZE: 4})[PSIConst.SETUP_MSG]
    guesses = [f"train:{held[site]['train'][0]}", f"train:{held[site]['train'][1]}", "train:nobody", "test:x"]
    server_as_client = PSIClient(guesses)
    server_as_client.receive_setup(setup)
    request = server_as_client.get_request(guesses)
    response = ask(**{PSIConst.TASK_KEY: PSIConst.TASK_RESPONSE, PSIConst.REQUEST_MSG: request})
    assert server_as_client.get_intersection(response[PSIConst.RESPONSE_MSG]) == guesses[:2]


def reasons(result):
    return result.get("error") or ""


@pytest.mark.parametrize("case", ["duplicate", "blank", "no_rows", "too_few_rows", "no_id_column"])
def test_bad_input_fails_naming_the_site_before_any_psi_message(tmp_path, case):
    held = three_parties(tmp_path / "data", n_shared=20, n_own=5, n_test=5)
    bad = held["site-2"]["train"]
    secret = bad[3]
    if case == "duplicate":
        bad[7] = secret
    elif case == "blank":
        bad[3] = "  "
    elif case == "no_rows":
        bad.clear()
    elif case == "too_few_rows":
        del bad[8:]
    write_party(tmp_path / "data" / "site-2", bad, held["site-2"]["test"],
                column="customer" if case == "no_id_column" else "pid")
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs", min_rows=10)
    result = run.run()
    assert result["status"] == "failed" and run.panics
    error = reasons(result)
    assert error.startswith("PSI check (before any encryption): site-2: ") and "site-1" not in error, error
    expected = {"duplicate": "site-2: train.csv, column 'pid', line 9: duplicate id",
                "blank": "site-2: train.csv, column 'pid', line 5: empty id", "no_rows": "train.csv: no data rows",
                "too_few_rows": "8 train rows, fewer than the 10", "no_id_column": "column 'pid': the id column"}
    assert expected[case] in error, error
    assert protocol.PSI_TASK not in run.tasks_seen()  # no DH-PSI message at all
    every_id = {i for h in held.values() for ids in h.values() for i in ids} | {secret}
    assert leaked([leaf for leaf in all_leaves(run.messages)] + [["/result", "str", json.dumps(result)]],
                  every_id) == []
    assert not list(run.run_root.rglob(INTERSECTION_FILE))
    assert str(tmp_path) not in json.dumps(result)  # no local path either


def test_an_intersection_below_min_rows_fails_and_no_party_keeps_it(tmp_path):
    three_parties(tmp_path / "data", n_shared=30, n_own=10, n_test=5)
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs", min_rows=35)  # every party has 40 rows, 30 shared
    result = run.run()
    assert result["status"] == "failed", result
    assert reasons(result) == ("PSI result: the intersection holds 30 train rows, fewer than min_rows 35 "
                               "(--psi-min-rows); the parties share too few rows to train on")
    assert protocol.TASK_DISCARD in run.tasks_seen()
    assert not list(run.run_root.rglob(INTERSECTION_FILE))
    assert all(p["rows_after"] == {"train": 30, "test": 5} for p in result["parties"].values())


def test_a_failing_dh_psi_ends_the_job_with_the_reason_and_nothing_kept(tmp_path, monkeypatch):
    three_parties(tmp_path / "data")  # 120 ids each: a real false positive (retried) is rare there
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs")
    handler = run.comps["site-2"][DH_PSI_ID]  # site-2 intersects twice: forward pass with site-1, backward pass
    calls = []

    def broken(shareable):
        calls.append(1)
        if len(calls) > 1:  # after site-2 saved one pass's intersection
            raise RuntimeError("boom")
        return MeteredDhPSITaskHandler.calculate_intersection(handler, shareable)

    monkeypatch.setattr(handler, "calculate_intersection", broken)
    result = run.run()
    assert result["status"] == "failed" and result["error"].startswith("DH-PSI failed: "), result
    assert "site-2" in result["error"]
    assert "result" not in result["timings_s"] and "dh_psi" in result["timings_s"]
    assert not list(run.run_root.rglob(INTERSECTION_FILE))
    assert result["attempts"] == 1 and not run.warnings and len(run.prepares()) == 1  # not a consistency failure


def test_prediction_rows_intersect_as_their_own_kind(tmp_path):
    held = three_parties(tmp_path / "data", n_shared=12, n_own=4, n_test=5)
    for site in SITES:  # the new rows: a prediction run's kind, in predict.csv
        folder = tmp_path / "data" / site
        (folder / "predict.csv").write_text((folder / "train.csv").read_text())
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs", kinds=("predict",), min_rows=1)
    result = run.run()
    assert result["status"] == "completed" and result["intersection_size"] == 12
    assert run.kept("site-1") == {"predict": true_intersection(held, "train")}


def test_checks_of_the_replies_the_server_takes():
    parties = {s: {} for s in SITES}
    with pytest.raises(JobFailed, match=r"site-2: invalid check reply: rows\['train'\] is not a row count"):
        evaluate_check(SITES, {"site-1": {"rows": {"train": 5}}, "site-2": {"rows": {"train": "5"}},
                               "site-3": {"rows": {"train": 5}}}, {}, ["train"], 1, parties)
    with pytest.raises(JobFailed, match=r"site-3: no reply \(timed out\)"):
        evaluate_check(SITES, {"site-1": {"rows": {"train": 5}}}, {"site-3": "no reply (timed out)"}, ["train"], 1,
                       parties)
    good = {"seconds": 0.1, "bytes_sent": 1, "bytes_received": 2}
    replies = {"site-1": {"rows_after": {"train": 5}, **good}, "site-2": {"rows_after": {"train": 6}, **good},
               "site-3": {"rows_after": {"train": 5}, **good}}
    with pytest.raises(JobFailed, match="the parties kept different numbers of rows"):
        evaluate_result(SITES, replies, {}, ["train"], 1, {s: {} for s in SITES})
    bad = {**replies, "site-2": {"rows_after": {"train": 5}, **good, "seconds": float("nan")}}
    with pytest.raises(JobFailed, match="site-2: invalid result reply: seconds is not a duration"):
        evaluate_result(SITES, bad, {}, ["train"], 1, {s: {} for s in SITES})
    with pytest.raises(protocol.PsiProtocolError):
        protocol.check_request({"kinds": ["train"]}, ["train", "test"])
    with pytest.raises(protocol.PsiProtocolError):
        protocol.check_kinds(["train", "train"])
    assert protocol.intersection_dir("/r") == Path("/r/psi")


def test_a_site_refuses_a_request_for_other_kinds(tmp_path):
    three_parties(tmp_path / "data", n_shared=5, n_own=1, n_test=2)
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs")
    reply = run.comps["site-1"]["tasks"].execute(protocol.TASK_CHECK, Shareable({"request": {"kinds": ["predict"]}}),
                                                 run.site_ctx("site-1"), Signal())
    assert reply.get_return_code() != "OK"
    assert reply["error"] == ("PsiProtocolError: the PSI request asks for other kinds of rows than the job "
                              "configured at the site")


def test_every_setup_blinds_the_items_under_a_fresh_key(tmp_path):
    """Two setups of the same site for the same partner size: different Bloom filters (a fresh key each time), so
    the messages of one run or pass cannot be matched against another's. A filter's size grows with the set of the
    party that sends it (site-3 holds 11 more training rows than site-1): its receiver learns that set's size."""
    from nvflare.app_common.app_constant import PSIConst

    three_parties(tmp_path / "data", n_shared=20, n_own=5, n_test=5, pair_only=6)
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs")

    def setups(site, n=2):
        ctx, executor = run.site_ctx(site), run.comps[site]["psi"]
        executor.initialize(ctx)

        def ask(**fields):
            return wire(executor.execute("PSI", wire(Shareable(fields)), ctx, Signal()))["DXO"]["data"]

        ask(**{PSIConst.TASK_KEY: PSIConst.TASK_PREPARE, PSIConst.BLOOM_FILTER_FPR: 1e-11})
        return [ask(**{PSIConst.TASK_KEY: PSIConst.TASK_SETUP, PSIConst.ITEMS_SIZE: 30})[PSIConst.SETUP_MSG]
                for _ in range(n)]

    first, second = setups("site-1")
    assert len(first) == len(second) > 100 and first != second
    assert len(setups("site-3", 1)[0]) > len(first)


def test_parties_sharing_no_row_fail_with_the_reason_and_keep_nothing(tmp_path):
    for site in SITES:  # every party its own customers only
        write_party(tmp_path / "data" / site, [secrets.token_hex(8) for _ in range(12)],
                    [secrets.token_hex(8) for _ in range(3)])
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs", min_rows=1)
    result = run.run()
    assert result["status"] == "failed", result
    assert result["error"].startswith("PSI: the parties share no rows (a pass's intersection was already empty"), \
        result
    assert not list(run.run_root.rglob(INTERSECTION_FILE))
    two = InProcessPSI(tmp_path / "data", tmp_path / "runs2", min_rows=1, sites=SITES[:2])  # DH-PSI ends; we fail
    assert two.run()["error"].startswith("PSI: the parties share no rows (a pass's intersection was already empty")
    assert not list(two.run_root.rglob(INTERSECTION_FILE))


def test_an_empty_pass_ends_the_phase_and_no_party_learns_ids_outside_the_intersection(tmp_path):
    """site-1 and site-2 (the two smallest sets, so DH-PSI pairs them first) share nothing; site-3 shares 6 ids with
    site-2 and 4 with site-1. NVFlare's handler goes on from an EMPTY pass with the party's whole set, so site-3 once
    learnt site-2's 6 ids although nothing is shared by all three: the phase must stop at the empty pass."""
    tok = lambda n: [secrets.token_hex(8) for _ in range(n)]  # noqa: E731
    with_2, with_1 = tok(6), tok(4)
    ids = {"site-1": with_1 + tok(6), "site-2": with_2 + tok(5), "site-3": with_2 + with_1 + tok(10)}
    for site, train in ids.items():
        write_party(tmp_path / "data" / site, train, tok(3))
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs", min_rows=1)
    result = run.run()
    # (openmined-psi's Bloom filter gives a false positive at these few ids in about 1 run of 100: NVFlare's count
    # check catches it and DH-PSI runs again with fresh keys, as SECURITY.md says; any other failed attempt is a bug)
    retried = result["failed_attempts"]
    assert all("the intersection sizes from all sites must be equal" in f for f in retried), result
    assert result["status"] == "failed" and result["attempts"] == 1 + len(retried), result
    assert result["error"].startswith("PSI: the parties share no rows (a pass's intersection was already empty")
    handler = run.comps["site-3"][DH_PSI_ID]
    # site-3 learnt no id of the others' sets: either it never took part in a pass (None) or, as one clean-clone run
    # showed, it was handed the empty pass's result ([]) before the phase stopped; both reveal no id
    assert not handler.intersects, handler.intersects
    assert not list(run.run_root.rglob(INTERSECTION_FILE))


# ---- a Bloom-filter false positive: DH-PSI again, with fresh keys -------------------------------------------------

def false_positive(run, site, attempts, swap=False):
    """From now on, in the DH-PSI runs of the ``attempts`` given (1-based, identity checks not counted), ``site``'s
    first intersection holds one more of its own items the partner lacks (openmined-psi's false positive), or, with
    ``swap``, holds it instead of a true one (two false positives whose counts cancel out)."""
    from nvflare.app_common.app_constant import PSIConst

    handler, started = run.comps[site][DH_PSI_ID], []
    start_run = handler.start_run

    def counting_start(shareable, fl_ctx):
        start_run(shareable, fl_ctx)
        if not handler.verifying:
            started.append(len(started) + 1)

    def calculate(shareable):
        if handler.verifying or not started or started[-1] not in attempts or started[-1] in faked:
            return MeteredDhPSITaskHandler.calculate_intersection(handler, shareable)
        faked.add(started[-1])
        found = handler.psi_client.get_intersection(shareable.get(PSIConst.RESPONSE_MSG))
        extra = next(i for i in handler.psi_client.items if i not in found)
        handler.intersects = (found[1:] if swap else found) + [extra]
        handler.local_psi_handler.save(handler.intersects)
        reply = Shareable()
        reply[PSIConst.ITEMS_SIZE] = len(handler.intersects)
        return reply

    faked = set()
    handler.start_run, handler.calculate_intersection = counting_start, calculate
    return faked


def prepare_sizes(run):
    """Each DH-PSI run's PREPARE replies: the set size each site reports, in order of the runs."""
    runs = [n for n, _ in run.prepares()] + [len(run.messages)]
    return [sorted([int(v) for d, s, name, m in run.messages[a:b] if d == "to_server" and name == protocol.PSI_TASK
                    for path, kind, v in leaves(dict(m)) if path.endswith("PSI_ITEMS_SIZE")][:len(SITES)])
            for a, b in zip(runs, runs[1:])]


def assert_exact(run, result, held):
    assert result["status"] == "completed", result
    for site in SITES:
        assert run.kept(site) == {k: true_intersection(held, k) for k in ("train", "test")}
    assert not run.panics


def test_a_false_positive_fails_nvflares_check_and_the_retry_starts_clean_at_every_site(tmp_path):
    """Equal set sizes: site-1 is the DH "server" of the first pass and intersects only in the backward pass, where
    one more id makes its count differ from the others'. Attempt 2 must start from every party's own ids: NVFlare's
    handler would otherwise give its last intersection as its items."""
    held = three_parties(tmp_path / "data")
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs")
    faked = false_positive(run, "site-1", attempts={1})
    result = run.run()
    assert faked == {1}
    assert_exact(run, result, held)
    assert result["attempts"] == 2 and len(result["failed_attempts"]) == 1, result
    assert "attempt 1: Intersection calculation failed: the intersection sizes from all sites must be equal" in \
        result["failed_attempts"][0]
    assert len(run.warnings) == 1 and "attempt 1 of 3 failed its consistency check" in run.warnings[0]
    assert [v for _, v in run.prepares()] == [False, False, True]  # attempt 1, attempt 2, its identity check
    assert prepare_sizes(run)[:2] == [[120, 120, 120]] * 2  # attempt 2: every party's own ids again, not a result
    discard = [n for n, (d, s, name, m) in enumerate(run.messages) if name == protocol.TASK_DISCARD and d == "to_site"]
    assert len(discard) == len(SITES) and discard[-1] < run.prepares()[1][0]  # the failed attempt's files: deleted
    assert result["intersection_size"] == 90 and all(p["rows_after"] == {"train": 70, "test": 20}
                                                     for p in result["parties"].values())


def test_false_positives_whose_counts_cancel_out_are_caught_by_the_identity_check(tmp_path):
    """site-1 keeps an id of its own instead of a shared one: every count NVFlare checks is right, the sets are not;
    the identity check (DH-PSI on ``protocol.verification_items``) sees it and the attempt is retried."""
    held = three_parties(tmp_path / "data")
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs")
    false_positive(run, "site-1", attempts={1}, swap=True)
    result = run.run()
    assert_exact(run, result, held)
    assert result["attempts"] == 2, result
    first = result["failed_attempts"][0]
    if first.startswith("attempt 1: Intersection calculation failed"):
        # DH-PSI intersected in an order in which the two false positives' counts did not cancel (it varies with
        # which party answers first, under load): NVFlare's own count check caught it, before any identity check
        flags = [v for _, v in run.prepares()]  # two attempts, the second checked by the identity check
        assert flags.count(False) == 2 and flags[-2:] == [False, True], (flags, result)
    else:
        assert first.startswith("attempt 1: the parties' intersections are not one set"), result
        assert [v for _, v in run.prepares()] == [False, True, False, True]
    every_id = {i for h in held.values() for ids in h.values() for i in ids}
    assert leaked(all_leaves(run.messages), every_id) == []  # the identity check leaks no id or hash of one either


def test_a_false_positive_in_every_attempt_ends_the_job_after_three_with_nothing_kept(tmp_path):
    three_parties(tmp_path / "data", n_shared=20, n_own=5, n_test=5)
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs")
    false_positive(run, "site-1", attempts={1, 2, 3})
    result = run.run()
    assert result["status"] == "failed" and result["attempts"] == 3 and len(result["failed_attempts"]) == 3, result
    assert result["error"].startswith("DH-PSI failed: its intersections disagreed in all 3 attempts, each with fresh "
                                      "keys"), result
    assert "last: Intersection calculation failed" in result["error"] and run.panics == [result["error"]]
    assert len(run.warnings) == 2 and len(run.prepares()) == 3
    assert "result" not in result["timings_s"] and not list(run.run_root.rglob(INTERSECTION_FILE))


def test_a_new_dh_psi_run_deletes_what_an_earlier_one_left_at_the_site(tmp_path):
    from nvflare.app_common.app_constant import PSIConst

    three_parties(tmp_path / "data", n_shared=5, n_own=1, n_test=2)
    run = InProcessPSI(tmp_path / "data", tmp_path / "runs")
    site, ctx = "site-1", run.site_ctx("site-1")
    executor, handler = run.comps[site]["psi"], run.comps[site][DH_PSI_ID]
    executor.initialize(ctx)
    run.comps[site][LOCAL_PSI_ID].save(["train:stale"])
    handler.intersects = ["train:stale"]
    reply = executor.execute("PSI", Shareable({PSIConst.TASK_KEY: PSIConst.TASK_PREPARE,
                                               PSIConst.BLOOM_FILTER_FPR: 1e-11}), ctx, Signal())
    assert reply["DXO"]["data"][PSIConst.ITEMS_SIZE] == 8 and handler.intersects is None
    assert not list(run.run_root.rglob(INTERSECTION_FILE))
