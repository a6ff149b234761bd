#!/usr/bin/env python
"""What the vertical jobs' PSI phase costs each party: seconds (per DH-PSI stage) and bytes, for 10k, 100k and 1M
ids per party at 50% overlap, 2 and 3 parties (issue 22; goal: 1M ids x 2 parties in under 60 s on 2 cores).

It runs the code path the jobs run: NVFlare's own ``DhPSIWorkFlow`` (the workflow ``DhPSIController`` runs on the
server) sends its tasks through an in-process stand-in for the server's controller straight to one NVFlare
``DhPSITaskHandler`` per party (the handler ``PSIExecutor`` runs at each site), whose replies go back wrapped as
``PSIExecutor`` wraps them. Only FLARE's transport is left out. Each party's items are the job's
(``data.intersection.psi_items``: ``train:<id>``, random 16-hex-digit ids, each party in its own order); every run
checks that every party ends with exactly the shared ids.

Per party: CPU seconds (and wall clock) in each stage (prepare = reading and checking the items, setup = the server
role's encrypted set in a Bloom filter, request = the client role encrypting its items, response = the server role
re-encrypting them, intersect = the client role's decryption and lookups), summed over DH-PSI's forward and backward
passes; bytes = the PSI protobufs in the messages it receives and sends (FLARE's framing not counted). "Each party on
its own core" is the workflow's critical path in CPU seconds: each step takes its slowest party, as parties on their
own machines work at the same time; on an idle core the handler's single-threaded work takes its CPU seconds.
"Measured wall, parties apart" is the same critical path in wall-clock seconds on this shared machine; "one process"
is all parties' work one after the other, as one machine running every party pays it.

    python scripts/bench_psi.py                              # 10k and 100k, 2 and 3 parties, 3 repeats
    python scripts/bench_psi.py --sizes 1000000 --repeats 1  # the 1M rows, added to the stored ones
    python scripts/bench_psi.py --quick                      # 10k only, 1 repeat: a smoke test (no docs block)

Results accumulate in scripts/results/psi_bench.json (one row per size, parties and FPR; a new run replaces its
row) and are written as scripts/results/psi_bench.md and the docs block ``psi``. Medians over ``--repeats``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# the docs page holding each block this script writes (tests/package/test_docs.py checks the markers are there)
BENCH_BLOCKS = {"psi": "docs/benchmarks.md", "psi_summary": "README.md"}
RESULTS = REPO / "scripts" / "results"
STAGES = ("prepare", "setup", "request", "response", "intersect")
DEFAULT_FPR = 1e-11  # DhPSIWorkFlow's default, the one DhPSIController uses
GOAL = {"ids": 1_000_000, "parties": 2, "seconds": 60.0}

from treeflare.data.intersection import psi_items  # noqa: E402
from treeflare.data.partition import random_ids  # noqa: E402
from treeflare.flare.psi.protocol import psi_message_bytes  # noqa: E402
from bench_common import bench_settings, write_bench_block# noqa: E402
from treeflare.files import write_json_atomic, write_text_atomic# noqa: E402


class LocalItems:
    """A party's local PSI component (what ``DhPSITaskHandler`` calls): its items, and what it is told to keep."""

    def __init__(self, items):
        self.items, self.kept = items, None

    def load_items(self):
        return self.items

    def save(self, intersection):
        self.kept = list(intersection)


class Party:
    """One site: NVFlare's DhPSITaskHandler, metered per stage, and the reply wrapped as PSIExecutor does."""

    def __init__(self, name: str, items):
        from nvflare.apis.fl_constant import ReservedKey
        from nvflare.apis.fl_context import FLContext
        from nvflare.app_opt.psi.dh_psi.dh_psi_task_handler import DhPSITaskHandler

        self.name, self.local = name, LocalItems(items)
        self.handler = DhPSITaskHandler(local_psi_id="local_psi")
        self.handler.local_psi_handler = self.local  # what TaskHandler.initialize finds by its id at a site
        self.ctx = FLContext()
        self.ctx.set_prop(ReservedKey.IDENTITY_NAME, name, private=False, sticky=False)
        self.seconds = dict.fromkeys(STAGES, 0.0)  # wall clock per stage
        self.cpu = dict.fromkeys(STAGES, 0.0)  # CPU seconds per stage (the handler's work is single-threaded)
        self.sent = self.received = 0

    def execute(self, task_name: str, shareable):
        from nvflare.apis.dxo import DXO, DataKind
        from nvflare.apis.signal import Signal
        from nvflare.app_common.app_constant import PSIConst

        stage = {PSIConst.TASK_PREPARE: "prepare", PSIConst.TASK_SETUP: "setup", PSIConst.TASK_REQUEST: "request",
                 PSIConst.TASK_RESPONSE: "response", PSIConst.TASK_INTERSECT: "intersect"}[shareable[PSIConst.TASK_KEY]]
        self.received += psi_message_bytes(shareable)
        t, cpu = time.perf_counter(), time.process_time()
        result = self.handler.execute_task(task_name, shareable, self.ctx, Signal())
        seconds, cpu = time.perf_counter() - t, time.process_time() - cpu
        self.seconds[stage] += seconds
        self.cpu[stage] += cpu
        self.sent += psi_message_bytes(result)
        return DXO(data_kind=DataKind.PSI, data=result).to_shareable(), seconds, cpu


class InProcessController:
    """Stands in for the server's controller under DhPSIWorkFlow: every task goes straight to its target parties
    and their results to the task's callback, as FLARE delivers them. Records each step's slowest party (wall
    clock and CPU seconds)."""

    abort_job_in_error: dict = {}

    def __init__(self, parties: dict[str, Party]):
        self.parties = parties
        self.steps: list[list] = []  # [the step's BroadcastAndWait, slowest party's wall s, its CPU s], in order

    def broadcast_and_wait(self, task, fl_ctx, targets=None, min_responses=1, wait_time_after_min_received=0,
                           abort_signal=None):
        for name in (targets or list(self.parties)):
            self._deliver(task, name, fl_ctx)

    def send(self, task, fl_ctx, targets=None, **_):
        for name in targets:
            self._deliver(task, name, fl_ctx)

    def get_num_standing_tasks(self) -> int:
        return 0  # every task was answered when send returned

    def _deliver(self, task, target, fl_ctx):
        from nvflare.apis.client import Client
        from nvflare.apis.controller_spec import ClientTask

        name = getattr(target, "name", target)
        result, seconds, cpu = self.parties[name].execute(task.name, task.data)
        step = task.result_received_cb.__self__  # one BroadcastAndWait per workflow step (kept: ids get reused)
        if self.steps and self.steps[-1][0] is step:
            self.steps[-1][1:] = [max(self.steps[-1][1], seconds), max(self.steps[-1][2], cpu)]
        else:
            self.steps.append([step, seconds, cpu])
        client_task = ClientTask(Client(name, None), task)
        client_task.result = result
        task.result_received_cb(client_task=client_task, fl_ctx=fl_ctx)


def party_items(n: int, n_parties: int, overlap: float, seed: int):
    """Each party's items (n each; ``overlap`` of them held by all), in its own order, and the shared ids."""
    import numpy as np

    shared_n = int(round(n * overlap))
    ids = random_ids(shared_n + n_parties * (n - shared_n), seed)
    shared = ids[:shared_n]
    items = []
    for i in range(n_parties):
        own = ids[shared_n + i * (n - shared_n): shared_n + (i + 1) * (n - shared_n)]
        mine = np.random.default_rng([seed, i]).permutation(np.concatenate([shared, own]))
        items.append(psi_items({"train": mine.tolist()}))
    return items, set(psi_items({"train": shared.tolist()}))


def run_workflow(items: list[list[str]], fpr: float = DEFAULT_FPR):
    """NVFlare's DhPSIWorkFlow over parties ``site-1..`` holding ``items``: (parties, controller, seconds)."""
    from nvflare.apis.fl_constant import ReservedKey
    from nvflare.apis.fl_context import FLContext
    from nvflare.apis.signal import Signal
    from nvflare.app_common.psi.dh_psi.dh_psi_workflow import DhPSIWorkFlow

    parties = {f"site-{i + 1}": Party(f"site-{i + 1}", it) for i, it in enumerate(items)}
    controller = InProcessController(parties)

    class Engine:  # what DhPSIWorkFlow.prepare_sites asks of the server's engine
        @staticmethod
        def get_clients():
            return list(parties)

    ctx = FLContext()
    ctx.set_prop(ReservedKey.ENGINE, Engine(), private=True, sticky=False)
    workflow = DhPSIWorkFlow(bloom_filter_fpr=fpr)
    workflow.initialize(ctx, controller=controller)
    signal = Signal()
    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # BroadcastAndWait prints a line per result
        workflow.pre_process(signal)
        workflow.run(signal)
        workflow.post_process(signal)
    return parties, controller, time.perf_counter() - t


def one_run(n: int, n_parties: int, overlap: float, fpr: float, seed: int) -> dict:
    """One PSI of ``n_parties`` parties through NVFlare's DhPSIWorkFlow; per-party seconds and bytes."""
    items, expected = party_items(n, n_parties, overlap, seed)
    parties, controller, total = run_workflow(items, fpr)
    for p in parties.values():
        if p.local.kept is None or set(p.local.kept) != expected:
            raise RuntimeError(f"{p.name}: DH-PSI kept {len(p.local.kept or [])} items, expected {len(expected)}")
    return {"intersection": len(expected), "one_process_s": total, "critical_path_s": sum(s[1] for s in controller.steps),
            "critical_path_cpu_s": sum(s[2] for s in controller.steps),
            "cpu_s": sum(sum(p.cpu.values()) for p in parties.values()),
            "parties": {p.name: {"seconds": dict(p.seconds), "cpu": dict(p.cpu), "total_s": sum(p.seconds.values()),
                                 "cpu_s": sum(p.cpu.values()), "sent": p.sent, "received": p.received}
                        for p in parties.values()}}


def median_row(runs: list[dict]) -> dict:
    med = statistics.median
    parties = runs[0]["parties"]
    return {
        "intersection": runs[0]["intersection"], "repeats": len(runs),
        "one_process_s": med(r["one_process_s"] for r in runs),
        "critical_path_s": med(r["critical_path_s"] for r in runs),
        "critical_path_cpu_s": med(r["critical_path_cpu_s"] for r in runs),
        "cpu_s": med(r["cpu_s"] for r in runs),
        "parties": {name: {"seconds": {s: med(r["parties"][name]["seconds"][s] for r in runs) for s in STAGES},
                           "cpu": {s: med(r["parties"][name]["cpu"][s] for r in runs) for s in STAGES},
                           "total_s": med(r["parties"][name]["total_s"] for r in runs),
                           "cpu_s": med(r["parties"][name]["cpu_s"] for r in runs),
                           "sent": med(r["parties"][name]["sent"] for r in runs),
                           "received": med(r["parties"][name]["received"] for r in runs)} for name in parties},
        "runs": runs,
    }


def key(n: int, parties: int, fpr: float) -> str:
    return f"{n}x{parties}@{fpr:g}"


def md_table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def mb(b: float) -> str:
    return f"{b / 1e6:.1f}"


def readme_table(rows: dict) -> str:
    """The README's short form: DhPSIController's own FPR only, the critical path's CPU and wall, what a party
    sends; the full tables and where the time goes are in docs/benchmarks.md."""
    ordered = sorted((r for r in rows.values() if r["fpr"] == DEFAULT_FPR), key=lambda r: (r["ids"], r["parties_n"]))
    head = ["ids per party (50% held by all)", "parties", "CPU on DH-PSI's critical path (s)", "measured wall (s)",
            "most sent by a party (MB)", "repeats", "load avg 1m at start"]
    body = [[f"{r['ids']:,}", str(r["parties_n"]), f"{r['critical_path_cpu_s']:.1f}", f"{r['critical_path_s']:.1f}",
             mb(max(x["sent"] for x in r["parties"].values())), str(r["repeats"]), f"{r['loadavg_start']:.1f}"]
            for r in ordered]
    goal = rows.get(key(GOAL["ids"], GOAL["parties"], DEFAULT_FPR))
    verdict = "" if goal is None else (
        f"Goal {GOAL['ids']:,} ids x {GOAL['parties']} parties under {GOAL['seconds']:g} s: "
        f"**{'met' if goal['critical_path_s'] < GOAL['seconds'] else 'not met'}** "
        f"({goal['critical_path_cpu_s']:.0f} CPU seconds even with each party on an idle core of its own). ")
    return "\n".join([md_table(head, body), "", verdict + "Written by `scripts/bench_psi.py` (medians; rows dated, "
                      "settings and where the time goes: [docs/benchmarks.md](docs/benchmarks.md#psi-before-vertical-"
                      "training))."])


def tables(rows: dict) -> str:
    ordered = sorted(rows.values(), key=lambda r: (r["fpr"] != DEFAULT_FPR, r["ids"], r["parties_n"], r["fpr"]))
    head = ["ids per party", "parties", "Bloom FPR", "repeats", "intersection", "each party on its own core: CPU (s)",
            "measured wall, parties apart (s)", "all parties in one process: wall / CPU (s)",
            "most sent / received by a party (MB)", "load avg 1m (start, end)", "row finished"]
    summary = []
    for r in ordered:
        p = r["parties"].values()
        summary.append([f"{r['ids']:,}", str(r["parties_n"]), f"{r['fpr']:g}", str(r["repeats"]),
                        f"{r['intersection']:,}", f"{r['critical_path_cpu_s']:.1f}", f"{r['critical_path_s']:.1f}",
                        f"{r['one_process_s']:.1f} / {r['cpu_s']:.1f}",
                        f"{mb(max(x['sent'] for x in p))} / {mb(max(x['received'] for x in p))}",
                        f"{r['loadavg_start']:.1f}, {r['loadavg_end']:.1f}", r["time"]])
    detail_head = ["ids per party", "parties", "Bloom FPR", "party", *[f"{s} CPU (s)" for s in STAGES],
                   "total CPU (s)", "total wall (s)", "sent (MB)", "received (MB)"]
    detail = []
    for r in ordered:
        for name, x in r["parties"].items():
            detail.append([f"{r['ids']:,}", str(r["parties_n"]), f"{r['fpr']:g}", name,
                           *[f"{x['cpu'][s]:.2f}" for s in STAGES], f"{x['cpu_s']:.1f}", f"{x['total_s']:.1f}",
                           mb(x["sent"]), mb(x["received"])])
    goal = rows.get(key(GOAL["ids"], GOAL["parties"], DEFAULT_FPR))
    target = f"Goal, {GOAL['ids']:,} ids x {GOAL['parties']} parties in under {GOAL['seconds']:g} s"
    if goal is None:
        verdict = f"{target}: not measured yet."
    else:
        met = goal["critical_path_s"] < GOAL["seconds"]
        verdict = (f"{target}: **{'met' if met else 'not met'}**: {goal['critical_path_s']:.0f} s measured wall "
                   f"(load average {goal['loadavg_start']:.1f} at start), {goal['critical_path_cpu_s']:.0f} CPU "
                   f"seconds along DH-PSI's critical path, i.e. what it takes with each party on an idle core of its "
                   f"own ({goal['repeats']} repeat(s)).")
    for r in ordered:  # what another Bloom filter false-positive rate changes, against DhPSIController's
        base = rows.get(key(r["ids"], r["parties_n"], DEFAULT_FPR))
        if r["fpr"] != DEFAULT_FPR and base is not None:
            sent = lambda row: max(x["sent"] for x in row["parties"].values())  # noqa: E731
            verdict += (f" Bloom FPR {r['fpr']:g} instead of {DEFAULT_FPR:g} ({r['ids']:,} ids x {r['parties_n']}): "
                        f"{r['critical_path_cpu_s']:.1f} CPU s against {base['critical_path_cpu_s']:.1f}, "
                        f"{mb(sent(r))} MB sent by a party against {mb(sent(base))}.")
    return "\n".join([md_table(head, summary), "", "Where the time goes (medians per party, CPU seconds per stage "
                      "summed over DH-PSI's forward and backward passes):", "", md_table(detail_head, detail), "",
                      verdict])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000", help="ids per party, comma-separated (default 10000,100000)")
    ap.add_argument("--parties", default="2,3", help="numbers of parties, comma-separated (default 2,3)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per row; the tables show medians (default 3)")
    ap.add_argument("--overlap", type=float, default=0.5, help="each party's share of its ids all hold (default 0.5)")
    ap.add_argument("--fpr", type=float, default=DEFAULT_FPR,
                    help=f"the Bloom filter's false-positive rate (default {DEFAULT_FPR:g}, DhPSIController's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="10k ids, 2 and 3 parties, 1 repeat; no docs block")
    ap.add_argument("--no-docs", action="store_true", help="do not write the docs block")
    ap.add_argument("--render-only", action="store_true",
                    help="measure nothing: rewrite the tables and the docs block from the stored results")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = "10000", 1
    logging.getLogger("nvflare").setLevel(logging.WARNING)
    stem = "psi_bench_quick" if args.quick else "psi_bench"
    store = RESULTS / f"{stem}.json"
    if args.quick:
        write_json_atomic(store, {"rows": {}})
    for n in ([] if args.render_only else (int(s) for s in args.sizes.split(","))):
        for k in (int(s) for s in args.parties.split(",")):
            load0 = os.getloadavg()[0]
            runs = []
            for rep in range(args.repeats):
                runs.append(one_run(n, k, args.overlap, args.fpr, args.seed + rep))
                print(f"{n:>9,} ids x {k} parties, run {rep + 1}/{args.repeats}: "
                      f"{runs[-1]['critical_path_s']:.1f} s own machines, {runs[-1]['one_process_s']:.1f} s one "
                      f"process (load {os.getloadavg()[0]:.1f})", flush=True)
            row = median_row(runs)
            row.update(ids=n, parties_n=k, fpr=args.fpr, overlap=args.overlap, loadavg_start=load0,
                       loadavg_end=os.getloadavg()[0],
                       **{k2: v for k2, v in bench_settings(seed=args.seed).items() if k2 in ("time", "commit", "cores")})
            # kept after every row (a long run interrupted keeps what it measured), merged into the stored rows
            # read afresh, so two runs of this script (say 100k and 1M at once) keep each other's rows
            doc = _stored(store)
            doc["rows"][key(n, k, args.fpr)] = row
            write_json_atomic(store, doc)
    text = tables(_stored(store)["rows"])
    note = (f"`scripts/bench_psi.py` (NVFlare {_nvflare_version()}, openmined-psi DH-PSI, P-256), in one process on "
            f"this {os.cpu_count()}-core machine shared with other work: each row's date, load average (1 minute, "
            f"at its start and end) and repeats are beside it; medians over the repeats (seeds 0..repeats-1; ids "
            f"random, {args.overlap:g} of each party's held by all). Commands: `python scripts/bench_psi.py` "
            f"(10k, 100k), `--sizes 1000000 --repeats 1` (1M), `--sizes 100000 --parties 2 --fpr 1e-6` (the FPR row).")
    write_text_atomic(RESULTS / f"{stem}.md", "# DH-PSI per party\n\n" + text + "\n\n" + note + "\n")
    print(text)
    if not args.quick and not args.no_docs:
        write_bench_block(REPO / BENCH_BLOCKS["psi"], "psi", text + "\n\n" + note)
        write_bench_block(REPO / BENCH_BLOCKS["psi_summary"], "psi_summary", readme_table(_stored(store)["rows"]))
    print(f"wrote {RESULTS / (stem + '.md')} and .json")


def _stored(store: Path) -> dict:
    return json.loads(store.read_text()) if store.exists() else {"rows": {}}


def _nvflare_version() -> str:
    import nvflare

    return getattr(nvflare, "__version__", "?")


if __name__ == "__main__":
    main()
