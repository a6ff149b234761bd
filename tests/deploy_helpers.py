"""What only the deployment and fault tests do to a real FLARE system: start and stop provisioned startup kits
on this machine, kill or freeze a site, wait for sites and job states through the admin kit."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from treeflare.flare.admin import DeployError, admin_session, connected_sites
from treeflare.flare.poc import python_env, service_pids
from treeflare.processes import alive, descendants, processes_with_cmdline, send_signal, wait_gone


# --------------------------------------------------------------------------------------------- kits
def start_kit(kit: Path, env: dict | None = None, log_name: str = "console.log") -> None:
    """Run a provisioned kit's ``startup/start.sh`` in the background (it forks its own watchdog daemon)."""
    kit = Path(kit).resolve()
    start = kit / "startup" / "start.sh"
    if not start.is_file():
        raise DeployError(f"{kit} has no startup/start.sh")
    for stale in ("shutdown.fl", "restart.fl"):
        (kit / stale).unlink(missing_ok=True)
    with open(kit / log_name, "ab") as log:
        subprocess.run(["bash", str(start)], cwd=kit, env=env or python_env(), stdout=log, stderr=subprocess.STDOUT,
                       stdin=subprocess.DEVNULL, check=True, timeout=60)


def stop_kit(kit: Path, timeout: float = 20.0) -> bool:
    """Stop one kit's service; see :func:`stop_kits`."""
    return stop_kits([kit], timeout)


def stop_kits(kits, timeout: float = 20.0) -> bool:
    """Stop kits' services the way ``stop_fl.sh`` does (shutdown.fl + SIGTERM), all at once, then make sure: kill
    their watchdog daemons, FLARE processes and any job process still running from their folders.
    Returns True if anything was running."""
    kits = [Path(k).resolve() for k in kits]
    all_pids = []
    for kit in kits:
        pids = service_pids(kit)
        all_pids += [p for p in pids.values() if p]
        (kit / "shutdown.fl").touch()
        if pids["main"]:
            send_signal([pids["main"]], signal.SIGTERM)
    running = [p for p in all_pids if alive(p)]
    wait_gone(all_pids, timeout)
    for kit in kits:
        doomed = all_pids + processes_with_cmdline(str(kit))
        send_signal(doomed + descendants(doomed))
        for name in ("pid.fl", "daemon_pid.fl", "shutdown.fl", "restart.fl"):
            (kit / name).unlink(missing_ok=True)
    return bool(running)


def kill_site(kit: Path, sig=signal.SIGKILL) -> list[int]:
    """Fault injection: send ``sig`` to every process of one site (watchdog daemon first, so SIGKILL is not
    followed by an automatic restart; SIGSTOP freezes the site so it never answers)."""
    kit = Path(kit).resolve()
    pids = service_pids(kit)
    ordered = [p for p in (pids["daemon"], pids["main"]) if p] + processes_with_cmdline(str(kit))
    ordered += descendants(ordered)
    out = [p for i, p in enumerate(ordered) if p not in ordered[:i] and alive(p)]
    send_signal(out, sig)
    return out


# --------------------------------------------------------------------------------------------- admin
def wait_for_sites(admin_kit: Path, sites, timeout: float = 120.0) -> list[str]:
    """Wait until every site in ``sites`` is connected; return the connected list."""
    deadline = time.monotonic() + timeout
    want = set(sites)
    have: list[str] = []
    while time.monotonic() < deadline:
        try:
            have = connected_sites(admin_kit, timeout=10)
            if want <= set(have):
                return have
        except DeployError:
            pass
        time.sleep(1.0)
    raise DeployError(f"sites {sorted(want - set(have))} did not connect within {timeout:.0f} s (connected: {have})")


def job_status(admin_kit: Path, job_id: str) -> str | None:
    with admin_session(admin_kit) as sess:
        return sess.get_job_status(job_id)


def abort_job(admin_kit: Path, job_id: str) -> None:
    with admin_session(admin_kit) as sess:
        sess.abort_job(job_id)


def wait_for_status(admin_kit: Path, job_id: str, want=("RUNNING",), timeout: float = 60.0,
                    poll: float = 0.5) -> str:
    """Poll until the job's status starts with one of ``want`` (or is terminal); return it."""
    deadline = time.monotonic() + timeout
    status = None
    with admin_session(admin_kit) as sess:
        while time.monotonic() < deadline:
            status = sess.get_job_status(job_id) or ""
            if status.startswith(tuple(want)) or status.startswith("FINISHED"):
                return status
            time.sleep(poll)
    raise DeployError(f"job {job_id} is still {status!r} after {timeout:.0f} s")
