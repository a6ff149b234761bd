"""A provisioned 3-site project on this machine (scripts/provision.sh, start.sh from each kit, a non-default port),
used as an operator would: jobs submitted with the FLARE API and the `nvflare job submit` CLI, results downloaded.
The same running system then takes the faults: a site killed mid-job, a site that never answers, too few sites
left, a job aborted from the admin side, and a server restart between jobs.

One system for the whole module (starting one costs ~15-20 s); the fault tests run in file order (see the note
above them) so that none needs a site restart of its own.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from flare_helpers import REPO, LocalProject, flare_lock, run_cmd
from treeflare.flare.poc import service_pids
from treeflare.processes import processes_with_cmdline, send_signal

pytestmark = [pytest.mark.flare, pytest.mark.flare_lock]  # runs under the machine-wide FLARE lock

TASK_TIMEOUT = 6  # seconds a site has per task in the fault jobs: a dead site costs this much, not 300 s
JOB_ARGS = ["--algorithm", "cart", "--dataset", "car", "--sites", "3", "--partition", "iid", "--seed", "1",
            "--max-depth", "4"]


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    root = tmp_path_factory.mktemp("prod")
    with flare_lock():
        project = LocalProject(root, n_sites=3)
        try:
            project.provision()
            project.start()
            yield project
        finally:
            left = project.stop()
            print(f"\nprovisioned system timings: {project.timings}")
            assert not left, f"processes left behind: {left}"


def _pids_of_job(job_id: str) -> list[int]:
    return processes_with_cmdline(job_id)


def _wait_gone(job_id: str, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = _pids_of_job(job_id)
        if not left:
            return []
        time.sleep(0.5)
    return _pids_of_job(job_id)


def _server_alive(system) -> bool:
    pid = service_pids(system.server_kit)["main"]
    return bool(pid) and Path(f"/proc/{pid}").exists()


def _fault_job(system, min_clients: int) -> Path:
    """The exported ICDTA4FL job (made once), with ``min_clients`` patched into the server config."""
    base = system.root / "export" / "icdta4fl"
    if not base.is_dir():
        proc = run_cmd([str(Path(os.sys.executable)), str(REPO / "jobs/icdta4fl/job.py"), *JOB_ARGS,
                        "--task-timeout", str(TASK_TIMEOUT), "--workspace", str(system.root),
                        "--data-root", "/nonexistent", "--export", str(system.root / "export")], system.env, 120)
        assert proc.returncode == 0, proc.stderr[-3000:]
    job = system.root / f"job_min{min_clients}" / "icdta4fl"
    if not job.is_dir():
        import shutil

        shutil.copytree(base, job)
        cfg_file = next(job.glob("app*/config/config_fed_server.json"))
        cfg = json.loads(cfg_file.read_text())
        cfg["workflows"][0]["args"]["min_clients"] = min_clients
        cfg_file.write_text(json.dumps(cfg, indent=1))
        meta = json.loads((job / "meta.json").read_text())
        meta["min_clients"] = min_clients
        (job / "meta.json").write_text(json.dumps(meta))
    return job


def _wait_deployed(system, job_id: str, sites, timeout: float = 60) -> None:
    """Until each site has its run folder and a process for the job (the job is running there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all((system.kit(s) / job_id).is_dir() for s in sites) and \
                all(any(str(system.kit(s)).encode() in Path(f"/proc/{p}/cmdline").read_bytes()
                        for p in _pids_of_job(job_id) if Path(f"/proc/{p}").exists()) for s in sites):
            return
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not start on {sites} within {timeout} s")


def _result(outcome) -> dict:
    assert outcome.server_dir is not None, f"no result downloaded (status {outcome.status})"
    return json.loads((outcome.server_dir / "icdta4fl_result.json").read_text())


# --------------------------------------------------------------------------------------------- deployment
def test_provisioned_kits(system):
    prod = system.prod
    assert (system.server_kit / "startup" / "fed_server.json").is_file()
    server_cfg = json.loads((system.server_kit / "startup" / "fed_server.json").read_text())
    assert str(system.port) in json.dumps(server_cfg)
    for site in system.sites:
        binding = json.loads((prod / site / "local" / "treeflare_site.json").read_text())
        assert binding == {"data_dir": str(system.data_dir / site)}
        assert (prod / site / "startup" / "start.sh").is_file()
    admin = json.loads((system.admin_kit / "startup" / "fed_admin.json").read_text())["admin"]
    assert admin["port"] == system.port and admin["host"] == "localhost"


def test_server_restart(system):
    """Stop the server and start it again from its kit: the sites reconnect by themselves. The next test's job
    (job.py --env prod) runs on the restarted server."""
    t = time.perf_counter()
    pid_before = service_pids(system.server_kit)["main"]
    system.deploy.stop_kit(system.server_kit, timeout=10)
    assert not _server_alive(system)
    system.deploy.start_kit(system.server_kit, system.env)
    system.wait_connected(timeout=120)
    system.timings["server_restart"] = time.perf_counter() - t
    assert _server_alive(system) and service_pids(system.server_kit)["main"] != pid_before


def test_job_script_env_prod_after_restart(system):
    """job.py --env prod, on the restarted server: export, submit through the FLARE API, wait, download, gather site folders, report.
    --data-root points nowhere: the sites find their data through their own local/treeflare_site.json."""
    ws = system.root
    t = time.perf_counter()
    proc = run_cmd([str(Path(os.sys.executable)), str(REPO / "jobs/icdta4fl/job.py"), *JOB_ARGS,
                    "--workspace", str(ws), "--data-root", "/nonexistent", "--env", "prod",
                    "--startup-kit", str(system.admin_kit), "--timeout", "180"], system.env, 240)
    system.timings["job_env_prod"] = time.perf_counter() - t
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    report = json.loads((ws / "report.json").read_text())
    assert report["job"] == "icdta4fl" and report["n_sites"] == 3 and report["dropped_sites"] == {}
    assert report["params"]["env"] == "prod"
    assert report["global"]["n_leaves"] >= 2 and set(report["sites"]) == set(system.sites)
    assert all(0.5 < s["global"]["accuracy"] <= 1 for s in report["sites"].values())
    for name in ("global_tree.json", "rules.txt", "global_tree.png"):
        assert (ws / name).is_file()
    result = ws / "flare" / "prod_result"
    job_ids = [p.name for p in result.iterdir() if p.is_dir() and not p.name.startswith("site-")]
    assert len(job_ids) == 1
    for site in system.sites:  # the site's own log shows it read the data its binding names
        log = (result / site / job_ids[0] / "log.txt").read_text()
        assert str(system.data_dir / site / "train.csv") in log and "treeflare_site.json" in log


# --------------------------------------------------------------------------------------------- faults
# Order matters (one system): abort; too few sites (one site's job process killed: the site itself survives); then a
# whole site killed and another frozen in one job (last: nothing needs restoring afterwards).
def test_abort_from_admin(system):
    """A running job aborted from the admin side ends ABORTED promptly and leaves no job process."""
    from deploy_helpers import abort_job, job_status, wait_for_status
    from treeflare.flare.admin import submit_job

    job = _fault_job(system, min_clients=3)
    t = time.perf_counter()
    job_id = submit_job(system.admin_kit, job)
    assert wait_for_status(system.admin_kit, job_id, ("RUNNING",), timeout=60).startswith("RUNNING")
    abort_job(system.admin_kit, job_id)
    status = wait_for_status(system.admin_kit, job_id, ("FINISHED",), timeout=60)
    system.timings["job_abort"] = time.perf_counter() - t
    assert status == "FINISHED:ABORTED", status
    assert job_status(system.admin_kit, job_id) == "FINISHED:ABORTED"
    assert not _wait_gone(job_id), "job processes left behind"


def test_too_few_sites_fails_clearly(system):
    """min_clients 3 and site-3's job process killed mid-job: the job fails, in bounded time, with a message that
    names site-3; no process of the job is left on any site; the server and site-3 itself keep running."""
    from treeflare.flare.admin import collect_job, submit_job

    job = _fault_job(system, min_clients=3)
    t = time.perf_counter()
    job_id = submit_job(system.admin_kit, job)
    _wait_deployed(system, job_id, ["site-3"])
    site3 = str(system.kit("site-3")).encode()
    worker = [p for p in _pids_of_job(job_id) if site3 in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert worker
    send_signal(worker, signal.SIGKILL)
    outcome = collect_job(system.admin_kit, job_id, system.root / "faults", timeout=90, poll=0.5)
    elapsed = time.perf_counter() - t
    system.timings["job_too_few"] = elapsed
    assert elapsed < 90
    assert outcome.status.startswith("FINISHED") and outcome.status != "FINISHED:COMPLETED", outcome.status
    if outcome.server_dir is not None and (outcome.server_dir / "icdta4fl_result.json").is_file():
        result = _result(outcome)  # the workflow saw too few replies
        assert result["status"] == "failed" and "site-3" in result["error"], result
    else:  # NVFlare failed the whole job first, when site-3 reported its job process gone
        assert outcome.status == "FINISHED:ABNORMAL", outcome.status
        log = (system.server_kit / "log.txt").read_text(errors="replace")
        assert f"Failing job {job_id} due to reported failure from site-3" in log
    assert not _wait_gone(job_id), "job processes left behind"
    assert _server_alive(system)
    assert "site-3" in system.wait_connected(timeout=30)


def test_site_killed_and_site_frozen_mid_job(system):
    """site-3 is killed (all its processes, watchdog first) and site-2 frozen (SIGSTOP: it never answers) once
    the job runs on them. With min_clients 1 the job completes on site-1 and names both dropped sites."""
    from deploy_helpers import kill_site
    from treeflare.flare.admin import collect_job, submit_job

    job = _fault_job(system, min_clients=1)
    t = time.perf_counter()
    job_id = submit_job(system.admin_kit, job)
    frozen = []
    try:
        _wait_deployed(system, job_id, ["site-2", "site-3"])
        assert kill_site(system.kit("site-3"), signal.SIGKILL)
        frozen = kill_site(system.kit("site-2"), signal.SIGSTOP)
        outcome = collect_job(system.admin_kit, job_id, system.root / "faults", timeout=120, poll=0.5)
    finally:
        send_signal(frozen, signal.SIGCONT)
    system.timings["job_killed_frozen"] = time.perf_counter() - t
    assert outcome.status == "FINISHED:COMPLETED", outcome.meta
    result = _result(outcome)
    assert result["status"] == "completed" and result["sites_trained"] == ["site-1"]
    dropped = result["dropped_sites"]
    assert set(dropped) == {"site-2", "site-3"}, dropped
    assert all("no reply" in why for why in dropped.values()), dropped
    assert _server_alive(system)
