#!/usr/bin/env python
"""Every job across hosts, and the faults real networks have, measured on a lab of network namespaces.

    sudo flock /tmp/treeflare-bench.lock .venv/bin/python scripts/netlab.py --all      # the whole matrix
    sudo .venv/bin/python scripts/netlab_faults.py --only xgb_direct,port_blocked       # some rows (names: --list)

One :class:`netlab.NetLab` (a server, ``--sites`` sites and an admin, each in its own network namespace with its own
host name, kits provisioned for ``fl-server.treeflare.test``) runs everything, in order. The sites' data is bound
at each site (``app/site_setup.py bind``, adult for the horizontal jobs, car split by columns for the vertical
ones); every job is submitted from the admin's namespace as a user would: ``job.py --env prod --startup-kit``,
``nvflare job submit/wait/download`` on exported jobs, and the admin console (``fl_admin.sh``: ``check_status``,
``list_jobs``, ``download_job``). Each result is checked (report contents, models, predictions), not just a return
code.

Faults are injected at the network (a veth taken down at the bridge, a token bucket on a link, one port dropped by
a ``tc`` filter) or at the processes (SIGKILL of a host's every process, a kit stopped and started). Each row
records what happened (the job's final status and the reason its result file gives), the seconds from the fault
to the job's end (time to detect), and what was lost. A row whose expectation is not met says so (``met: no``):
the table is a measurement, not a wish.

Writes ``scripts/results/netlab/faults.{md,json}`` and the block ``netlab_faults`` in docs/DEPLOY.md (a run of
only some rows, ``--only``, writes ``faults_partial.*`` and no block).

(Over 400 lines: the matrix is one ordered scenario whose rows share the lab, the exported jobs and the data; split
up, each part would need the same setup passed around.)
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "scripts")]  # netlab.py beside it, also when this file is loaded by path

from bench_common import bench_settings, write_bench_block# noqa: E402

from treeflare.files import write_json_atomic, write_text_atomic# noqa: E402

RESULTS = REPO / "scripts" / "results" / "netlab"
BENCH_BLOCKS = {"netlab_faults": "docs/DEPLOY.md"}
PY = sys.executable
NVFLARE = str(Path(sys.executable).parent / "nvflare")
JOB_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

# The settings every row runs with (also written beside the table).
SETTINGS = {
    "horizontal data": "adult, IID over the sites, seed 0 (scripts/prepare_data.py), bound at each site",
    "vertical data": "car split by columns (site-1: label + columns, 2 passive parties), seed 0, bound as 'vertical'",
    "icdta4fl": "CART, max depth 4, growth from the root (the default: 8 rounds of masked counts), --task-timeout 60 s",
    "xgboost": "depth 4, eta 0.1, 1 thread per site; 'direct' on port 8003 with mutual TLS, connect timeout 30 s, "
               "heartbeat timeout 120 s (the defaults); 400 rounds for the fault runs",
    "vertical": "1 tree, max depth 3, 1024-bit Paillier key (--allow-insecure-key: a test setting), "
                "--task-timeout 60 s",
    "NVFlare": "2.9 kits from configs/project.yml; server started with NVFLARE_CLIENT_OUTCOME_WAIT_TIMEOUT=5",
}
ICD_ARGS = ["--algorithm", "cart", "--max-depth", "4", "--task-timeout", "60"]
XGB_ARGS = ["--max-depth", "4", "--eta", "0.1", "--nthread", "1", "--baselines", "", "--task-timeout", "120"]
VT_ARGS = ["--passive", "2", "--binding", "vertical", "--model", "tree", "--max-depth", "3", "--key-bits", "1024",
           "--allow-insecure-key", "--workers", "1", "--task-timeout", "60", "--no-oracle", "--no-baseline"]
FAULT_ROUNDS = 400  # XGBoost rounds in the runs a fault interrupts: long enough to be mid-job when it strikes
SLOW_ROUNDS = 100
SLOW_RATE = "10mbit"


class RowFailed(AssertionError):
    """A row's check did not hold; the message is what the table says."""


def check(cond, message: str) -> None:
    if not cond:
        raise RowFailed(message)


def short(text, n: int = 220) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= n else text[: n - 3] + "..."


# --------------------------------------------------------------------------------------------- network helpers
def block_port(lab, role: str, port: int) -> None:
    """Drop every TCP packet ``role`` sends to ``port`` (as a firewall would), on its own eth0. This kernel has no
    ``tc`` drop action and no prio qdisc; an htb class whose queue holds nothing (pfifo limit 0) drops what a u32
    filter sends to it, everything else passes by the default class."""
    ns = lab.ns(role)

    def tc(*args):
        subprocess.run(["ip", "netns", "exec", ns, "tc", *map(str, args)], check=True, capture_output=True,
                       text=True, timeout=30)

    tc("qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10")
    tc("class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit")
    tc("class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb", "rate", "8bit", "ceil", "8bit")
    tc("qdisc", "add", "dev", "eth0", "parent", "1:20", "handle", "20:", "pfifo", "limit", "0")
    tc("filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip",
       "protocol", "6", "0xff", "match", "ip", "dport", port, "0xffff", "flowid", "1:20")


def unblock_port(lab, role: str) -> None:
    subprocess.run(["ip", "netns", "exec", lab.ns(role), "tc", "qdisc", "del", "dev", "eth0", "root"],
                   capture_output=True, timeout=30)


# --------------------------------------------------------------------------------------------- the matrix
class Matrix:
    """The lab, the data, the exported jobs and the rows measured so far."""

    def __init__(self, lab, work: Path, sites: int):
        import netlab

        self.netlab = netlab
        self.lab = lab
        self.work = work
        self.sites = [f"site-{i + 1}" for i in range(sites)]
        self.rows: list[dict] = []
        self.exported: dict = {}
        self.label = "income"

    # ------------------------------------------------------------------ running things as the admin
    def py(self, script: str, *args, timeout: float = 600, role: str = "admin", check_rc: bool = True):
        r = self.lab.exec(role, [PY, REPO / script, *map(str, args)], timeout=timeout, cwd=self.work)
        if check_rc and r.returncode:
            raise RowFailed(f"{script} exited {r.returncode}: {short(r.stderr[-1500:] or r.stdout[-1500:], 600)}")
        return r

    def job_prod(self, job: str, args, ws: str, timeout: float = 900):
        t = time.perf_counter()
        r = self.netlab.run_job_prod(self.lab, job, list(map(str, args)), self.work / ws, timeout=timeout)
        secs = time.perf_counter() - t
        if r.returncode:
            raise RowFailed(f"{job} --env prod exited {r.returncode}: {short(r.stderr[-1500:] or r.stdout[-800:], 600)}")
        return r, secs

    def export(self, key: str, job: str, args) -> Path:
        if key not in self.exported:
            out = self.work / "exported" / key
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            self.exported[key] = self.netlab.export_job(self.lab, job, [*map(str, args), "--workspace",
                                                                         self.work / "export_ws" / key], out)
        return self.exported[key]

    def result_of(self, job_id: str, name: str) -> dict:
        """The server's result file of ``job_id`` (downloaded as the admin does); {} if there is none."""
        return self._fetch(job_id, name, self.work / "downloads")[0]

    def _fetch(self, job_id: str, name: str, dest_root: Path) -> tuple[dict, str]:
        """``nvflare job download`` of ``job_id`` into ``dest_root``: (its result file ``name`` or {}, '' or what went
        wrong, from NVFlare's own answer)."""
        dest_root.mkdir(parents=True, exist_ok=True)
        try:  # NVFlare names the folder <job id>__N when it has downloaded that job before: use the path it gives
            out = self.lab._json_of(self.lab.nvflare("job", "download", job_id, "-o", dest_root, "--force",
                                                     timeout=180))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            return {}, f"download failed: {short(exc, 300)}"
        data = out.get("data") or {}
        dest = Path(data.get("download_path") or data.get("path") or dest_root / job_id)
        if out.get("status") != "ok":
            return {}, f"download {out.get('status')}: {short(out.get('error_code') or out.get('detail') or data, 300)}"
        found = sorted(dest.rglob(name)) if dest.is_dir() else []
        if not found:
            return {}, f"downloaded, but no {name} under {dest.name}/"
        return json.loads(found[0].read_text()), ""

    def admin_console(self, commands: list[str], timeout: float = 120) -> str:
        """The admin console as a person types it: ``startup/fl_admin.sh`` with ``commands`` on its input."""
        kit = self.lab.admin_kit
        script = "\n".join([*commands, "bye", ""])
        proc = self.lab.popen("admin", ["bash", kit / "startup" / "fl_admin.sh"], cwd=kit, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = proc.communicate(script, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        return out or ""

    def last_heard(self, site: str) -> float | None:
        """When the server last heard from ``site`` (``client_last_conn_time`` of ``nvflare system status``, epoch
        seconds on this machine's clock, which every namespace shares)."""
        try:
            out = self.lab._json_of(self.lab.nvflare("system", "status", timeout=60))
        except (RuntimeError, subprocess.TimeoutExpired):
            return None
        for c in (out.get("data") or {}).get("clients") or []:
            if c.get("client_name") == site:
                return c.get("client_last_conn_time")
        return None

    def link_restored(self, site: str, timeout: float = 300) -> float | None:
        """Bring ``site``'s link back; seconds until the server hears from it again (None: not within ``timeout``).
        A cut-off site's TCP connection to the server often carries on once the link is back, so what is measured is
        the server hearing from it, not a new connection."""
        t, wall = time.monotonic(), time.time()
        self.lab.link_up(site)
        while time.monotonic() - t < timeout:
            heard = self.last_heard(site)
            if heard is not None and heard > wall:
                return round(heard - wall, 1)
            time.sleep(1.0)
        return None

    def settle(self, timeout: float = 180) -> float:
        """Every site connected again; seconds it took."""
        t = time.monotonic()
        self.lab.wait_connected(self.sites, timeout=timeout)
        return time.monotonic() - t

    def no_job_running(self, timeout: float = 120) -> None:
        """Wait until the server runs no job (the previous one's processes gone), so rows do not overlap."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                jobs = self._jobs()
            except (RuntimeError, subprocess.TimeoutExpired):
                jobs = {}
            if not any(str(s).startswith(("RUNNING", "DISPATCHED", "SUBMITTED")) for s in jobs.values()):
                return
            time.sleep(2)

    # ------------------------------------------------------------------ one row
    def row(self, name: str, kind: str, fault: str, expected: str, fn) -> dict:
        print(f"\n=== {name}: {fault}", flush=True)
        t0 = time.perf_counter()
        row = {"name": name, "kind": kind, "fault": fault, "expected": expected}
        try:
            row.update(fn() or {})
            row.setdefault("met", True)
        except Exception as exc:  # a row that cannot complete is a result too: say so plainly
            row.update(met=False, happened=f"check failed: {short(exc, 600)}")
            row.setdefault("detail", traceback.format_exc()[-3000:])
        row["seconds"] = round(time.perf_counter() - t0, 1)
        row["loadavg"] = [round(x, 2) for x in os.getloadavg()]
        self.rows.append(row)
        print(f"--- {name}: {'met' if row['met'] else 'NOT MET'}: {row.get('happened')} "
              f"(detect {row.get('detect_s')}, {row['seconds']} s)", flush=True)
        return row

    # ------------------------------------------------------------------ setup
    def prepare(self) -> None:
        t = time.perf_counter()
        self.lab.prepare_sites_data("--dataset", "adult", "--partition", "iid", "--seed", "0")
        vdir = self.lab.dir / "vdata"
        r = self.netlab.run([PY, REPO / "scripts" / "prepare_data.py", "--dataset", "car", "--vertical", "--passive",
                             "2", "--seed", "0", "--out", vdir], check=False, timeout=300, env=self.lab.env("admin"),
                            cwd=REPO)
        if r.returncode:
            raise RuntimeError(f"prepare_data.py --vertical failed: {r.stderr[-2000:]}")
        self.vertical_id = json.loads((vdir / "partition.json").read_text()).get("id_column") or "row_id"
        for site in self.sites:
            extra = ["--label-column", "class"] if site == "site-1" else []
            self.lab.bind(site, vdir / site, "--name", "vertical", "--id-column", self.vertical_id, *extra)
        self.vdir = vdir
        self.prep_s = time.perf_counter() - t

    # ================================================================== jobs across hosts
    def job_rows(self) -> None:
        n = len(self.sites)
        self.row("schema_discovery", "job", "-", "the sites' schemas merged; label, classes and features found",
                 self.schema_discovery)
        self.row("icdta4fl_cli", "job", "-", "nvflare job submit/wait/download of the exported job: completed on "
                 "every site with its refinement round; tree and per-site scores present", self.icdta4fl_cli)
        self.row("admin_console", "job", "-", "check_status lists every site, list_jobs the job, download_job "
                 "fetches its result", self.admin_console_row)
        self.row("xgb_direct", "job", "-", f"job.py --env prod: XGBoost direct with mutual TLS on {n} sites, "
                 "identical models on every rank, AUC > 0.85", self.xgb_direct)
        self.row("xgb_tls_refusals", "job", "-", "on the XGBoost port while it trains: a site's certificate with the "
                 "server's name accepted; a name not in the server certificate, and a client without a certificate, "
                 "refused", self.xgb_tls)
        self.row("xgb_flare", "job", "-", "--transport flare: completed, AUC > 0.85", self.xgb_flare)
        self.row("vertical_tree", "job", "-", "the vertical job (PSI, Paillier) completes; accuracy > 0.72 (majority class: 0.70)",
                 self.vertical)
        self.row("vertical_predict", "job", "-", "its prediction job writes one prediction per shared row at the "
                 "active site", self.vertical_predict)

    def schema_discovery(self) -> dict:
        r = self.py("scripts/schema.py", "discover", "--sites", len(self.sites), "--label", self.label, "--env",
                    "prod", "--startup-kit", self.lab.admin_kit, "--workspace", self.work / "discovery", "--out",
                    self.work / "schema.json", "--task-timeout", 60, timeout=600)
        schema = json.loads((self.work / "schema.json").read_text())
        check(schema.get("label") == self.label, f"label {schema.get('label')!r}")
        check(len(schema.get("classes") or []) == 2, f"classes {schema.get('classes')}")
        check(len(schema.get("features") or []) >= 10, f"{len(schema.get('features') or [])} features")
        r2 = self.py("scripts/schema.py", "discover", "--sites", len(self.sites), "--vertical", "--label", "class",
                     "--id", self.vertical_id, "--binding", "vertical", "--env", "prod", "--startup-kit",
                     self.lab.admin_kit, "--workspace", self.work / "vdiscovery", "--out",
                     self.work / "vertical_schema.json", "--task-timeout", 60, timeout=600)
        vs = json.loads((self.work / "vertical_schema.json").read_text())
        parties = sorted({f.get("party") for f in vs.get("features") or []})
        check(parties == self.sites, f"vertical schema parties {parties}")
        return {"happened": f"horizontal: label {schema['label']}, {len(schema['features'])} features, classes "
                            f"{schema['classes']}; vertical: features held by {', '.join(parties)}",
                "detail": short(r.stdout[-600:] + r2.stdout[-300:], 900)}

    def icdta4fl_cli(self) -> dict:
        job = self.export("icdta4fl", "icdta4fl", ["--schema", self.work / "schema.json", "--sites",
                                                    len(self.sites), *ICD_ARGS])
        t = time.perf_counter()
        job_id = self.lab.submit(job)
        status = self.lab.wait_job(job_id, timeout=900)
        secs = time.perf_counter() - t
        check(status == "FINISHED:COMPLETED", f"status {status}")
        dest = self.lab.download(job_id, self.work / "downloads")
        result = json.loads(next(dest.rglob("icdta4fl_result.json")).read_text())
        check(result.get("status") == "completed" and not result.get("dropped_sites"),
              f"result {result.get('status')}: {result.get('error')} dropped {result.get('dropped_sites')}")
        check(sorted(result.get("sites") or {}) == self.sites, f"sites {sorted(result.get('sites') or {})}")
        refine = result.get("refinement") or {}
        rounds = refine.get("rounds") or []
        adoption = refine.get("adoption") or [{}]
        # every round asked was summed (growth may end early when nothing is left to split); the grown tree is then
        # adopted or not by the sites' validation rows, either is a completed protocol
        check(rounds and not any(e.get("failed") for e in rounds) and len(rounds) <= refine.get("rounds_requested")
              and (refine.get("status") == "completed" or "not adopted" in refine.get("status", "")),
              f"refinement {refine.get('status')}, {len(rounds)} rounds of {refine.get('rounds_requested')}")
        check(next(dest.rglob("global_tree.json"), None) is not None, "no global_tree.json downloaded")
        accs = {s: round(v["global"]["accuracy"], 3) for s, v in result["sites"].items()}
        check(all(0.75 < a <= 1 for a in accs.values()), f"per-site accuracies {accs}")
        self.icd_job = job_id
        return {"happened": f"{status}; sites {', '.join(result['sites'])}; refinement {len(rounds)} rounds, "
                            f"{short(adoption[-1].get('why'), 140)}; per-site accuracy {accs}",
                "job_s": round(secs, 1)}

    def admin_console_row(self) -> dict:
        dest = self.work / "console_download"
        out = self.admin_console([self.netlab.ADMIN_USER, "check_status server", "check_status client",
                                  "list_jobs", f"download_job {self.icd_job}"])
        missing = [s for s in self.sites if s not in out]
        check(not missing, f"check_status does not list {missing}: {short(out[-800:], 800)}")
        check(self.icd_job in out, f"list_jobs does not show {self.icd_job}: {short(out[-800:], 800)}")
        downloaded = list(Path(self.lab.admin_kit).rglob(f"{self.icd_job}/**/icdta4fl_result.json"))
        check(downloaded, f"download_job left no result under the admin kit: {short(out[-600:], 600)}")
        dest.mkdir(exist_ok=True)
        return {"happened": f"check_status: server and {len(self.sites)} sites; list_jobs: {self.icd_job[:8]}... "
                            f"FINISHED:COMPLETED; download_job: {downloaded[0].relative_to(self.lab.admin_kit)}"}

    def _xgb_report(self, ws: Path) -> dict:
        report = json.loads((ws / "report.json").read_text())
        return report

    def _xgb_auc(self, report: dict) -> float:
        v = report.get("validation") or {}
        sites = v.get("sites") or {}
        aucs = [s.get("auc") for s in sites.values() if isinstance(s, dict) and s.get("auc") is not None]
        return float(aucs[0]) if aucs else float("nan")

    def xgb_direct(self, rounds: int = SLOW_ROUNDS, ws: str = "xgb_direct") -> dict:
        r, secs = self.job_prod("xgb_histogram", ["--schema", self.work / "schema.json", "--sites", len(self.sites),
                                                  *XGB_ARGS, "--rounds", rounds], ws)
        report = self._xgb_report(self.work / ws)
        auc = self._xgb_auc(report)
        t = report.get("transport") or {}
        models = t.get("models_identical")
        check(models is True, f"models identical: {models}")
        check(auc > 0.85, f"AUC {auc}")
        check((self.work / ws / "model.json").is_file(), "no model.json")
        fs = t.get("federated_server") or {}
        check(fs.get("tls") is True, f"federated server TLS {fs.get('tls')}")
        self.unshaped = {"direct_run": _run_s(report), "direct_train": _train_s(report)}
        return {"happened": f"completed, {rounds} rounds, models identical on every rank, TLS on, site-1's AUC "
                            f"{auc:.4f}; run {_run_s(report)} s (training {_train_s(report)} s)",
                "job_s": round(secs, 1), "run_s": _run_s(report), "train_s": _train_s(report)}

    def xgb_flare(self, rounds: int = SLOW_ROUNDS, ws: str = "xgb_flare") -> dict:
        r, secs = self.job_prod("xgb_histogram", ["--schema", self.work / "schema.json", "--sites", len(self.sites),
                                                  *XGB_ARGS, "--rounds", rounds, "--transport", "flare"], ws)
        report = self._xgb_report(self.work / ws)
        auc = self._xgb_auc(report)
        check(auc > 0.85, f"AUC {auc}")
        self.unshaped = {**getattr(self, "unshaped", {}), "flare_run": _run_s(report)}
        return {"happened": f"completed, {rounds} rounds, site-1's AUC {auc:.4f}; run {_run_s(report)} s",
                "job_s": round(secs, 1), "run_s": _run_s(report)}

    def xgb_tls(self) -> dict:
        """Probe the XGBoost port from site-1's namespace while a long direct job trains."""
        job = self.export("xgb_long", "xgb_histogram", ["--schema", self.work / "schema.json", "--sites",
                                                         len(self.sites), *XGB_ARGS, "--rounds", FAULT_ROUNDS])
        job_id = self.lab.submit(job)
        try:
            self._wait_listening(job_id)
            kit = self.lab.kits["site-1"] / "startup"
            probe = PROBE.format(ca=str(kit / "rootCA.pem"), key=str(kit / "client.key"), cert=str(kit / "client.crt"),
                                 port=self.lab.xgb_port)
            r = self.lab.exec("site-1", [PY, "-c", probe, self.netlab.SERVER_NAME, self.lab.address("server")],
                              timeout=120)
            got = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
            check(got.get("good") is True, f"a site's certificate with the server's name was not accepted: {got} "
                                           f"{short(r.stderr, 400)}")
            check(got.get("wrong_name") is False, f"a name not in the certificate was accepted: {got}")
            check(got.get("no_cert") is False, f"a client without a certificate was accepted: {got}")
            check(got.get("plain") is False, f"plain TCP was accepted: {got}")
        finally:
            self._abort(job_id)
        return {"happened": f"{self.netlab.SERVER_NAME}:{self.lab.xgb_port} with site-1's certificate: accepted; "
                            f"{self.lab.address('server')} (not in the certificate): refused; no client "
                            "certificate: refused; plain TCP: refused"}

    def _wait_listening(self, job_id: str, timeout: float = 240, settle: float = 3.0) -> float:
        """Until XGBoost's federated server of ``job_id`` listens (then ``settle`` seconds more: the sites connect
        and start their rounds); returns time.monotonic() when it was first seen listening."""
        deadline = time.monotonic() + timeout
        log = self.lab.kits["server"] / job_id / "xgb_federated_server.log"
        while time.monotonic() < deadline:
            if log.is_file() and "listening" in log.read_text(errors="replace"):
                seen = time.monotonic()
                time.sleep(settle)
                return seen
            time.sleep(0.2)
        raise RowFailed(f"XGBoost's federated server of job {job_id} did not listen within {timeout:.0f} s")

    def _abort(self, job_id: str) -> None:
        self.lab.nvflare("job", "abort", job_id, "--force", timeout=60)
        try:
            self.lab.wait_job(job_id, timeout=120)
        except Exception:
            pass
        self.no_job_running()

    def vertical(self) -> dict:
        r, secs = self.job_prod("vertical_tree", ["--schema", self.work / "vertical_schema.json", *VT_ARGS], "vt")
        report = json.loads((self.work / "vt" / "report.json").read_text())
        acc = (report.get("global") or {}).get("accuracy")
        check(acc is not None and acc > 0.72, f"accuracy {acc} (the majority class is 0.70 of the test rows)")
        psi = report.get("psi") or {}
        check(psi.get("status") == "completed", f"psi {psi.get('status')}")
        job_ids = JOB_ID.findall(r.stdout + r.stderr)
        self.vt_job = job_ids[-1] if job_ids else None
        return {"happened": f"completed; PSI kept {report.get('n_train')} training rows; accuracy {acc:.3f}",
                "job_s": round(secs, 1)}

    def vertical_predict(self) -> dict:
        check(getattr(self, "vt_job", None), "no training job id (vertical_tree did not run)")
        for site in self.sites:  # each site copies its part of the model and puts its new rows beside it
            run_dir = self.lab.kits[site] / self.vt_job
            parts = sorted(run_dir.glob("vertical_*_model.json"))
            check(parts, f"{site} has no vertical_*_model.json in {run_dir}")
            data = self.vdir / site
            shutil.copy(parts[0], data / parts[0].name)
            shutil.copy(data / "test.csv", data / "predict.csv")
        r, secs = self.job_prod("vertical_tree", ["--predict", self.work / "vt", *VT_ARGS], "vt_pred")
        report = json.loads((self.work / "vt_pred" / "report.json").read_text())
        ids = JOB_ID.findall(r.stdout + r.stderr)
        pred_files = [self.lab.kits["site-1"] / i / "vertical_predictions.csv" for i in ids]
        found = [p for p in pred_files if p.is_file()]
        check(found, f"no vertical_predictions.csv at site-1 for jobs {ids}")
        with open(found[-1]) as fh:
            n = sum(1 for _ in csv.reader(fh)) - 1
        with open(self.vdir / "site-1" / "test.csv") as fh:
            rows = sum(1 for _ in csv.reader(fh)) - 1
        check(n == report.get("n_rows") and n + int(report.get("n_unscored") or 0) == rows,
              f"{n} predictions, report n_rows {report.get('n_rows')}, n_unscored {report.get('n_unscored')}, "
              f"{rows} rows at site-1")
        return {"happened": f"completed; {n} predictions at site-1 ({report.get('n_unscored')} rows unscored)",
                "job_s": round(secs, 1)}

    # ================================================================== faults
    def fault_rows(self) -> None:
        self.row("outage_10s_xgb", "fault", "site-2's link down 10 s mid-job (XGBoost direct), then back",
                 "the job completes all rounds; nothing lost", self.outage_10s)
        self.row("link_lost_icdta4fl", "fault", "site-3's link down for good during ICDTA4FL",
                 "site-3 dropped after the task timeout (60 s), the job completes on the others", self.lost_icdta4fl)
        self.row("link_lost_xgb", "fault", "site-3's link down for good during XGBoost direct",
                 "the job fails naming site-3 (heartbeat timeout 120 s)", self.lost_xgb)
        self.row("link_lost_vertical", "fault", "site-3's link down for good during the vertical job's training "
                 "(cut once the server has sent it its first layer message)",
                 "the job fails naming site-3 and the task within the task timeout (60 s) + 20 s; no site's job "
                 "process left (site-3's once its link is back)", self.lost_vertical)
        self.row("link_lost_vertical_psi", "fault", "site-3's link down for good during the vertical job's PSI phase",
                 "the job fails naming site-3 and the PSI step within the task timeout (60 s) + 20 s; no job "
                 "process left at site-1/2", self.lost_vertical_psi)
        self.row("link_back", "fault", "site-3's link back after the three outages",
                 "site-3 reconnects by itself; the next job runs on every site", self.link_back)
        self.row("site_killed_between", "fault", "site-2 killed (SIGKILL, every process) and restarted between jobs",
                 "it registers again; the next job runs on every site", self.site_killed_between)
        self.row("site_killed_during_xgb", "fault", "site-2 killed during XGBoost direct, then restarted",
                 "the job fails naming site-2; after the restart the next job runs", self.site_killed_during)
        self.row("site_killed_during_icdta4fl", "fault", "site-2 killed during ICDTA4FL, then restarted",
                 "site-2 dropped, the job completes on the others", self.site_killed_during_icd)
        self.row("server_restart_between", "fault", "server stopped and started between jobs",
                 "the sites reconnect; the next job runs; earlier jobs still listed and downloadable",
                 self.server_restart_between)
        self.row("server_restart_during", "fault", "server stopped and started during XGBoost direct",
                 "the job ends failed with the reason; nothing written before is lost", self.server_restart_during)
        self.row("xgb_port_blocked", "fault", f"the XGBoost port {8003} dropped between the sites and the server",
                 "the job fails within the connect timeout (30 s) with an error naming host and port (time from the "
                 "XGBoost server listening to the job's end)",
                 self.port_blocked)
        self.row("slow_link_xgb", "fault", f"site-2's link limited to {SLOW_RATE} (tc tbf) both ways",
                 "XGBoost direct and flare both complete; train times measured against the unlimited link",
                 self.slow_link)

    def _submit_xgb_long(self, extra=()) -> str:
        job = self.export("xgb_long" + "_".join(extra), "xgb_histogram",
                          ["--schema", self.work / "schema.json", "--sites", len(self.sites), *XGB_ARGS,
                           "--rounds", FAULT_ROUNDS, *extra])
        job_id = self.lab.submit(job)
        self._wait_listening(job_id)
        return job_id

    def _xgb_end(self, job_id: str, t_fault: float, timeout: float = 900) -> tuple[str, float, dict]:
        status = self.lab.wait_job(job_id, timeout=timeout)
        ended = time.monotonic() - t_fault
        return status, ended, self.result_of(job_id, "xgb_result.json")

    def outage_10s(self) -> dict:
        job_id = self._submit_xgb_long()
        t = time.monotonic()
        self.lab.link_down("site-2")
        time.sleep(10)
        self.lab.link_up("site-2")
        status, ended, result = self._xgb_end(job_id, t)
        self.no_job_running()
        ok = status == "FINISHED:COMPLETED" and result.get("status") == "completed" \
            and result.get("rounds") == FAULT_ROUNDS and result.get("models_identical") is True
        return {"met": ok, "happened": f"{status}; result {result.get('status')}, {result.get('rounds')} rounds, "
                                       f"models identical {result.get('models_identical')}"
                                       + (f"; error: {short(result.get('error'))}" if result.get("error") else ""),
                "detect_s": None, "lost": "nothing" if ok else "the job", "ended_after_s": round(ended, 1)}

    def _icd_job(self) -> Path:
        return self.export("icdta4fl_min2", "icdta4fl", ["--schema", self.work / "schema.json", "--sites",
                                                          len(self.sites), *ICD_ARGS, "--min-clients", "2"])

    def _wait_deployed(self, job_id: str, sites, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all((self.lab.kits[s] / job_id).is_dir() for s in sites):
                time.sleep(2)
                return
            time.sleep(0.3)
        raise RowFailed(f"job {job_id} did not start on {sites} within {timeout:.0f} s")

    def _icd_fault(self, site: str, inject) -> tuple[str, float, dict, float | None]:
        job_id = self.lab.submit(self._icd_job())
        self._wait_deployed(job_id, self.sites)
        t = time.monotonic()
        wall = datetime.datetime.now()
        inject(site)
        status = self.lab.wait_job(job_id, timeout=900)
        ended = time.monotonic() - t
        result = self.result_of(job_id, "icdta4fl_result.json")
        task = str((result.get("dropped_sites") or {}).get(site, "")).split(":")[0]
        logs = list((self.work / "downloads" / job_id).rglob("log.txt"))
        dropped_at = _moved_on_at(logs[0], task, wall) if logs and task else None
        return status, ended, result, dropped_at

    def lost_icdta4fl(self) -> dict:
        try:
            status, ended, result, dropped_at = self._icd_fault("site-3", self.lab.link_down)
        finally:
            back = self.link_restored("site-3")
        dropped = result.get("dropped_sites") or {}
        ok = status == "FINISHED:COMPLETED" and result.get("status") == "completed" and list(dropped) == ["site-3"]
        return {"met": ok, "happened": f"{status}; result {result.get('status')}; trained on "
                                       f"{', '.join(sorted(result.get('sites') or {}))}; dropped {dropped}",
                "detect_s": _r(dropped_at), "ended_after_s": round(ended, 1), "reconnect_s": back,
                "lost": "site-3's data in this model (trained on the other sites)" if ok else "the job"}

    def _lost_xgb_like(self, site: str, inject, restore=None) -> dict:
        job_id = self._submit_xgb_long()
        t = time.monotonic()
        inject(site)
        try:
            status, ended, result = self._xgb_end(job_id, t)
        finally:
            back = restore(site) if restore else None
        self.no_job_running()
        err = result.get("error") or ""
        ok = status != "FINISHED:COMPLETED" and result.get("status") == "failed" and site in err
        return {"met": ok, "happened": f"{status}; result {result.get('status')}: {short(err)}",
                "detect_s": round(ended, 1), "reconnect_s": back, "lost": "the job (no model); earlier jobs untouched"}

    def lost_xgb(self) -> dict:
        return self._lost_xgb_like("site-3", self.lab.link_down, self.link_restored)

    def lost_vertical(self) -> dict:
        job = self.export("vt", "vertical_tree", ["--schema", self.work / "vertical_schema.json", *VT_ARGS])
        job_id = self.lab.submit(job)
        self._wait_deployed(job_id, self.sites)
        # until the PSI phase is over and training under way: the server has sent site-3 its second training
        # message (setup answered, the first layer's in flight)
        deadline, log = time.monotonic() + 300, self.lab.kits["server"] / job_id / "log.txt"
        rx = re.compile(r"peer=site-3\b.*task_name=vertical_msg.*sent task assignment")
        while time.monotonic() < deadline and not (log.is_file() and
                                                   len(rx.findall(log.read_text(errors="replace"))) >= 2):
            time.sleep(0.3)
        check(time.monotonic() < deadline, f"job {job_id}: no second training message to site-3 within 300 s")
        running = len(self._site_job_processes(job_id))  # what the counts after the end are out of
        t = time.monotonic()
        self.lab.link_down("site-3")
        try:
            status = self.lab.wait_job(job_id, timeout=900)
            ended = time.monotonic() - t
            others = self._job_processes_end(job_id, ["site-1", "site-2"], timeout=60)
        finally:
            back = self.link_restored("site-3")
        cut = self._job_processes_end(job_id, ["site-3"], timeout=180)
        result = self.result_of(job_id, "vertical_result.json")
        self.no_job_running()
        err = result.get("error") or ""
        limit = int(VT_ARGS[VT_ARGS.index("--task-timeout") + 1]) + 20
        ok = status != "FINISHED:COMPLETED" and result.get("status") == "failed" and "site-3" in err \
            and "vertical_msg" in err and ended <= limit and running > 0 and others[0] == 0 and cut[0] == 0
        ends = (f"site job processes: {running} before the cut; left at site-1/2 {others[0]} ({others[1]:.0f} s "
                f"after the end), at site-3 {cut[0]} ({cut[1]:.0f} s after its link came back)")
        return {"met": ok, "happened": f"{status}; result {result.get('status')}: {short(err)}; {ends}",
                "detect_s": round(ended, 1), "reconnect_s": back, "lost": "the job (no model)"}

    def _job_processes_end(self, job_id: str, sites, timeout: float) -> tuple[int, float]:
        """(how many of ``sites``' processes of ``job_id`` still run, seconds waited): polled until none or
        ``timeout``."""
        t = time.monotonic()
        while True:
            theirs = {p for s in sites for p in self.lab.pids(s)}
            left = [p for p in self._site_job_processes(job_id) if p in theirs]
            if not left or time.monotonic() - t > timeout:
                return len(left), time.monotonic() - t
            time.sleep(1.0)

    def lost_vertical_psi(self) -> dict:
        job = self.export("vt", "vertical_tree", ["--schema", self.work / "vertical_schema.json", *VT_ARGS])
        job_id = self.lab.submit(job)
        deadline, log = time.monotonic() + 300, self.lab.kits["server"] / job_id / "log.txt"
        # the phase's first task (--psi ecdh, the default: check, then the relay's aux requests; a cut during the
        # check or the relay alike leaves site-3 silent)
        rx = re.compile(r"peer=site-3\b.*task_name=treeflare_psi_check.*sent task assignment")
        while time.monotonic() < deadline and not (log.is_file() and rx.search(log.read_text(errors="replace"))):
            time.sleep(0.2)
        check(time.monotonic() < deadline, f"job {job_id}: no PSI task to site-3 within 300 s")
        running = len(self._site_job_processes(job_id))  # what the count after the end is out of
        t = time.monotonic()
        self.lab.link_down("site-3")
        waited = 240
        others = (None, 0.0)
        try:
            status = self.lab.wait_job(job_id, timeout=waited)
        except Exception:
            status = None
        ended = time.monotonic() - t
        still = status is None or not str(status).startswith("FINISHED")
        if still:
            status = self._jobs().get(job_id)
        else:
            others = self._job_processes_end(job_id, ["site-1", "site-2"], timeout=60)
        try:
            back = self.link_restored("site-3")
        finally:
            if still:
                self._abort(job_id)
        # a failed PSI phase ends the job before training: its result is psi_result.json (what the job reads first)
        result = (self.result_of(job_id, "vertical_result.json") or self.result_of(job_id, "psi_result.json")) \
            if not still else {}
        self.no_job_running()
        err = result.get("error") or ""
        limit = int(VT_ARGS[VT_ARGS.index("--task-timeout") + 1]) + 20
        ok = not still and result.get("status") == "failed" and "site-3" in err and "PSI" in err \
            and ended <= limit and running > 0 and others[0] == 0
        happened = (f"still {status} {ended:.0f} s after the cut: the PSI phase did not end; the script aborted "
                    "it" if still else
                    f"{status}; result {result.get('status')}: {short(err)}; site job processes: {running} before "
                    f"the cut, left at site-1/2 {others[0]} ({others[1]:.0f} s after the end)")
        return {"met": ok, "happened": happened, "detect_s": None if still else round(ended, 1),
                "reconnect_s": back, "lost": "the job"}

    def link_back(self) -> dict:
        t = time.monotonic()
        back = self.settle(timeout=300)
        job_id = self.lab.submit(self._icd_job())
        status = self.lab.wait_job(job_id, timeout=900)
        result = self.result_of(job_id, "icdta4fl_result.json")
        ok = status == "FINISHED:COMPLETED" and sorted(result.get("sites") or {}) == self.sites
        return {"met": ok, "happened": f"every site listed as connected ({back:.0f} s); next job {status} on "
                                       f"{', '.join(sorted(result.get('sites') or {}))}",
                "detect_s": None, "lost": "nothing",
                "total_s": round(time.monotonic() - t, 1)}

    def site_killed_between(self) -> dict:
        self.lab.kill("site-2")
        t = time.monotonic()
        self.lab.restart("site-2")
        back = time.monotonic() - t
        job_id = self.lab.submit(self._icd_job())
        status = self.lab.wait_job(job_id, timeout=900)
        result = self.result_of(job_id, "icdta4fl_result.json")
        ok = status == "FINISHED:COMPLETED" and sorted(result.get("sites") or {}) == self.sites
        return {"met": ok, "happened": f"restarted and registered again in {back:.0f} s; next job {status} on "
                                       f"{', '.join(sorted(result.get('sites') or {}))}",
                "reconnect_s": round(back, 1), "lost": "nothing (no job was running)"}

    def site_killed_during(self) -> dict:
        row = self._lost_xgb_like("site-2", self.lab.kill)
        t = time.monotonic()
        self.lab.restart("site-2")
        row["reconnect_s"] = round(time.monotonic() - t, 1)
        row["happened"] += f"; restarted, connected again in {row['reconnect_s']:.0f} s"
        return row

    def site_killed_during_icd(self) -> dict:
        status, ended, result, dropped_at = self._icd_fault("site-2", self.lab.kill)
        t = time.monotonic()
        self.lab.restart("site-2")
        back = time.monotonic() - t
        dropped = result.get("dropped_sites") or {}
        ok = status == "FINISHED:COMPLETED" and result.get("status") == "completed" and list(dropped) == ["site-2"]
        return {"met": ok, "happened": f"{status}; result {result.get('status')}; dropped {dropped}; restarted, "
                                       f"connected again in {back:.0f} s",
                "detect_s": _r(dropped_at), "ended_after_s": round(ended, 1), "reconnect_s": round(back, 1),
                "lost": "site-2's data in this model" if ok else "the job"}

    def _jobs(self) -> dict:
        """job id -> status, as ``nvflare job list`` gives them."""
        out = self.lab._json_of(self.lab.nvflare("job", "list", timeout=60))
        if out.get("status") != "ok":
            raise RuntimeError(f"job list failed: {short(out, 400)}")
        data = out.get("data")
        jobs = data if isinstance(data, list) else (data or {}).get("jobs") or []
        return {j.get("job_id") or j.get("id"): j.get("status") or j.get("state") for j in jobs}

    def _download_again(self, job_id: str, name: str, tries: int = 3) -> tuple[dict, str]:
        """``nvflare job download`` of an earlier job after a restart, into a folder of its own: (its result file
        ``name``, '' or what went wrong, from NVFlare's own answer). Tried ``tries`` times, 5 s apart (a server just
        started may not answer yet)."""
        problem = ""
        for attempt in range(tries):
            result, problem = self._fetch(job_id, name, self.work / "downloads_after_restart" / str(attempt))
            if result:
                return result, ""
            time.sleep(5)
        return {}, problem

    def server_restart_between(self) -> dict:
        before = self._jobs()
        t = time.monotonic()
        self.lab.restart("server")
        back = time.monotonic() - t
        after = self._jobs()
        kept = [j for j, s in before.items() if after.get(j) == s]
        fetched, problem = self._download_again(self.icd_job, "icdta4fl_result.json")
        job_id = self.lab.submit(self._icd_job())
        status = self.lab.wait_job(job_id, timeout=900)
        ok = status == "FINISHED:COMPLETED" and len(kept) == len(before) and fetched.get("status") == "completed"
        return {"met": ok, "happened": f"sites connected again {back:.0f} s after the restart; {len(kept)} of "
                                       f"{len(before)} earlier jobs listed as before, the first one's result "
                                       f"downloaded again ({fetched.get('status') or problem}); next job {status}",
                "reconnect_s": round(back, 1), "lost": "nothing (no job was running)"}

    def server_restart_during(self) -> dict:
        before = {j: s for j, s in self._jobs().items() if str(s).startswith("FINISHED")}
        job_id = self._submit_xgb_long()
        t = time.monotonic()
        self.lab.stop("server")
        self.lab.start(["server"])
        self.settle(timeout=300)
        back = time.monotonic() - t
        after = self._jobs()
        status = after.get(job_id)
        deadline = time.monotonic() + 120
        while not str(status).startswith("FINISHED") and time.monotonic() < deadline:
            time.sleep(2)
            status = self._jobs().get(job_id)
        ended = time.monotonic() - t
        result, where = self.result_of(job_id, "xgb_result.json"), "downloaded"
        on_server = self.lab.kits["server"] / job_id / "xgb_result.json"
        if not result and on_server.is_file():  # not in the job store: still in the server's run folder
            result, where = json.loads(on_server.read_text()), "in the server's run folder only (no download)"
        kept = [j for j, s in before.items() if after.get(j) == s]
        left = self._site_job_processes(job_id)
        self.no_job_running()
        reason = (f"{short(result.get('error'))} ({where})" if result.get("error") else
                  f"no result file (downloaded or in the server's run folder); NVFlare's status {status}"
                  if not result else "")
        ok = str(status).startswith("FINISHED") and status != "FINISHED:COMPLETED" and len(kept) == len(before) \
            and bool(result) and result.get("status") == "failed" and not left
        return {"met": ok, "happened": f"job {status}; result: {result.get('status', 'none')}"
                                       f"{': ' + reason if reason else ''}; sites connected again "
                                       f"{back:.0f} s after the stop; {len(kept)} of {len(before)} finished jobs "
                                       f"listed as before; site job processes left: {len(left)}",
                "detect_s": round(ended, 1), "reconnect_s": round(back, 1),
                "lost": f"the running job; earlier jobs: {'none' if len(kept) == len(before) else 'some'}"}

    def _site_job_processes(self, job_id: str) -> list[int]:
        out = []
        for site in self.sites:
            for pid in self.lab.pids(site):
                try:
                    if job_id.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                        out.append(pid)
                except OSError:
                    pass
        return out

    def port_blocked(self) -> dict:
        job = self.export("xgb_short", "xgb_histogram", ["--schema", self.work / "schema.json", "--sites",
                                                          len(self.sites), *XGB_ARGS, "--rounds", 20])
        for site in self.sites:
            block_port(self.lab, site, self.lab.xgb_port)
        try:
            job_id = self.lab.submit(job)
            t = self._wait_listening(job_id, settle=0)  # the train task goes out to the sites now
            status = self.lab.wait_job(job_id, timeout=600)
            ended = time.monotonic() - t
        finally:
            for site in self.sites:
                unblock_port(self.lab, site)
        result = self.result_of(job_id, "xgb_result.json")
        self.no_job_running()
        err = result.get("error") or ""
        named = f"{self.netlab.SERVER_NAME}:{self.lab.xgb_port}" in err
        ok = status != "FINISHED:COMPLETED" and result.get("status") == "failed" and named and ended < 120
        return {"met": ok, "happened": f"{status}; result {result.get('status')}: {short(err)}",
                "detect_s": round(ended, 1), "lost": "the job (no site trained)"}

    def slow_link(self) -> dict:
        base = getattr(self, "unshaped", {})
        self.lab.shape("site-2", rate=SLOW_RATE)
        try:
            d = self.xgb_direct(ws="xgb_direct_slow")
            f = self.xgb_flare(ws="xgb_flare_slow")
        finally:
            self.lab.unshape("site-2")
        self.unshaped = base
        self.slow = {"direct": d, "flare": f}
        slow = {"direct_run": d.get("run_s"), "direct_train": d.get("train_s"), "flare_run": f.get("run_s")}
        return {"happened": f"both completed; the job's run on the server (s), unlimited -> {SLOW_RATE}: direct "
                            f"{base.get('direct_run')} -> {slow['direct_run']} (training alone {base.get('direct_train')}"
                            f" -> {slow['direct_train']}), flare {base.get('flare_run')} -> {slow['flare_run']} "
                            f"({SLOW_ROUNDS} rounds)",
                "lost": "nothing", "times": {"unlimited": base, "slow": slow}}


PROBE = r"""
import json, sys, grpc
name, ip = sys.argv[1], sys.argv[2]
ca, key, cert = (open(p, "rb").read() for p in ({ca!r}, {key!r}, {cert!r}))
def ready(target, creds, timeout=8):
    ch = grpc.secure_channel(target, creds) if creds else grpc.insecure_channel(target)
    try:
        grpc.channel_ready_future(ch).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        ch.close()
print(json.dumps({{
    "good": ready(f"{{name}}:{port}", grpc.ssl_channel_credentials(ca, key, cert), 20),
    "wrong_name": ready(f"{{ip}}:{port}", grpc.ssl_channel_credentials(ca, key, cert)),
    "no_cert": ready(f"{{name}}:{port}", grpc.ssl_channel_credentials(root_certificates=ca)),
    "plain": ready(f"{{name}}:{port}", None),
}}))
"""


def _train_s(report: dict):
    """The job's train seconds (XGBoost's report: ``timings_s.flare_train``, first site's start to last one's end)."""
    t = (report.get("timings_s") or {}).get("flare_train")
    return round(float(t), 1) if isinstance(t, (int, float)) else None


def _bench_lock_state() -> str:
    """Whether this run held /tmp/treeflare-bench.lock (started as ``flock /tmp/treeflare-bench.lock ...``: a parent
    process is that flock) and, if not, whether another benchmark held it at the end, so that the table says when
    other benchmarks may have run beside it."""
    import fcntl

    pid = os.getppid()
    while pid > 1:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        if cmd and cmd[0].endswith(b"flock") and any(b"treeflare-bench.lock" in a for a in cmd):
            return "held by this run (no other benchmark ran beside it)"
    try:
        with open("/tmp/treeflare-bench.lock", "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fh, fcntl.LOCK_UN)
        return "not held by this run; free at its end"
    except BlockingIOError:
        return "not held by this run: another benchmark held it, so they overlapped (see the load averages)"
    except OSError as exc:
        return f"unknown ({exc.strerror})"


def _run_s(report: dict):
    """Seconds the job ran on the FLARE system (``timings_s.flare_run``: from the submission to its end)."""
    t = (report.get("timings_s") or {}).get("flare_run")
    return round(float(t), 1) if isinstance(t, (int, float)) else None


def _r(x):
    return None if x is None else round(x, 1)


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})")


def _moved_on_at(log: Path, task: str, since: datetime.datetime) -> float | None:
    """Seconds from ``since`` until the server, in its job log ``log``, first assigned a task other than ``task``
    after ``task`` had gone out: when the job went on without the site that did not answer ``task``."""
    seen_task = False
    for line in log.read_text(errors="replace").splitlines():
        m = LOG_TIME.match(line)
        name = re.search(r"task_name=([\w.-]+)", line)
        if not (m and name and "assigned task" in line):
            continue
        if name.group(1) == task:
            seen_task = True
            continue
        t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(microsecond=int(m.group(2)) * 1000)
        if seen_task and t > since:
            return (t - since).total_seconds()
    return None


# --------------------------------------------------------------------------------------------- output
def _cell(x) -> str:
    return "-" if x is None else str(x).replace("|", "\\|")


def markdown(rows: list[dict], settings: dict) -> str:
    jobs = [r for r in rows if r["kind"] == "job"]
    faults = [r for r in rows if r["kind"] == "fault"]
    out = ["| job across hosts | checked | what happened | met | seconds |", "|---|---|---|---|---|"]
    out += [f"| {r['name']} | {_cell(r['expected'])} | {_cell(r.get('happened'))} | {'yes' if r['met'] else '**no**'} "
            f"| {_cell(r.get('job_s', r['seconds']))} |" for r in jobs]
    out += ["", "| fault | expected | what happened | time to detect (s) | reconnect (s) | what was lost | met |",
            "|---|---|---|---|---|---|---|"]
    out += [f"| {_cell(r['fault'])} | {_cell(r['expected'])} | {_cell(r.get('happened'))} | {_cell(r.get('detect_s'))} "
            f"| {_cell(r.get('reconnect_s'))} | {_cell(r.get('lost'))} | {'yes' if r['met'] else '**no**'} |"
            for r in faults]
    met = sum(r["met"] for r in rows)
    out += ["", f"{met}/{len(rows)} rows met. Time to detect: from the fault to the job's end (ICDTA4FL: until the "
                "server went on without the site, its next task sent to the others, from its job log; port blocked: "
                "from XGBoost's server listening). Settings: " + "; ".join(f"{k}: {v}" for k, v in
                                                                                settings.items() if k != "rows")]
    return "\n".join(out)


def write_outputs(rows: list[dict], settings: dict, partial: bool) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "faults_partial" if partial else "faults"
    md = markdown(rows, settings)
    write_json_atomic(RESULTS / f"{stem}.json", {"settings": settings, "rows": rows})
    write_text_atomic(RESULTS / f"{stem}.md", "# Jobs across hosts and faults (scripts/netlab_faults.py)\n\n"
                      + md + "\n")
    if not partial:
        write_bench_block(REPO / BENCH_BLOCKS["netlab_faults"], "netlab_faults",
                          md + "\n\nWritten by `scripts/netlab_faults.py` ([faults.md]"
                               "(../scripts/results/netlab/faults.md), with each row's details in faults.json).")
    return RESULTS / f"{stem}.md"


ROW_NAMES = ["schema_discovery", "icdta4fl_cli", "admin_console", "xgb_direct", "xgb_tls_refusals", "xgb_flare",
             "vertical_tree", "vertical_predict", "outage_10s_xgb", "link_lost_icdta4fl", "link_lost_xgb",
             "link_lost_vertical", "link_lost_vertical_psi", "link_back", "site_killed_between", "site_killed_during_xgb",
             "site_killed_during_icdta4fl", "server_restart_between", "server_restart_during", "xgb_port_blocked",
             "slow_link_xgb"]


def _merge_partial(part: dict) -> None:
    """Replace the rows of faults.json by those of a later ``--only`` run (``part``), each row keeping its own time
    and load; the rerun is recorded in the settings. The rows every run needs first (schema discovery, the ICDTA4FL
    job) stay those of the full run."""
    stored = json.loads((RESULTS / "faults.json").read_text())
    fresh = {r["name"]: r for r in part["rows"] if r["name"] not in ("schema_discovery", "icdta4fl_cli")}
    rows = [fresh.get(r["name"], r) for r in stored["rows"]]
    rows += [r for n, r in fresh.items() if n not in {x["name"] for x in stored["rows"]}]
    rows.sort(key=lambda r: ROW_NAMES.index(r["name"]) if r["name"] in ROW_NAMES else len(ROW_NAMES))
    ps = part["settings"]
    settings = {**stored["settings"], "rerun": [*stored["settings"].get("rerun", []), {
        "rows": sorted(fresh), "time": ps.get("time"), "commit": ps.get("commit"),
        "loadavg_start": ps.get("loadavg_start"), "bench_lock": ps.get("bench_lock")}]}
    write_outputs(rows, settings, partial=False)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="netlab_faults.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--sites", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated row names (see --list); the rows they need first "
                                              "(schema discovery, the ICDTA4FL job) run too")
    p.add_argument("--list", action="store_true", help="print the row names and exit")
    p.add_argument("--root", default=None, help="where the lab's folder goes (default: a new temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the lab's folder (kits, logs) after teardown")
    p.add_argument("--merge", action="store_true", help="with --only: replace those rows in the full run's "
                                                        "faults.json (each row keeps its own time and load) and "
                                                        "rewrite faults.md and the docs block")
    p.add_argument("--merge-partial", nargs="*", metavar="FILE", default=None,
                   help="no lab: replace the rows of faults.json by those of each FILE (default faults_partial.json: "
                        "what a later --only run wrote) and rewrite faults.md and the docs block")
    args = p.parse_args(argv)
    if args.merge_partial is not None:
        for path in args.merge_partial or [RESULTS / "faults_partial.json"]:
            _merge_partial(json.loads(Path(path).read_text()))
        print(f"wrote {RESULTS / 'faults.md'}")
        return 0
    if args.list:

        print("\n".join(ROW_NAMES))
        return 0
    import netlab

    reason = netlab.unavailable()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = only - set(ROW_NAMES)
    if unknown:
        print(f"error: unknown rows {sorted(unknown)}; rows: {', '.join(ROW_NAMES)}", file=sys.stderr)
        return 2
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="netlab-faults-"))
    t0 = time.perf_counter()
    load0 = [round(x, 2) for x in os.getloadavg()]
    with netlab.NetLab(args.sites, root, keep=args.keep) as lab:
        print(lab.describe(), flush=True)
        work = lab.dir / "work"
        work.mkdir()
        m = Matrix(lab, work, args.sites)
        m.prepare()
        lab.start()
        wanted = lambda name: not only or name in only or name in ("schema_discovery", "icdta4fl_cli")  # noqa: E731
        rows = {"job": m.job_rows, "fault": m.fault_rows}
        # run only the wanted rows: wrap row() so the others are skipped
        original = m.row

        def maybe(name, *a):
            return original(name, *a) if wanted(name) else None

        m.row = maybe
        try:
            rows["job"]()
            rows["fault"]()
        finally:
            m.row = original
            settings = bench_settings(sites=args.sites, **SETTINGS, bench_lock=_bench_lock_state(), loadavg_start=load0,
                                      loadavg_end=[round(x, 2) for x in os.getloadavg()],
                                      total_s=round(time.perf_counter() - t0, 1),
                                      setup_s={**{k: v for k, v in lab.timings.items()},
                                               "data": round(getattr(m, "prep_s", 0.0), 1)})
            rows_out, partial = m.rows, bool(only)
            if args.merge and only and (RESULTS / "faults.json").is_file():
                stored = json.loads((RESULTS / "faults.json").read_text())
                fresh = {r["name"]: r for r in m.rows if r["name"] in only}
                rows_out = [fresh.get(r["name"], r) for r in stored["rows"]]
                rows_out += [r for n, r in fresh.items() if n not in {x["name"] for x in stored["rows"]}]
                settings = {**stored["settings"], "rerun": [*stored["settings"].get("rerun", []),
                                                            {"rows": sorted(fresh), "time": settings["time"],
                                                             "commit": settings["commit"],
                                                             "loadavg_start": load0}]}
                partial = False
            path = write_outputs(rows_out, settings, partial=partial)
            print(f"\nwrote {path}", flush=True)
            print(markdown(rows_out, settings))
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if all(r["met"] for r in m.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
