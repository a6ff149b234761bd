"""Running jobs on real FLARE systems: a local POC, or a provisioned project reached through an admin kit.

Everything here runs on the submitter's machine (never on a site). NVFlare's POC keeps per-user state in
``~/.nvflare`` and binds port 8002, so a POC is always driven through the ``nvflare`` CLI in a child process
whose ``HOME`` and ``NVFLARE_POC_WORKSPACE`` point into one folder (``root``): nothing of the caller's own
NVFlare configuration is read or changed, and ``stop`` always ends every process the POC started.

    poc = LocalPoc("/tmp/treeflare-poc")
    poc.prepare(["site-1", "site-2", "site-3"]); poc.start()
    outcome = submit_and_collect(poc.admin_kit, job_dir, out_dir, site_dirs=poc.site_dirs())
    poc.stop()

(Over 400 lines: POC, admin-kit submission and result collection share the process-group and lock
handling that makes sure nothing outlives a run; splitting them would duplicate it.)
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

LOCK_FILE = "/tmp/treeflare-flare.lock"
LOCK_HELD_ENV = "TREEFLARE_FLARE_LOCK_HELD"  # set by a caller that already holds LOCK_FILE
DEFAULT_ADMIN = "admin@nvidia.com"
FINISHED_OK = "FINISHED:COMPLETED"
OUTCOME_WAIT_ENV = "NVFLARE_CLIENT_OUTCOME_WAIT_TIMEOUT"
POC_PORT_ENV = "TREEFLARE_POC_PORT"
DEFAULT_POC_PORT = 8002


class DeployError(RuntimeError):
    """A POC/provisioned system could not be started, reached or used; the message says what to do."""


# --------------------------------------------------------------------------------------------- locking
@contextmanager
def flare_lock(timeout: float = 1800.0):
    """Hold the machine-wide FLARE lock (the one ``flock /tmp/treeflare-flare.lock`` takes) unless the caller
    says it already holds it."""
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


# --------------------------------------------------------------------------------------------- admin kits
def admin_username(admin_kit: Path) -> str:
    """The admin's user name: the common name of the kit's certificate (what the server authenticates)."""
    admin_kit = Path(admin_kit)
    cert = admin_kit / "startup" / "client.crt"
    if not cert.is_file():
        raise DeployError(f"{admin_kit} is not an admin startup kit (no startup/client.crt)")
    try:
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        subject = x509.load_pem_x509_certificate(cert.read_bytes()).subject
        return subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    except Exception:  # fall back to the folder name, which provisioning sets to the user name
        return admin_kit.name


def _session(admin_kit: Path, timeout: float = 30.0):
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    admin_kit = Path(admin_kit).resolve()
    try:
        return new_secure_session(admin_username(admin_kit), str(admin_kit), timeout=timeout)
    except Exception as exc:
        raise DeployError(f"cannot reach the FLARE server with the admin kit {admin_kit}: {exc}. "
                          "Is the server running (startup/start.sh, or scripts/poc.sh up)?") from exc


def connected_sites(admin_kit: Path, timeout: float = 30.0) -> list[str]:
    sess = _session(admin_kit, timeout)
    try:
        return sorted(c.name for c in sess.get_connected_client_list())
    finally:
        sess.close()


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


# --------------------------------------------------------------------------------------------- jobs
@dataclass
class JobOutcome:
    job_id: str
    status: str
    meta: dict
    out_dir: Path
    server_dir: Path | None = None  # the server's run folder (the controller's files)
    site_dirs: dict = field(default_factory=dict)  # site -> its gathered run folder

    @property
    def ok(self) -> bool:
        return self.status == FINISHED_OK


def submit_job(admin_kit: Path, job_dir: Path) -> str:
    job_dir = Path(job_dir).resolve()
    if not (job_dir / "meta.json").is_file():
        raise DeployError(f"{job_dir} is not a job folder (no meta.json); export one with `job.py --export DIR`")
    sess = _session(admin_kit)
    try:
        return sess.submit_job(str(job_dir))
    finally:
        sess.close()


def job_status(admin_kit: Path, job_id: str) -> str | None:
    sess = _session(admin_kit)
    try:
        return sess.get_job_status(job_id)
    finally:
        sess.close()


def abort_job(admin_kit: Path, job_id: str) -> None:
    sess = _session(admin_kit)
    try:
        sess.abort_job(job_id)
    finally:
        sess.close()


def wait_for_status(admin_kit: Path, job_id: str, want=("RUNNING",), timeout: float = 60.0,
                    poll: float = 0.5) -> str:
    """Poll until the job's status starts with one of ``want`` (or is terminal); return it."""
    deadline = time.monotonic() + timeout
    sess = _session(admin_kit)
    status = None
    try:
        while time.monotonic() < deadline:
            status = sess.get_job_status(job_id) or ""
            if status.startswith(tuple(want)) or status.startswith("FINISHED"):
                return status
            time.sleep(poll)
    finally:
        sess.close()
    raise DeployError(f"job {job_id} is still {status!r} after {timeout:.0f} s")


def collect_job(admin_kit: Path, job_id: str, out_dir: Path, *, timeout: float = 3600.0, site_dirs=None,
                poll: float = 1.0) -> JobOutcome:
    """Wait for ``job_id`` to finish, download the server's result into ``out_dir/<job_id>/`` and copy each
    site's run folder found under ``site_dirs`` (site -> that site's workspace, on this machine) into
    ``out_dir/<site>/<job_id>/``. A job that does not finish in ``timeout`` seconds is aborted."""
    from nvflare.fuel.flare_api.api_spec import JobTimeout

    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    sess = _session(admin_kit)
    try:
        try:
            meta = sess.wait_for_job(job_id, timeout=timeout, poll_interval=poll)
        except JobTimeout:
            try:
                sess.abort_job(job_id)
            except Exception:
                pass
            raise DeployError(f"job {job_id} did not finish within {timeout:.0f} s; it was aborted")
        status = str(meta.get("status"))
        dest = out_dir / job_id
        if dest.exists():
            shutil.rmtree(dest)
        server_dir = None
        try:
            downloaded = sess.download_job_result(job_id, destination=str(out_dir))
            if downloaded and Path(downloaded).is_dir():
                server_dir = Path(downloaded) / "workspace"
                if not server_dir.is_dir():
                    server_dir = Path(downloaded)
        except Exception as exc:  # a failed job may have no result to download
            print(f"warning: could not download the result of job {job_id}: {exc}", file=sys.stderr)
    finally:
        sess.close()
    outcome = JobOutcome(job_id, status, meta, out_dir, server_dir)
    for site, site_ws in (site_dirs or {}).items():
        src = Path(site_ws) / job_id
        if src.is_dir():
            dst = out_dir / site / job_id
            if dst.exists():
                shutil.rmtree(dst)
            # the job's own code comes back with the server result; keep the site's logs and files
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("custom", "__pycache__"), symlinks=True)
            outcome.site_dirs[site] = dst
    (out_dir / f"{job_id}.meta.json").write_text(json.dumps(meta, indent=1, default=str))
    return outcome


def submit_and_collect(admin_kit: Path, job_dir: Path, out_dir: Path, *, timeout: float = 3600.0,
                       site_dirs=None, watch=None) -> JobOutcome:
    """``watch(job_id)``: a context manager kept open while the job runs (e.g. printing its progress)."""
    job_id = submit_job(admin_kit, job_dir)
    print(f"submitted job {job_id} ({Path(job_dir).name}); waiting up to {timeout:.0f} s", flush=True)
    with (watch(job_id) if watch else nullcontext()):
        return collect_job(admin_kit, job_id, out_dir, timeout=timeout, site_dirs=site_dirs)


def local_site_dirs(admin_kit: Path) -> dict:
    """Site workspaces next to the admin kit (a POC, or a project provisioned and run on this machine)."""
    prod = Path(admin_kit).resolve().parent
    return {p.name: p for p in sorted(prod.iterdir())
            if (p / "startup" / "fed_client.json").is_file()} if prod.is_dir() else {}


# --------------------------------------------------------------------------------------------- processes
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _read_pid(path: Path) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def processes_under(folder: Path) -> list[int]:
    """Pids of processes whose command line mentions ``folder`` (the FLARE services of one kit or POC)."""
    needle = str(Path(folder).resolve()).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if needle in fh.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def descendants(pids) -> list[int]:
    """All live descendants of ``pids`` (e.g. the ``sleep`` a watchdog script is waiting on)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [p for p in pids if p]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return out


def kill_pids(pids, sig=signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def service_pids(kit: Path) -> dict:
    """{"daemon": pid of sub_start.sh, "main": pid of the FLARE process} of one running kit (either may be None)."""
    kit = Path(kit)
    return {"daemon": _read_pid(kit / "daemon_pid.fl"), "main": _read_pid(kit / "pid.fl")}


def python_env(extra: dict | None = None) -> dict:
    """The environment FLARE services need: this interpreter's bin folder first on PATH (start.sh runs
    ``python3``), and no inherited NVFLARE_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVFLARE_")}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("MPLBACKEND", "Agg")
    env.update(extra or {})
    return env


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
    """Stop kits' services the way ``stop_fl.sh`` does (shutdown.fl + kill), all at once, then make sure: kill
    their watchdog daemons, FLARE processes and any job process still running from their folders.
    Returns True if anything was running."""
    kits = [Path(k).resolve() for k in kits]
    all_pids = []
    for kit in kits:
        pids = service_pids(kit)
        all_pids += [p for p in pids.values() if p]
        (kit / "shutdown.fl").touch()
        if pids["main"]:
            kill_pids([pids["main"]], signal.SIGTERM)
    running = [p for p in all_pids if _alive(p)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in all_pids):
        time.sleep(0.3)
    for kit in kits:
        doomed = all_pids + processes_under(kit)
        kill_pids(doomed + descendants(doomed))
        for name in ("pid.fl", "daemon_pid.fl", "shutdown.fl", "restart.fl"):
            (kit / name).unlink(missing_ok=True)
    return bool(running)


def kill_site(kit: Path, sig=signal.SIGKILL) -> list[int]:
    """Fault injection: send ``sig`` to every process of one site (watchdog daemon first, so SIGKILL is not
    followed by an automatic restart; SIGSTOP freezes the site so it never answers)."""
    kit = Path(kit).resolve()
    pids = service_pids(kit)
    ordered = [p for p in (pids["daemon"], pids["main"]) if p] + processes_under(kit)
    ordered += descendants(ordered)
    seen, out = set(), []
    for p in ordered:
        if p not in seen and _alive(p):
            seen.add(p)
            out.append(p)
    kill_pids(out, sig)
    return out


# --------------------------------------------------------------------------------------------- POC
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
            raise DeployError(f"no POC prepared in {self.workspace} (run `scripts/poc.sh up K`)")
        return prods[-1]

    @property
    def admin_kit(self) -> Path:
        return self.prod_dir / DEFAULT_ADMIN

    @property
    def server_dir(self) -> Path:
        return self.prod_dir / "server"

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
        pids = service_pids(self.server_dir)
        return any(p and _alive(p) for p in pids.values())

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
            raise DeployError(f"a POC is already running in {self.workspace}; stop it first (scripts/poc.sh down)")
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
        doomed = []
        for kit in [self.server_dir, *self.site_dirs().values()]:
            doomed += [p for p in service_pids(kit).values() if p]
        doomed += processes_under(self.workspace)
        kill_pids(doomed + descendants(doomed))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and processes_under(self.workspace):
            time.sleep(0.2)


def _check_port_free(port: int) -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            raise DeployError(f"port {port} is in use: another POC (or service) is running on this machine. "
                              "Stop it first (scripts/poc.sh down), or wait for it to finish.")


# --------------------------------------------------------------------------------------------- CLI
def main(argv=None) -> int:
    """``python -m treeflare.flare.deploy poc-up|poc-down|poc-status|submit ...`` (used by scripts/poc.sh)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m treeflare.flare.deploy", description=main.__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("poc-up", help="prepare and start a POC with K sites")
    up.add_argument("--root", type=Path, required=True)
    up.add_argument("sites", type=int)
    for name in ("poc-down", "poc-status"):
        sub.add_parser(name).add_argument("--root", type=Path, required=True)
    s = sub.add_parser("submit", help="submit an exported job folder, wait, download the result")
    s.add_argument("job_dir", type=Path)
    s.add_argument("--startup-kit", type=Path, help="admin kit (default: the POC's, with --root)")
    s.add_argument("--root", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--timeout", type=float, default=3600.0)
    args = p.parse_args(argv)
    try:
        if args.cmd == "poc-up":
            poc = LocalPoc(args.root)
            if poc.running():
                raise DeployError(f"a POC is already running in {poc.root} with sites {poc.sites}; "
                                  "run `scripts/poc.sh down` first")
            sites = [f"site-{i + 1}" for i in range(args.sites)]
            t = time.perf_counter()
            with flare_lock():
                poc.prepare(sites)
                poc.start()
            print(f"POC up in {time.perf_counter() - t:.1f} s: server localhost:{poc.port}, sites {', '.join(sites)}\n"
                  f"  workspace {poc.workspace}\n  admin kit {poc.admin_kit}")
        elif args.cmd == "poc-down":
            poc = LocalPoc(args.root)
            was = poc.running()
            t = time.perf_counter()
            poc.stop()
            print(f"POC stopped in {time.perf_counter() - t:.1f} s" if was else "no POC was running")
        elif args.cmd == "poc-status":
            poc = LocalPoc(args.root)
            if not poc.running():
                print(f"no POC running in {poc.root}")
                return 1
            print(f"POC running in {poc.root}: sites {poc.sites}; connected: "
                  f"{connected_sites(poc.admin_kit)}\n  admin kit {poc.admin_kit}")
        elif args.cmd == "submit":
            if args.startup_kit:
                kit, sites = args.startup_kit, local_site_dirs(args.startup_kit)
            elif args.root:
                poc = LocalPoc(args.root)
                kit, sites = poc.admin_kit, poc.site_dirs()
            else:
                raise DeployError("submit needs --startup-kit or --root")
            outcome = submit_and_collect(kit, args.job_dir, args.out, timeout=args.timeout, site_dirs=sites)
            print(f"job {outcome.job_id}: {outcome.status}\n  server result: {outcome.server_dir}")
            for site, d in outcome.site_dirs.items():
                print(f"  {site}: {d}")
            return 0 if outcome.ok else 1
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
