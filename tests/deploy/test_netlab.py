"""A federation of separate hosts (scripts/netlab.py): the server, three sites and the admin each in a network
namespace of its own, with its own address, host name and HOME, kits provisioned for those names, each site's
data bound at that site. Jobs go over the lab's network only, submitted from the admin's namespace as a user does:
ICDTA4FL exported and sent with ``nvflare job submit``, XGBoost ``direct`` (mutual TLS, the sites connecting to
the server's name from their kits) with ``job.py --env prod``, both jobs on the lab at once; then one fault, a
site's link cut for good during an ICDTA4FL job. The first tests check that a lab leaves nothing behind when it
is killed while starting.

Needs root and ``ip netns`` (CI has both); skips otherwise. The lab's ports live in its own namespaces, so this
module does not take the machine-wide FLARE lock and runs beside the loopback runs.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flare_helpers import REPO, load_script

# loaded by path: scripts/ on sys.path would put its schema.py, psi.py, ... in front of every module of that name
netlab = load_script("scripts/netlab.py", "netlab")
ICDTA4FL_ARGS, XGB_ARGS, NetLab = netlab.ICDTA4FL_ARGS, netlab.XGB_ARGS, netlab.NetLab
export_job, run_job_prod = netlab.export_job, netlab.run_job_prod

# one worker for the module: its lab is built once, and the teardown tests do not start a second lab beside it
pytestmark = [pytest.mark.flare, pytest.mark.netlab, pytest.mark.xdist_group("tests/deploy/test_netlab.py")]

N_SITES = 3
FAULT_TASK_TIMEOUT = 6  # seconds a site has per task in the fault job: a cut-off site costs this much per phase
DATA_ARGS = ["--dataset", "car", "--partition", "iid", "--seed", "1"]


@functools.lru_cache(maxsize=1)
def _skip_reason() -> str | None:
    return netlab.unavailable()


needs_lab = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


# --------------------------------------------------------------------------------------------- teardown
def _lab_leftovers(tag: str, lab_dir: Path) -> list[str]:
    """Everything of lab ``tag`` still on this machine: namespaces, /etc/netns folders, interfaces in the root
    namespace, processes carrying its tag, its folder."""
    left = [f"namespace {line.split()[0]}" for line in
            subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
            if line.startswith(tag)]
    if netlab.NETNS_ETC.is_dir():
        left += [f"/etc/netns/{p.name}" for p in netlab.NETNS_ETC.iterdir() if p.name.startswith(tag)]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left += [f"interface {line.split(':')[1].strip()}" for line in links.splitlines() if tag in line]
    left += [f"process {pid}" for pid in netlab._token_pids(tag)]
    if lab_dir.exists():
        left.append(f"folder {lab_dir}")
    return left


LAB_IN_A_PROCESS = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from netlab import NetLab
lab = NetLab(2, Path(sys.argv[2]), tag=sys.argv[3])
lab.setup()
print("setup done", flush=True)
lab.start()
print("started", flush=True)
time.sleep(600)
"""


@needs_lab
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_lab_killed_while_starting_leaves_nothing(tmp_path, sig):
    """A lab in a process of its own gets ``sig`` once its server runs and while its sites are starting: it
    exits 128 + sig (SIGINT: KeyboardInterrupt, 1 or 130) and leaves no namespace, /etc/netns folder,
    interface, process or folder."""
    tag = f"tf{os.getpid() % 10**7}{os.urandom(2).hex()}"
    proc = subprocess.Popen([sys.executable, "-c", LAB_IN_A_PROCESS, str(REPO / "scripts"), str(tmp_path), tag],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lab_dir = tmp_path / f"netlab-{tag}"
    try:
        assert proc.stdout.readline().strip() == "setup done", proc.stderr.read()[-3000:]
        deadline = time.monotonic() + 60
        server_ns = f"{tag}-server"
        while not NetLab._ns_pids(server_ns):  # the server's start.sh has run: mid-start
            assert time.monotonic() < deadline and proc.poll() is None, "the lab never started its server"
            time.sleep(0.1)
        assert (lab_dir / "provision").is_dir() and (netlab.NETNS_ETC / server_ns / "hosts").is_file()
        proc.send_signal(sig)
        rc = proc.wait(timeout=60)
        out = proc.stdout.read()
        assert "started" not in out  # it was killed mid-start
        assert rc in ((128 + sig,) if sig == signal.SIGTERM else (1, 130, -sig)), (rc, proc.stderr.read()[-3000:])
        assert _lab_leftovers(tag, lab_dir) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# --------------------------------------------------------------------------------------------- the lab
@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("netlab")
    keep = bool(os.environ.get("TREEFLARE_NETLAB_KEEP"))  # debugging: keep the kits and logs (then no check)
    with NetLab(N_SITES, root, keep=keep) as the_lab:
        the_lab.prepare_sites_data(*DATA_ARGS)  # each site's files, bound at that site (docs/DEPLOY.md step 3)
        the_lab.start()
        yield the_lab
        tag, lab_dir = the_lab.tag, the_lab.dir
        print(f"\nnetlab timings: {the_lab.timings}")
    assert _lab_leftovers(tag, lab_dir) == ([f"folder {lab_dir}"] if keep else [])


def test_hosts_see_only_the_lab(lab):
    """Each participant has its address and only the lab's subnet (no default route); names resolve to lab
    addresses from /etc/netns/<ns>/hosts; the root namespace has no lab address; the kits name the server."""
    root_addrs = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    assert netlab.SUBNET not in root_addrs
    for role in lab.roles:  # one shell per host: three answers
        out = lab.exec(role, ["sh", "-c", f"ip route; echo ==; ip -o addr show eth0; echo ==; "
                                          f"getent hosts {lab.names['server']}"], timeout=20).stdout
        routes, addrs, hosts = (part.strip() for part in out.split("=="))
        assert "default" not in routes and routes.split()[0] == f"{netlab.SUBNET}.0/{netlab.PREFIX}", routes
        assert f"inet {lab.address(role)}/" in addrs
        assert hosts.split()[:2] == [lab.address("server"), lab.names["server"]]
    outside = lab.exec("site-1", [sys.executable, "-c", "import socket; s = socket.socket(); s.settimeout(3); "
                                  "print(s.connect_ex(('192.0.2.1', 443)))"], timeout=20)
    assert outside.stdout.strip() == str(101), outside  # ENETUNREACH: no route out of the lab
    client = json.loads((lab.kits["site-1"] / "startup" / "fed_client.json").read_text())
    assert f"{lab.names['server']}:{lab.port}" in json.dumps(client)
    assert sorted(lab.connected()) == lab.sites


def _site_log(lab, site: str, job_id: str) -> str:
    return (lab.kits[site] / job_id / "log.txt").read_text(errors="replace")


@pytest.fixture(scope="module")
def icdta4fl_job(lab):
    """The ICDTA4FL job exported at the admin's host and sent with ``nvflare job submit`` (its id and when): sent
    before the XGBoost job starts, so the two run on the lab at once (a server runs up to 4 jobs)."""
    job = export_job(lab, "icdta4fl", [*ICDTA4FL_ARGS, "--sites", str(N_SITES), "--task-timeout", "60",
                                       "--workspace", lab.dir / "icd_submitter"], lab.dir / "export_icd")
    return lab.submit(job), time.perf_counter()


def test_xgboost_direct_across_hosts(lab, icdta4fl_job):
    """XGBoost with the default ``direct`` transport, run as ``job.py --env prod`` at the admin's host: XGBoost's
    federated server with TLS in the server's namespace, each site connecting to the server's name from its kit;
    every rank's model.json is the same file (hashed here, not only as the job reports it)."""
    ws = lab.dir / "xgb"
    t = time.perf_counter()
    proc = run_job_prod(lab, "xgb_histogram", [*XGB_ARGS, "--sites", str(N_SITES)], ws, timeout=240)
    lab.timings["xgb_job"] = round(time.perf_counter() - t, 1)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    lab.timings["xgb_job_own"] = next((line for line in proc.stdout.splitlines() if line.startswith("timings:")), "")
    report = json.loads((ws / "report.json").read_text())
    transport = report["transport"]
    assert transport["name"] == "direct" and transport["federated_server"]["tls"] is True
    assert transport["federated_server"]["port"] == lab.xgb_port and transport["federated_server_stopped"]
    assert transport["models_identical"] is True and sorted(transport["ranks"]) == lab.sites
    job_id = Path(report["files"]["flare_run_dir"]).parent.name
    hashes = {hashlib.sha256((lab.kits[s] / job_id / "model.json").read_bytes()).hexdigest() for s in lab.sites}
    assert len(hashes) == 1
    assert all(transport["sites"][s]["rounds"] == 10 and transport["sites"][s]["n_train"] > 300 for s in lab.sites)
    for site in lab.sites:
        log = _site_log(lab, site, job_id)
        assert f"XGBoost federated server {lab.names['server']}:{lab.xgb_port}" in log and "TLS on" in log
    model = json.loads((ws / "model.json").read_text())
    assert model["learner"]["gradient_booster"]["model"]["gbtree_model_param"]["num_trees"] != "0"


def test_icdta4fl_across_hosts(lab, icdta4fl_job):
    """ICDTA4FL (exported and submitted by :func:`icdta4fl_job`), awaited and downloaded with the admin kit: the
    global tree, refined on the three sites' summed counts, and every site's data read from its own binding,
    connected to the server's name over TLS from its own address."""
    job_id, t = icdta4fl_job
    status = lab.wait_job(job_id, timeout=240)
    lab.timings["icdta4fl_job"] = round(time.perf_counter() - t, 1)
    assert status == "FINISHED:COMPLETED", status
    result_dir = lab.download(job_id, lab.dir / "results") / "workspace"
    result = json.loads((result_dir / "icdta4fl_result.json").read_text())
    assert result["status"] == "completed" and result["dropped_sites"] == {}, result.get("error")
    assert result["sites_trained"] == lab.sites
    assert result["refinement"]["status"] == "completed", result["refinement"]
    assert result["global"]["n_leaves"] >= 2
    tree = json.loads((result_dir / "global_tree.json").read_text())
    assert tree and (result_dir / "rules.txt").read_text().strip()
    for site in lab.sites:
        log = _site_log(lab, site, job_id)
        assert f"{lab.dir / 'data' / site / 'train.csv'}" in log and "treeflare_site.json" in log
        assert f"{lab.address(site)}:" in log and f"=> {lab.address('server')}:{lab.port} SSL {lab.names['server']}" \
            in log


# --------------------------------------------------------------------------------------------- a fault (last)
def _wait_log_line(lab, site: str, job_id: str, text: str, timeout: float = 90) -> None:
    """Until ``site``'s log of the job holds ``text``."""
    log = lab.kits[site] / job_id / "log.txt"
    deadline = time.monotonic() + timeout
    while not (log.is_file() and text in log.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"{site} never logged {text!r} for job {job_id}"
        time.sleep(0.05)


def _with_task_timeout(job: Path, dest: Path, seconds: int) -> Path:
    """A copy of the exported ICDTA4FL job whose sites have ``seconds`` per task (the admin edits the server's
    config of the exported job, as test_deploy_prod does for min_clients)."""
    out = dest / job.name
    shutil.copytree(job, out)
    cfg_file = out / "app" / "config" / "config_fed_server.json"
    cfg = json.loads(cfg_file.read_text())
    args = cfg["workflows"][0]["args"]
    assert "task_timeout" in args and args.get("min_clients", 2) == 2, args  # (a default is not written)
    args["task_timeout"] = seconds
    cfg_file.write_text(json.dumps(cfg, indent=1))
    return out


def test_site_link_down_for_good_during_icdta4fl(lab, icdta4fl_job):
    """site-3's link is cut (at the bridge) once it has sent its trained tree, and stays cut: the server drops it
    after the next task's timeout and the job completes on site-1 and site-2, naming site-3 as dropped. (Cut at
    a point the site has reached: cut before its job process starts, NVFlare starts the job without it and it is
    never part of the job. Last in the module: site-3 stays cut off.)"""
    job = _with_task_timeout(lab.dir / "export_icd" / "icdta4fl", lab.dir / "export_fault", FAULT_TASK_TIMEOUT)
    t0 = time.perf_counter()
    job_id = lab.submit(job)
    lab.timings["fault_submit"] = round(time.perf_counter() - t0, 1)
    _wait_log_line(lab, "site-3", job_id, "task_name=icdta4fl_train")
    _wait_log_line(lab, "site-3", job_id, "task result sent to server")
    lab.timings["fault_to_trained"] = round(time.perf_counter() - t0, 1)
    t = time.perf_counter()
    lab.link_down("site-3")
    status = lab.wait_job(job_id, timeout=180)
    lab.timings["link_down_job_end"] = round(time.perf_counter() - t, 1)
    assert status == "FINISHED:COMPLETED", status
    result = json.loads((lab.download(job_id, lab.dir / "results") / "workspace" / "icdta4fl_result.json")
                        .read_text())
    assert result["status"] == "completed", result.get("error")
    assert result["sites_trained"] == lab.sites  # its tree had arrived before the cut
    assert list(result["dropped_sites"]) == ["site-3"], result["dropped_sites"]
    assert "no reply" in result["dropped_sites"]["site-3"], result["dropped_sites"]
    assert result["global"]["n_leaves"] >= 2
    assert result["refinement"]["status"].startswith("skipped")  # two sites cannot mask each other's counts
    print(f"\nsite-3 cut off: job ended {lab.timings['link_down_job_end']} s later; "
          f"dropped: {result['dropped_sites']}")
