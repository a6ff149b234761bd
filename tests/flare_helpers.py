"""Running a job script the way a user does, in isolation, and leaving no process behind.

NVFlare's simulator starts itself with ``setsid`` (its own process group), so killing our child's
group is not enough. Every process we start carries a unique token in its environment; at the end
we kill whatever still carries it.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
TOKEN_VAR = "TREEFLARE_TEST_TOKEN"


JOB_MODULES = {"icdta4fl": "treeflare.jobs.icdta4fl", "xgb_histogram": "treeflare.jobs.xgb_histogram",
               "vertical_tree": "treeflare.jobs.vertical_tree"}


def job_module(job: str):
    """A job's module in the package (``jobs/<job>/job.py`` is a thin wrapper of it), to call its main() in process."""
    return importlib.import_module(JOB_MODULES[job])


def load_script(relpath: str, name: str):
    """A script that stays outside the package (a benchmark, ``scripts/netlab.py``) as a module, to call its main()
    in process. Its folder is importable, as when Python runs the script (a benchmark imports bench_common)."""
    folder = str((REPO / relpath).parent)
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, REPO / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def isolated_env(tmp_path: Path, token: str) -> dict:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVFLARE_")}
    env.update({"HOME": str(home), TOKEN_VAR: token, "PYTHONUNBUFFERED": "1",
                "NVFLARE_POC_WORKSPACE": str(tmp_path / "poc"), "MPLBACKEND": "Agg"})
    return env


def processes_with_token(token: str) -> list[psutil.Process]:
    found = []
    needle = f"{TOKEN_VAR}={token}".encode()
    for proc in psutil.process_iter(["pid"]):
        try:
            with open(f"/proc/{proc.pid}/environ", "rb") as fh:
                if needle in fh.read() and proc.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                    found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def kill_token(token: str) -> int:
    procs = processes_with_token(token)
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)
    return len(procs)


def run_script(script: str, args: list[str], tmp_path: Path, timeout: float = 300,
               python_path: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python <script> <args>`` from the repo root; kill everything it started afterwards. ``python_path``:
    a folder whose packages come first (another XGBoost, say)."""
    token = uuid.uuid4().hex
    env = isolated_env(tmp_path, token)
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (python_path, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, str(REPO / script), *args]
    try:
        return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                              start_new_session=True)
    finally:
        kill_token(token)
        assert not processes_with_token(token), "processes left behind"


# ------------------------------------------------------------------------------------------------------
# Real FLARE systems (POC, provisioned projects) for the deployment and fault tests.
import socket  # noqa: E402
import time  # noqa: E402

# One lock for every FLARE run on this machine, shared with the job scripts' POC/prod paths.
from treeflare.flare.poc import flare_lock  # noqa: E402,F401


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cmd(cmd: list[str], env: dict, timeout: float = 300, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, start_new_session=True)


class LocalProject:
    """A project provisioned with scripts/provision.sh and started from its startup kits on this machine,
    as an operator would on separate hosts. Every process it starts carries ``token`` in its environment."""

    def __init__(self, root: Path, n_sites: int = 3, port: int | None = None):
        import deploy_helpers

        self.deploy = deploy_helpers
        self.root = Path(root)
        self.token = uuid.uuid4().hex
        self.env = isolated_env(self.root, self.token)
        self.env.update({"PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
                         "TREEFLARE_FLARE_LOCK_HELD": "1",
                         # a finished job waits this long (default 900 s) for the outcome of a site that died
                         "NVFLARE_CLIENT_OUTCOME_WAIT_TIMEOUT": "5"})
        self.sites = [f"site-{i + 1}" for i in range(n_sites)]
        self.port = port or free_port()
        self.data_dir = self.root / "data"
        self.prod: Path | None = None
        self.timings: dict = {}

    def provision(self) -> subprocess.CompletedProcess:
        t = time.perf_counter()
        proc = run_cmd(["bash", str(REPO / "scripts" / "provision.sh"), "-w", str(self.root / "provision"),
                        "--port", str(self.port), "--sites", str(len(self.sites)), "--data-dir", str(self.data_dir)],
                       self.env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
        self.prod = sorted((self.root / "provision" / "treeflare").glob("prod_*"))[-1]
        self.timings["provision"] = time.perf_counter() - t
        return proc

    def kit(self, name: str) -> Path:
        return self.prod / name

    @property
    def server_kit(self) -> Path:
        return self.kit("localhost")

    @property
    def admin_kit(self) -> Path:
        return self.kit("admin@treeflare.org")

    def start(self, timeout: float = 180) -> None:
        t = time.perf_counter()
        self.deploy.start_kit(self.server_kit, self.env)
        for site in self.sites:
            self.deploy.start_kit(self.kit(site), self.env)
        self.wait_connected(timeout=timeout)
        self.timings["start"] = time.perf_counter() - t

    def wait_connected(self, sites=None, timeout: float = 120) -> list[str]:
        return self.deploy.wait_for_sites(self.admin_kit, sites or self.sites, timeout=timeout)

    def registrations(self, site: str) -> int:
        log = self.kit(site) / "log.txt"
        return log.read_text(errors="replace").count(f"Successfully registered client:{site}") if log.is_file() else 0

    def restart_site(self, site: str, timeout: float = 120) -> None:
        """Stop whatever is left of ``site`` and start it again from its kit; return once it has registered
        anew (the server may still list the dead one)."""
        before = self.registrations(site)
        self.deploy.stop_kit(self.kit(site), timeout=1)
        self.deploy.start_kit(self.kit(site), self.env)
        deadline = time.monotonic() + timeout
        while self.registrations(site) <= before:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{site} did not register again within {timeout} s")
            time.sleep(0.5)
        self.wait_connected([site], timeout=timeout)

    def stop(self) -> list:
        """Stop every kit the way an operator would; return what was still running afterwards (then killed)."""
        t = time.perf_counter()
        try:
            self.deploy.stop_kits([*(self.kit(s) for s in self.sites), self.server_kit], timeout=8)
        except Exception:
            pass
        deadline = time.monotonic() + 5
        while self.leftover() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = self.leftover()
        kill_token(self.token)
        self.timings["stop"] = time.perf_counter() - t
        return left

    def leftover(self) -> list:
        return processes_with_token(self.token)
