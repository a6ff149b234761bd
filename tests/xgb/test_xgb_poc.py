"""The XGBoost job's direct transport on a real local POC system (mutual TLS between FLARE participants):
XGBoost's federated server really uses TLS with the startup kits' certificates (clients without a certificate are
refused), the report is written, and a site killed during training ends the job within a bounded time with the
site named in the report, the federated server stopped, and nothing left listening or running.

One POC for the module (isolated HOME and POC workspace, a free port instead of 8002), started under the
machine-wide FLARE lock and always stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from flare_helpers import REPO, flare_lock, free_port, isolated_env, kill_token, processes_with_token

pytestmark = [pytest.mark.flare, pytest.mark.flare_lock]  # runs under the machine-wide FLARE lock
pytest.importorskip("tensorboard")
pytest.importorskip("xgboost")

JOB = str(REPO / "jobs" / "xgb_histogram" / "job.py")
SITES = ["site-1", "site-2", "site-3"]


@pytest.fixture(scope="module")
def poc(tmp_path_factory):
    from treeflare.flare.poc import LocalPoc

    root = tmp_path_factory.mktemp("xgbpoc")
    token = uuid.uuid4().hex
    env = isolated_env(root, token)
    env.update({"TREEFLARE_FLARE_LOCK_HELD": "1",
                "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", "")})
    system = LocalPoc(root / "system")
    with flare_lock():
        try:
            system.prepare(SITES, port=free_port())
            system.start()
            yield {"root": root, "env": env, "poc": system}
        finally:
            system.stop()
            left = processes_with_token(token)
            kill_token(token)
            assert not left, f"processes left behind: {left}"
            assert not _fedserver_pids(under=root), "an XGBoost federated server outlived the POC"


def _fedserver_pids(port: int | None = None, under: Path | None = None) -> list[int]:
    """Our federated server processes (``.../treeflare/xgb/fedserver.py WORLD PORT ...``), optionally on one port,
    or only those started ``under`` a folder: their environment, inherited from the POC's server, names it (the
    POC's HOME and workspace); a simulator run elsewhere on this machine (another pytest worker) has its own."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(b"treeflare/xgb/fedserver.py") for a in argv) and \
                    (port is None or str(port).encode() in argv) and (under is None or _env_names(entry, under)):
                out.append(int(entry))
    return out


def _job(poc, ws: Path, port: int, *args) -> list[str]:
    return [sys.executable, JOB, *args, "--sites", "3", "--xgb-port", str(port), "--env", "poc",
            "--poc-root", str(poc["poc"].root), "--workspace", str(ws), "--timeout", "240"]


def test_direct_on_poc_uses_tls_and_writes_the_report(poc):
    from treeflare.xgb.fedserver import listening

    ws, port = poc["root"] / "ok", free_port()
    proc = subprocess.run(_job(poc, ws, port, "--dataset", "car", "--rounds", "3", "--max-depth", "3",
                               "--baselines", "centralized", "--progress"),
                          env=poc["env"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((ws / "report.json").read_text())
    t = report["transport"]
    assert t["name"] == "direct" and t["federated_server"]["tls"] is True, t
    assert t["federated_server"]["bind"] == f"0.0.0.0:{port}" and t["federated_server_stopped"] is True
    assert t["ranks"] == {"site-1": 0, "site-2": 1, "site-3": 2} and t["models_identical"] is True
    assert report["global"]["accuracy"] == pytest.approx(report["baselines"]["centralized"]["accuracy"], abs=1e-9)
    log = next((ws / "flare" / "poc_result").glob("*/workspace/xgb_federated_server.log")).read_text()
    assert f"Federated server listening on 0.0.0.0:{port}" in log and "Insecure" not in log
    assert not listening(port) and not _fedserver_pids(port)
    # progress lines from the server (show_stats while it runs, the downloaded progress.jsonl for the last ones)
    assert [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("round ")] == ["1/3", "2/3", "3/3"]


def test_engine_treeflare_on_poc_talks_mutual_tls_on_its_own_port(poc):
    """--engine treeflare on a POC: the sites' connections to --xgb-port use mutual TLS with the kits (the
    handshake needs the server to accept while the setup task is out), the model equals XGBoost's hist on the pooled
    rows, and nothing listens on the port afterwards."""
    from treeflare.xgb.fedserver import listening

    ws, port = poc["root"] / "engine", free_port()
    proc = subprocess.run(_job(poc, ws, port, "--dataset", "car", "--engine", "treeflare", "--rounds", "3",
                               "--max-depth", "3", "--baselines", "centralized"),
                          env=poc["env"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((ws / "report.json").read_text())
    result = json.loads(next((ws / "flare" / "poc_result").glob("*/workspace/engine_result.json")).read_text())
    assert result["channel"] == {"bind": f"0.0.0.0:{port}", "tls": True} and result["channel_closed"] is True
    assert report["comparison"]["centralized"]["max_abs_pred_diff"] < 1e-5
    assert not listening(port)


def test_tls_refuses_clients_without_a_certificate_and_a_killed_site_ends_the_job(poc):
    """While the job trains: a plain client and a TLS client without a certificate are refused by the XGBoost
    port, a client with site-1's kit certificate is accepted. Then site-3's job process is killed."""
    import grpc

    from test_xgb_direct_units import grpc_ready
    from treeflare.xgb.fedserver import listening

    ws, port = poc["root"] / "killed", free_port()
    job = subprocess.Popen(_job(poc, ws, port, "--dataset", "adult", "--rounds", "2000", "--baselines", ""),
                           env=poc["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not listening(port):
            assert job.poll() is None, job.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the XGBoost federated server never listened"
            time.sleep(0.2)
        kit = poc["poc"].site_dirs()["site-1"] / "startup"
        ca = (kit / "rootCA.pem").read_bytes()
        assert not grpc_ready(port, timeout=2), "plain TCP accepted by the XGBoost port"
        assert not grpc_ready(port, grpc.ssl_channel_credentials(root_certificates=ca), timeout=2), \
            "a client without a certificate was accepted"
        assert grpc_ready(port, grpc.ssl_channel_credentials(ca, (kit / "client.key").read_bytes(),
                                                             (kit / "client.crt").read_bytes()), timeout=10)
        # the teardown's check finds this POC's federated servers (and only these) by their environment
        assert _fedserver_pids(port, under=poc["root"]) == _fedserver_pids(port) != []
        site3 = str(poc["poc"].site_dirs()["site-3"]).encode()
        workers = [int(p) for p in os.listdir("/proc") if p.isdigit() and _is_job_worker(p, site3)]
        assert workers, "site-3's job process not found"
        time.sleep(2)  # training under way
        assert job.poll() is None, "the job ended before site-3 was killed"
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        t_kill = time.monotonic()
        out, err = job.communicate(timeout=120)
        ended = time.monotonic() - t_kill
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode != 0
    assert ended < 60, f"the job took {ended:.0f} s to end after the kill"
    report = json.loads((ws / "report.json").read_text())
    assert report["status"] == "failed" and "site-3" in report["error"], report
    assert report["federated_server_stopped"] is True
    assert "site-3" in err
    assert not listening(port) and not _fedserver_pids(port)


def _env_names(pid: str, folder: Path) -> bool:
    try:
        return b"=" + str(Path(folder).resolve()).encode() + b"/" in Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False


def _is_job_worker(pid: str, kit: bytes) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"worker_process" in cmd and kit in cmd
