"""A local FLARE POC system, and the machine-wide lock that lets one FLARE system at a time run here.

NVFlare's POC keeps per-user state in ``~/.nvflare`` and binds port 8002, so a POC is always driven through the
``nvflare`` CLI in a child process whose ``HOME`` and ``NVFLARE_POC_WORKSPACE`` point into one folder (``root``):
nothing of the caller's own NVFlare configuration is read or changed, and ``stop`` always ends every process the
POC started.

    poc = LocalPoc("/tmp/treeflare-poc")
    with flare_lock():
        poc.prepare(["site-1", "site-2", "site-3"]); poc.start()
    outcome = submit_and_collect(poc.admin_kit, job_dir, out_dir, site_dirs=poc.site_dirs())
    poc.stop()
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ..processes import alive, descendants, processes_with_cmdline, send_signal, wait_gone
from .admin import DeployError, local_site_dirs


def default_poc_root() -> Path:
    """Where ``treeflare poc`` and ``scripts/poc.sh`` keep a POC: $TREEFLARE_POC_ROOT, else /tmp/treeflare-poc-<uid>."""
    return Path(os.environ.get("TREEFLARE_POC_ROOT") or f"/tmp/treeflare-poc-{os.getuid()}")

LOCK_FILE = "/tmp/treeflare-flare.lock"
LOCK_HELD_ENV = "TREEFLARE_FLARE_LOCK_HELD"  # set by a caller that already holds LOCK_FILE
DEFAULT_ADMIN = "admin@nvidia.com"
OUTCOME_WAIT_ENV = "NVFLARE_CLIENT_OUTCOME_WAIT_TIMEOUT"
POC_PORT_ENV = "TREEFLARE_POC_PORT"
DEFAULT_POC_PORT = 8002
LOG_STAGING = "log_staging"  # the server's live-log staging folder, inside the POC workspace


@contextmanager
def flare_lock(timeout: float = 1800.0):
    """Hold the machine-wide FLARE lock (the one ``flock /tmp/treeflare-flare.lock`` takes) unless the caller
    says it already holds it: the POC's fixed port, and the tests' FLARE systems, one at a time."""
    if os.environ.get(LOCK_HELD_ENV):
        yield
        return
    fh = open(LOCK_FILE, "a+")
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise DeployError(f"could not take {LOCK_FILE} within {timeout:.0f} s (another FLARE run holds it)")
                time.sleep(0.5)
        yield
    finally:
        fh.close()  # closing releases the lock


def python_env(extra: dict | None = None) -> dict:
    """The environment FLARE services need: this interpreter's bin folder first on PATH (start.sh runs
    ``python3``), and no inherited NVFLARE_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVFLARE_")}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("MPLBACKEND", "Agg")
    env.update(extra or {})
    return env


def _read_pid(path: Path) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def service_pids(kit: Path) -> dict:
    """{"daemon": pid of sub_start.sh, "main": pid of the FLARE process} of one running kit (either may be None)."""
    kit = Path(kit)
    return {"daemon": _read_pid(kit / "daemon_pid.fl"), "main": _read_pid(kit / "pid.fl")}


class LocalPoc:
    """A POC system in ``root`` (``root/home`` is its HOME, ``root/poc`` its workspace)."""

    def __init__(self, root: Path):
        self.root = Path(root).resolve()
        self.home = self.root / "home"
        self.workspace = self.root / "poc"

    # paths ---------------------------------------------------------------------------------
    def env(self) -> dict:
        self.home.mkdir(parents=True, exist_ok=True)
        # NVFlare waits up to 900 s for a lost site's outcome before it marks a finished job finished
        wait = os.environ.get(OUTCOME_WAIT_ENV, "20")
        return python_env({"HOME": str(self.home), "NVFLARE_POC_WORKSPACE": str(self.workspace),
                           OUTCOME_WAIT_ENV: wait})

    @property
    def prod_dir(self) -> Path:
        prods = sorted(self.workspace.glob("*/prod_*"))
        if not prods:
            raise DeployError(f"no POC prepared in {self.workspace} (run `treeflare poc up K`)")
        return prods[-1]

    @property
    def admin_kit(self) -> Path:
        return self.prod_dir / DEFAULT_ADMIN

    @property
    def server_dir(self) -> Path:
        return self.prod_dir / "server"

    @property
    def log_staging(self) -> Path:
        return self.workspace / LOG_STAGING

    def site_dirs(self) -> dict:
        return local_site_dirs(self.admin_kit)

    @property
    def sites(self) -> list[str]:
        try:
            return sorted(self.site_dirs())
        except DeployError:
            return []

    # state ---------------------------------------------------------------------------------
    def prepared(self) -> bool:
        return bool(list(self.workspace.glob("*/prod_*/server/startup")))

    def running(self) -> bool:
        if not self.prepared():
            return False
        return any(alive(p) for p in service_pids(self.server_dir).values())

    # lifecycle -----------------------------------------------------------------------------
    def _cli(self, *args, timeout: float = 180.0) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "nvflare.cli", *args]
        # a new session: the services the CLI starts are not in the caller's process group
        proc = subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, start_new_session=True)
        if proc.returncode != 0:
            raise DeployError(f"`nvflare {' '.join(args)}` failed (rc {proc.returncode}): "
                              f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
        return proc

    @property
    def port(self) -> int:
        try:
            return int(json.loads((self.admin_kit / "startup" / "fed_admin.json").read_text())["admin"]["port"])
        except (OSError, KeyError, ValueError, DeployError):
            return DEFAULT_POC_PORT

    def prepare(self, sites: list[str], port: int | None = None) -> None:
        """A fresh POC workspace for ``sites``; ``port`` (default $TREEFLARE_POC_PORT, else 8002) is the server's
        one port (FL and admin)."""
        if self.running():
            raise DeployError(f"a POC is already running in {self.workspace}; stop it first (treeflare poc down)")
        self.root.mkdir(parents=True, exist_ok=True)
        port = int(port or os.environ.get(POC_PORT_ENV) or DEFAULT_POC_PORT)
        self._cli("poc", "prepare", "-c", *sites, "--force")
        if port != DEFAULT_POC_PORT:  # the same project on another port (NVFlare's way to run POCs side by side)
            import yaml

            project = yaml.safe_load((self.workspace / "project.yml").read_text())
            for p in project["participants"]:
                if p.get("type") == "server":
                    p["fed_learn_port"] = port
            project_file = self.root / "poc_project.yml"  # must live outside the workspace prepare recreates
            project_file.write_text(yaml.safe_dump(project, sort_keys=False))
            self._cli("poc", "prepare", "-i", str(project_file), "--force")
        stage_logs_in(self.server_dir, self.log_staging)

    def start(self, timeout: float = 180.0) -> None:
        _check_port_free(self.port)
        try:
            self._cli("poc", "start", timeout=timeout)
        except (DeployError, subprocess.TimeoutExpired) as exc:
            self.stop()
            raise DeployError(f"POC did not start: {exc}. Console logs: {self.prod_dir}/*/poc_console.log") from exc

    def stop(self, timeout: float = 60.0) -> None:
        """Stop the POC; whatever is left after ``nvflare poc stop`` (or if it fails) is killed."""
        if not self.prepared():
            return
        if self.running():
            try:
                self._cli("poc", "stop", timeout=timeout)
            except (DeployError, subprocess.TimeoutExpired) as exc:
                print(f"warning: nvflare poc stop: {exc}; killing the POC processes", file=sys.stderr)
        doomed = [p for kit in [self.server_dir, *self.site_dirs().values()] for p in service_pids(kit).values() if p]
        doomed += processes_with_cmdline(str(self.workspace))
        send_signal(doomed + descendants(doomed))
        wait_gone(processes_with_cmdline(str(self.workspace)), timeout=10)
        remove_empty_folders(self.log_staging)


def stage_logs_in(server_dir: Path, folder: Path) -> None:
    """Point the server's ``JobLogReceiver`` (a system component of every NVFlare server) at ``folder``: by default
    it stages the logs the sites stream into ``<system temp>/<job id>/<site>/`` and hands each file to the job
    store, which moves it away and leaves the two folders behind in the system temp folder for every job."""
    for name in ("resources.json", "resources.json.default"):  # NVFlare reads the first that exists
        path = server_dir / "local" / name
        if not path.is_file():
            continue
        doc = json.loads(path.read_text())
        for comp in doc.get("components", []):
            if str(comp.get("path", "")).endswith(".JobLogReceiver"):
                comp.setdefault("args", {})["dest_dir"] = str(folder)
        path.write_text(json.dumps(doc, indent=4))


def remove_empty_folders(root: Path) -> None:
    """Remove the empty folders under ``root`` (deepest first), and ``root`` if it ends up empty: what the log
    receiver leaves once the job store has taken its files. A partial log (a stream that broke) stays."""
    root = Path(root)
    if not root.is_dir():
        return
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()
        except OSError:  # not empty
            pass
    try:
        root.rmdir()
    except OSError:
        pass


def _check_port_free(port: int) -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            raise DeployError(f"port {port} is in use: another POC (or service) is running on this machine. "
                              "Stop it first (treeflare poc down), or wait for it to finish.")
