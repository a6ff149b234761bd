#!/usr/bin/env python
"""A federation of separate hosts on one machine: one Linux network namespace per participant, provisioned kits.

    sudo .venv/bin/python scripts/netlab.py up --sites 2 [--dataset car]   # prints hosts, kits, how to submit;
                                                                         # Ctrl-C tears it down
    sudo .venv/bin/python scripts/netlab.py run-icdta4fl --sites 3         # a lab, one job across it, teardown
    sudo .venv/bin/python scripts/netlab.py run-xgb --sites 3
    sudo .venv/bin/python scripts/netlab.py list | clean TAG               # a lab killed with SIGKILL: remove it

Layout (``tag`` = "tf" + pid + 4 random hex digits, in every name the lab makes, so two labs or a leftover never
collide): a namespace ``<tag>-net`` holds a Linux bridge; each participant (``server``, ``site-1..N``, ``admin``)
gets a namespace ``<tag>-<role>`` whose ``eth0`` is one end of a veth pair, the other end on the bridge. Addresses
come from 198.18.0.0/15 (RFC 2544's benchmarking range), there is no default route and nothing is attached to the
machine's own interfaces: the root namespace never sees a lab address, and traffic stays inside the lab. Each
namespace has ``/etc/netns/<ns>/hosts`` (``ip netns exec`` mounts it over /etc/hosts) naming every participant,
so the kits' host names (``fl-server.treeflare.test``, ...) resolve as on real hosts.

Kits are provisioned with scripts/provision.sh for those names; each participant runs in its own namespace with its
own HOME, started from its kit's ``startup/start.sh`` as an operator would. Jobs are submitted from the admin
namespace with ``nvflare job submit`` and the admin kit, or by running ``job.py --env prod`` there.

Teardown is always done (context exit, atexit, SIGTERM/SIGINT/SIGHUP): every process in the lab's namespaces
is killed (and every process group the lab started, and any process carrying its token), the namespaces are
deleted (which deletes the veths and the bridge), ``/etc/netns/<tag>-*`` and the lab's folder are removed.
Only names carrying this lab's tag are ever deleted. Needs root and ``ip netns`` (:func:`unavailable` says why
not).

(Over 400 lines: the lab, its fault switches, the admin-side job calls and the command line are one tool that the
tests, scripts/netlab_faults.py and a person at a terminal share.)
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOMAIN = "treeflare.test"
SERVER_NAME = f"fl-server.{DOMAIN}"
SUBNET = "198.18.0"  # a /24 of 198.18.0.0/15: server .1, admin .2, site-i .(10 + i)
PREFIX = 24
TOKEN_VAR = "TREEFLARE_NETLAB_TAG"
ADMIN_USER = "admin@treeflare.org"  # configs/project.yml's admin; its kit folder has this name
NETNS_ETC = Path("/etc/netns")  # `ip netns exec NS` bind-mounts each file of NETNS_ETC/NS over /etc/
FLARE_TMP = "/tmp/nvflare"  # where a kit's resources put the server's job and snapshot stores
TAG_RE = re.compile(r"tf\d{1,7}[0-9a-f]{4}")


class LabGone(Exception):
    """The lab was torn down (a signal, or teardown called) while something still used it. Not a RuntimeError,
    so that no retry loop here mistakes it for a passing failure."""


def run(argv, check=True, timeout=60, **kw) -> subprocess.CompletedProcess:
    """A short command in this (root) namespace; its output captured."""
    return subprocess.run([str(a) for a in argv], check=check, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, **kw)


def unavailable() -> str | None:
    """Why a lab cannot run here (None: it can): root and ``ip netns`` with veth and bridge support."""
    if os.geteuid() != 0:
        return "the network lab needs root (network namespaces, veth pairs, a bridge): run as root, e.g. in CI"
    if not shutil.which("ip"):
        return "the network lab needs iproute2's `ip` command (apt-get install iproute2)"
    probe = f"tf{os.getpid() % 10**7}{secrets.token_hex(2)}-probe"
    try:
        run(["ip", "netns", "add", probe])
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"`ip netns add` failed here ({getattr(exc, 'stderr', '') or exc}); network namespaces unavailable"
    try:
        r = run(["ip", "-n", probe, "link", "add", "br0", "type", "bridge"], check=False)
        if r.returncode:
            return f"no bridge support in this kernel: {r.stderr.strip()}"
        r = run(["ip", "-n", probe, "link", "add", "va", "type", "veth", "peer", "name", "vb"], check=False)
        if r.returncode:
            return f"no veth support in this kernel: {r.stderr.strip()}"
    finally:
        run(["ip", "netns", "del", probe], check=False)
    return None


def _venv_env() -> dict:
    """This machine's environment without NVFlare settings, with this interpreter's bin/ first on PATH (the kits'
    start.sh runs ``python3``, the admin ``nvflare``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NVFLARE_")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env.update({"PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"})
    return env


class NetLab:
    """Network namespaces joined by a bridge, one per participant, with provisioned kits; see the module
    docstring. A context manager: everything it makes, it removes (also on SIGTERM/SIGINT and at exit)."""

    def __init__(self, n_sites: int, root: Path, *, port: int = 8002, xgb_port: int = 8003, tag: str | None = None,
                 keep: bool = False, outcome_wait: int = 5):
        if n_sites < 1 or n_sites > 200:
            raise ValueError("n_sites must be 1..200")
        self.tag = tag or f"tf{os.getpid() % 10**7}{secrets.token_hex(2)}"
        if not TAG_RE.fullmatch(self.tag):
            raise ValueError(f"tag {self.tag!r}: 'tf', up to 7 digits, 4 hex digits (it goes into interface names)")
        self.n_sites, self.port, self.xgb_port = n_sites, port, xgb_port
        self.sites = [f"site-{i + 1}" for i in range(n_sites)]
        self.roles = ["server", *self.sites, "admin"]
        self.names = {"server": SERVER_NAME, **{s: f"{s}.{DOMAIN}" for s in self.sites}, "admin": f"admin.{DOMAIN}"}
        self._addresses = {"server": f"{SUBNET}.1", "admin": f"{SUBNET}.2",
                           **{s: f"{SUBNET}.{10 + i + 1}" for i, s in enumerate(self.sites)}}
        self.root = Path(root).resolve()
        self.dir = self.root / f"netlab-{self.tag}"  # the lab's own folder: removed at teardown unless keep
        self.keep = keep
        self.outcome_wait = outcome_wait  # NVFLARE_CLIENT_OUTCOME_WAIT_TIMEOUT at the server
        self.kits: dict = {}
        self.prod: Path | None = None
        self.timings: dict = {}
        self._made_ns: list[str] = []
        self._made_etc: list[Path] = []
        self._made_dir = False
        self._made_netns_etc = False
        self._groups: list[subprocess.Popen] = []
        self._lock = threading.RLock()
        self._tearing = False
        self._torn = False
        self._old_handlers: dict = {}
        self._up = False

    # ----------------------------------------------------------------------------------------- names
    def ns(self, role: str) -> str:
        self._check_role(role)
        return f"{self.tag}-{role}"

    @property
    def net_ns(self) -> str:
        return f"{self.tag}-net"

    def address(self, role: str) -> str:
        self._check_role(role)
        return self._addresses[role]

    def bridge_port(self, role: str) -> str:
        """The bridge side of ``role``'s veth pair (in the bridge's namespace)."""
        return f"{self.tag}v{self.roles.index(role)}"

    def home(self, role: str) -> Path:
        return self.dir / "hosts" / role / "home"

    @property
    def admin_kit(self) -> Path:
        return self.kits["admin"]

    def _check_role(self, role: str) -> None:
        if role not in self.roles:
            raise ValueError(f"unknown role {role!r}; roles: {', '.join(self.roles)}")

    # ----------------------------------------------------------------------------------------- lifecycle
    def __enter__(self):
        self.setup()
        return self

    def __exit__(self, *exc):
        self.teardown()
        return False

    def setup(self) -> "NetLab":
        """Make the namespaces, bridge, veths, hosts files, HOMEs and kits. On any failure: teardown, re-raise."""
        reason = unavailable()
        if reason:
            raise RuntimeError(reason)
        atexit.register(self.teardown)
        self._install_signal_handlers()
        try:
            t = time.perf_counter()
            self.dir.mkdir(parents=True, exist_ok=False)
            self._made_dir = True
            self._make_network()
            self.timings["network"] = time.perf_counter() - t
            t = time.perf_counter()
            self._provision()
            self.timings["provision"] = time.perf_counter() - t
            self._up = True
        except BaseException:
            self.teardown()
            raise
        return self

    def _make_network(self) -> None:
        net = self.net_ns
        self._add_ns(net)
        run(["ip", "-n", net, "link", "add", "br0", "type", "bridge"])
        run(["ip", "-n", net, "link", "set", "br0", "up"])
        hosts = "127.0.0.1 localhost\n::1 localhost\n" + "".join(
            f"{self._addresses[r]} {self.names[r]}\n" for r in self.roles)
        for role in self.roles:
            ns = self.ns(role)
            self._add_ns(ns)
            # the pair is born in the bridge's namespace with its other end moved straight into the participant's:
            # no lab interface ever exists in the root namespace
            run(["ip", "-n", net, "link", "add", self.bridge_port(role), "type", "veth", "peer", "name", "eth0",
                 "netns", ns])
            run(["ip", "-n", net, "link", "set", self.bridge_port(role), "master", "br0", "up"])
            run(["ip", "-n", ns, "addr", "add", f"{self._addresses[role]}/{PREFIX}", "dev", "eth0"])
            run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            if not NETNS_ETC.is_dir():
                NETNS_ETC.mkdir(parents=True)
                self._made_netns_etc = True  # removed again at teardown if no other lab uses it by then
            etc = NETNS_ETC / ns
            etc.mkdir(exist_ok=False)
            self._made_etc.append(etc)
            (etc / "hosts").write_text(hosts)
            (etc / "hostname").write_text(self.names[role] + "\n")
            # no name servers: a name outside the lab fails at once instead of waiting on a DNS timeout
            (etc / "resolv.conf").write_text("# treeflare netlab: no name servers, no route out\n")
            self.home(role).mkdir(parents=True)

    def _add_ns(self, ns: str) -> None:
        run(["ip", "netns", "add", ns])
        self._made_ns.append(ns)

    def _provision(self) -> None:
        ws = self.dir / "provision"
        proc = run(["bash", REPO / "scripts" / "provision.sh", "-w", ws, "--server", SERVER_NAME,
                    "--port", self.port, "--sites", self.n_sites], check=False, timeout=180, env=self.env("admin"))
        if proc.returncode:
            raise RuntimeError(f"provisioning failed: {proc.stderr[-2000:]}{proc.stdout[-1000:]}")
        self.prod = sorted((ws / "treeflare").glob("prod_*"))[-1]
        self.kits = {"server": self.prod / SERVER_NAME, **{s: self.prod / s for s in self.sites},
                     "admin": self.prod / ADMIN_USER}
        for role, kit in self.kits.items():
            if not (kit / "startup").is_dir():
                raise RuntimeError(f"provisioning made no kit for {role} at {kit}")
        self._own_server_storage()
        # the server component that ends the jobs a server restart interrupted (treeflare.flare.server_recovery)
        from treeflare.flare.server_recovery import add_to_server_kit

        add_to_server_kit(self.kits["server"])

    def _own_server_storage(self) -> None:
        """Give the server a job store and snapshot store of its own, in its host folder. A kit's defaults put
        them in /tmp/nvflare/, which is the server host's own /tmp on a real host; here every FLARE server on the
        machine (other labs, the loopback tests' systems) shares that folder, and a server runs any job it finds
        there (seen: a job taken by the wrong server, which failed it, 'does not pass signature verification')."""
        local = self.kits["server"] / "local"
        current = local / "resources.json"
        resources = json.loads((current if current.is_file() else local / "resources.json.default").read_text())
        own = self.dir / "hosts" / "server" / "nvflare"

        def moved(value):
            if isinstance(value, dict):
                return {k: moved(v) for k, v in value.items()}
            if isinstance(value, list):
                return [moved(v) for v in value]
            if isinstance(value, str) and value.startswith(FLARE_TMP):
                return str(own / value[len(FLARE_TMP):].lstrip("/"))
            return value

        new = moved(resources)
        if json.dumps(new) == json.dumps(resources):
            raise RuntimeError(f"the server kit's resources name no {FLARE_TMP} store; NVFlare's layout changed?")
        current.write_text(json.dumps(new, indent=2) + "\n")

    # ----------------------------------------------------------------------------------------- processes
    def env(self, role: str, extra: dict | None = None) -> dict:
        env = _venv_env()
        env.update({"HOME": str(self.home(role)), TOKEN_VAR: self.tag, "TREEFLARE_FLARE_LOCK_HELD": "1"})
        if role == "server":  # a job whose site died waits this long (NVFlare's default 900 s) for its outcome
            env["NVFLARE_CLIENT_OUTCOME_WAIT_TIMEOUT"] = str(self.outcome_wait)
        env.update(extra or {})
        return env

    def _argv(self, role: str, argv) -> list[str]:
        return ["ip", "netns", "exec", self.ns(role), *[str(a) for a in argv]]

    def popen(self, role: str, argv, *, env=None, cwd=None, **kw) -> subprocess.Popen:
        """Start ``argv`` in ``role``'s namespace, as that participant (its HOME), in a process group of its own
        (killed at teardown)."""
        if self._torn or self._tearing:
            raise LabGone(f"netlab {self.tag} is torn down")
        kw.setdefault("stdin", subprocess.DEVNULL)
        # default folder: the participant's HOME. NVFlare's admin tools search their working folder recursively
        # for config files (from this repository, with .venv: ~6 s a command under load)
        proc = subprocess.Popen(self._argv(role, argv), env=self.env(role, env), cwd=cwd or self.home(role),
                                start_new_session=True, **kw)
        self._groups.append(proc)
        return proc

    def exec(self, role: str, argv, *, env=None, timeout=None, check=False, cwd=None) -> subprocess.CompletedProcess:
        """Run ``argv`` to its end in ``role``'s namespace (see :meth:`popen`); output captured as text. A run past
        ``timeout`` has its whole process group killed, then raises ``subprocess.TimeoutExpired``."""
        proc = self.popen(role, argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill_group(proc)
            proc.communicate()
            raise
        finally:
            if proc in self._groups:  # (teardown, e.g. from a signal handler, may have cleared the list)
                self._groups.remove(proc)
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        if check and proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, proc.args, out, err)
        return result

    @staticmethod
    def _kill_group(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def pids(self, role: str) -> list[int]:
        """Every process in ``role``'s namespace."""
        r = run(["ip", "netns", "pids", self.ns(role)], check=False)
        return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []

    def start(self, roles=None, timeout: float = 120) -> list[str]:
        """Start the kits of ``roles`` (default: server and every site), the server first, each with
        ``startup/start.sh`` in its own namespace; wait until the admin sees every started site connected."""
        roles = list(roles or ["server", *self.sites])
        t = time.perf_counter()
        for role in sorted(roles, key=lambda r: r != "server"):
            if role == "admin":
                raise ValueError("the admin has no service to start; use submit/exec")
            kit = self.kits[role]
            for stale in ("shutdown.fl", "restart.fl", "pid.fl", "daemon_pid.fl"):
                (kit / stale).unlink(missing_ok=True)
            with open(kit / "console.log", "ab") as log:
                proc = self.popen(role, ["bash", kit / "startup" / "start.sh"], cwd=kit, stdout=log,
                                  stderr=subprocess.STDOUT)
                if proc.wait(timeout=60):
                    raise RuntimeError(f"{role}: start.sh exited {proc.returncode}; see {kit / 'console.log'}")
        sites = [r for r in roles if r in self.sites]
        connected = self.wait_connected(sites, timeout=timeout) if sites else []
        self.timings.setdefault("start", []).append(round(time.perf_counter() - t, 1))
        return connected

    def stop(self, role: str, timeout: float = 10) -> None:
        """Stop ``role``'s service as stop_fl.sh does (shutdown.fl, SIGTERM to the FLARE process), then kill
        whatever is left in its namespace."""
        kit = self.kits[role]
        (kit / "shutdown.fl").touch()
        main = self._pid_file(kit / "pid.fl")
        if main:
            try:
                os.kill(main, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout
        while self.pids(role) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.kill(role)
        for name in ("pid.fl", "daemon_pid.fl", "shutdown.fl", "restart.fl"):
            (kit / name).unlink(missing_ok=True)

    def kill(self, role: str, sig=signal.SIGKILL) -> list[int]:
        """Send ``sig`` to every process in ``role``'s namespace (its watchdog too, so SIGKILL is not followed by
        an automatic restart; SIGSTOP freezes the host). Returns the pids signalled."""
        pids = self.pids(role)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGKILL:
            deadline = time.monotonic() + 10
            while self.pids(role) and time.monotonic() < deadline:
                time.sleep(0.1)
        return pids

    def restart(self, role: str, timeout: float = 120) -> None:
        """Stop ``role`` and start it again from its kit; a site: until it has registered anew and is connected."""
        before = self.registrations(role) if role in self.sites else 0
        self.stop(role, timeout=5)
        self.start([role], timeout=timeout)
        if role in self.sites:
            deadline = time.monotonic() + timeout
            while self.registrations(role) <= before:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{role} did not register again within {timeout} s")
                time.sleep(0.5)
        elif role == "server" and self.sites:
            self.wait_connected(self.sites, timeout=timeout)

    def registrations(self, site: str) -> int:
        log = self.kits[site] / "log.txt"
        return log.read_text(errors="replace").count(f"Successfully registered client:{site}") \
            if log.is_file() else 0

    @staticmethod
    def _pid_file(path: Path) -> int | None:
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    # ----------------------------------------------------------------------------------------- faults
    def link_down(self, role: str) -> None:
        """Cut ``role`` off the network (its veth at the bridge side goes down; its own end stays up, as a cable
        pulled out at the switch)."""
        run(["ip", "-n", self.net_ns, "link", "set", self.bridge_port(role), "down"])

    def link_up(self, role: str) -> None:
        run(["ip", "-n", self.net_ns, "link", "set", self.bridge_port(role), "up"])

    def shape(self, role: str, rate: str = "10mbit", burst: str = "32kbit", latency: str = "400ms") -> None:
        """Limit ``role``'s link to ``rate`` both ways with a token bucket (tc tbf; this kernel has no netem): at
        the bridge side (traffic to it) and on its own eth0 (traffic from it)."""
        for ns, dev in ((self.net_ns, self.bridge_port(role)), (self.ns(role), "eth0")):
            run(["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                 "burst", burst, "latency", latency])

    def unshape(self, role: str) -> None:
        for ns, dev in ((self.net_ns, self.bridge_port(role)), (self.ns(role), "eth0")):
            run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], check=False)

    # ----------------------------------------------------------------------------------------- data
    def bind(self, site: str, data_dir: Path, *extra) -> Path:
        """Bind ``site``'s data as its operator does (docs/DEPLOY.md step 3), on that host:
        ``app/site_setup.py bind <kit> --data-dir DIR [extra...]``. Returns the binding file."""
        if site not in self.sites:
            raise ValueError(f"{site!r} is not a site")
        r = self.exec(site, [sys.executable, REPO / "app" / "site_setup.py", "bind", self.kits[site],
                             "--data-dir", data_dir, *extra], timeout=60)
        if r.returncode:
            raise RuntimeError(f"binding {site}'s data failed: {r.stderr[-1500:]}")
        return Path(r.stdout.strip().splitlines()[-1])

    def prepare_sites_data(self, *args: str) -> Path:
        """Write each site's files with scripts/prepare_data.py ``args`` (e.g. ``--dataset car --seed 1``) into
        the lab's data/ folder, then bind each site to its own folder (data/site-N). Returns data/."""
        out = self.dir / "data"
        r = run([sys.executable, REPO / "scripts" / "prepare_data.py", *args, "--sites", self.n_sites, "--out", out],
                check=False, timeout=300, env=self.env("admin"), cwd=REPO)
        if r.returncode:
            raise RuntimeError(f"prepare_data.py failed: {r.stderr[-2000:]}")
        for site in self.sites:
            self.bind(site, out / site)
        return out

    # ----------------------------------------------------------------------------------------- admin side
    def nvflare(self, *args, timeout: float = 120) -> subprocess.CompletedProcess:
        """``nvflare --format json <args> --startup-kit <admin kit>`` in the admin's namespace."""
        return self.exec("admin", [Path(sys.executable).parent / "nvflare", "--format", "json", *args,
                                   "--startup-kit", self.admin_kit], timeout=timeout)

    @staticmethod
    def _json_of(proc: subprocess.CompletedProcess) -> dict:
        for text in (proc.stdout, proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""):
            try:
                return json.loads(text)
            except ValueError:
                continue
        raise RuntimeError(f"nvflare gave no JSON (exit {proc.returncode}): {proc.stdout[-1500:]}"
                           f"{proc.stderr[-1500:]}")

    def submit(self, job_dir: Path) -> str:
        """``nvflare job submit -j JOB_DIR`` from the admin's namespace with the admin kit; the job id."""
        proc = self.nvflare("job", "submit", "-j", Path(job_dir).resolve(), timeout=120)
        out = self._json_of(proc)
        job_id = (out.get("data") or {}).get("job_id")
        if out.get("status") != "ok" or not job_id:
            raise RuntimeError(f"job submit failed: {out}")
        return job_id

    def wait_job(self, job_id: str, timeout: float = 600) -> str:
        """Wait for ``job_id`` to finish (``nvflare job wait``, from the admin's namespace); its final status,
        e.g. FINISHED:COMPLETED."""
        proc = self.nvflare("job", "wait", job_id, "--timeout", int(timeout), "--interval", 1, timeout=timeout + 60)
        out = self._json_of(proc)
        data = out.get("data") or {}
        status = data.get("status") or data.get("job_status")
        if not status:
            raise RuntimeError(f"job wait gave no status: {out}")
        return str(status)

    def job_meta(self, job_id: str) -> dict:
        return self._json_of(self.nvflare("job", "meta", job_id, timeout=60)).get("data") or {}

    def download(self, job_id: str, dest: Path) -> Path:
        """``nvflare job download`` of the server's result into ``dest``; returns ``dest/<job_id>``."""
        dest = Path(dest).resolve()
        dest.mkdir(parents=True, exist_ok=True)
        proc = self.nvflare("job", "download", job_id, "-o", dest, "--force", timeout=180)
        out = dest / job_id
        if not out.is_dir():
            raise RuntimeError(f"job download gave no {out}: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
        return out

    def connected(self, timeout: float = 20) -> list[str]:
        """The sites the server lists as connected (``nvflare system status`` from the admin's namespace)."""
        out = self._json_of(self.nvflare("system", "status", timeout=timeout))
        if out.get("status") != "ok":
            raise RuntimeError(f"admin could not list the sites: {out}")
        return sorted(c["client_name"] for c in (out.get("data") or {}).get("clients") or [])

    def wait_connected(self, sites=None, timeout: float = 120) -> list[str]:
        want = set(sites or self.sites)
        deadline = time.monotonic() + timeout
        have: list[str] = []
        while True:
            try:
                have = self.connected()
                if want <= set(have):
                    return have
            except (RuntimeError, ValueError, subprocess.TimeoutExpired):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"sites {sorted(want - set(have))} did not connect within {timeout:.0f} s "
                                   f"(connected: {have})")
            time.sleep(1.0)

    # ----------------------------------------------------------------------------------------- teardown
    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame):
        if self._tearing or self._torn:
            return  # a second Ctrl-C while tearing down: let the teardown finish
        self.teardown()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def teardown(self) -> None:
        """Kill every process of the lab, delete its namespaces (their veths and the bridge go with them), its
        /etc/netns folders and its own folder. Idempotent; only names carrying this lab's tag are touched."""
        with self._lock:
            if self._torn or self._tearing:
                return
            self._tearing = True
            try:
                self._teardown()
            finally:
                self._torn, self._tearing = True, False
                for sig, old in self._old_handlers.items():
                    try:
                        signal.signal(sig, old)
                    except (ValueError, TypeError):
                        pass
                self._old_handlers = {}

    def _teardown(self) -> None:
        for proc in list(self._groups):
            self._kill_group(proc)
        for _ in range(50):  # a process may fork while we kill: repeat until every namespace is empty
            left = [p for ns in self._made_ns for p in self._ns_pids(ns)] + _token_pids(self.tag)
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for proc in list(self._groups):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._groups.clear()
        for ns in reversed(self._made_ns):
            run(["ip", "netns", "del", ns], check=False)
        self._made_ns.clear()
        for etc in self._made_etc:
            shutil.rmtree(etc, ignore_errors=True)
        self._made_etc.clear()
        if self._made_netns_etc:
            try:
                NETNS_ETC.rmdir()
            except OSError:  # another lab's folder is in it now
                pass
        if self._made_dir and not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def _ns_pids(ns: str) -> list[int]:
        r = run(["ip", "netns", "pids", ns], check=False)
        return [int(p) for p in r.stdout.split()] if r.returncode == 0 else []

    # ----------------------------------------------------------------------------------------- description
    def describe(self) -> str:
        lines = [f"netlab {self.tag}: bridge in namespace {self.net_ns}, folder {self.dir}"]
        for role in self.roles:
            lines.append(f"  {role:8s} {self.names[role]:28s} {self._addresses[role]:14s} ns {self.ns(role):18s} "
                         f"kit {self.kits.get(role, '-')}")
        lines.append(f"  FL port {self.port} (sites and admin -> server); XGBoost direct port {self.xgb_port} "
                     "(sites -> server)")
        lines.append(f"  run a command on a host: ip netns exec {self.ns('admin')} <command>")
        return "\n".join(lines)


def labs_here() -> dict:
    """tag -> (its namespaces, whether the process that made it runs) for every lab on this machine."""
    out: dict = {}
    listing = run(["ip", "netns", "list"], check=False).stdout.split("\n")
    for name in (line.split()[0] for line in listing if line.strip()):
        tag = name.split("-", 1)[0]
        if TAG_RE.fullmatch(tag) and "-" in name:
            out.setdefault(tag, []).append(name)
    return {tag: (names, _maker_alive(tag)) for tag, names in out.items()}


def _maker_alive(tag: str) -> bool:
    pid = int(tag[2:-4])  # the maker's pid (below 10**7: Linux's pid_max is at most 2**22)
    return Path(f"/proc/{pid}").exists()


def clean_leftovers(tag: str) -> list[str]:
    """Remove what lab ``tag`` left: kill the processes in its namespaces and those carrying its tag, delete
    the namespaces and ``/etc/netns/<tag>-*``. Refused while the lab's maker still runs (it cleans up itself)."""
    if _maker_alive(tag):
        raise SystemExit(f"error: the process that made lab {tag} still runs (pid {tag[2:-4]}); end it instead")
    names, _ = labs_here().get(tag, ([], False))
    removed = []
    for _ in range(20):
        pids = [int(p) for n in names for p in run(["ip", "netns", "pids", n], check=False).stdout.split()]
        pids += _token_pids(tag)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        removed.append(f"{len(pids)} processes")
        time.sleep(0.2)
    for n in names:
        if run(["ip", "netns", "del", n], check=False).returncode == 0:
            removed.append(f"namespace {n}")
    if NETNS_ETC.is_dir():
        for etc in NETNS_ETC.iterdir():
            if etc.name.startswith(tag + "-"):
                shutil.rmtree(etc, ignore_errors=True)
                removed.append(str(etc))
    return removed


def _token_pids(tag: str) -> list[int]:
    """Processes whose environment carries this lab's tag (started by it, wherever they are now)."""
    needle = f"{TOKEN_VAR}={tag}".encode()
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    with open(f"/proc/{entry}/stat", "rb") as st:
                        if st.read().rsplit(b")", 1)[1].split()[0] != b"Z":
                            out.append(int(entry))
        except OSError:
            continue
    return out


# --------------------------------------------------------------------------------------------- jobs
def export_job(lab: NetLab, job: str, args, out: Path, timeout: float = 300) -> Path:
    """Export ``jobs/<job>/job.py args`` as the admin does (in the admin's namespace), into ``out``; returns the
    job folder."""
    script = REPO / "jobs" / job / "job.py"
    r = lab.exec("admin", [sys.executable, script, *args, "--export", out], timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"exporting {job} failed: {r.stderr[-2500:]}{r.stdout[-1000:]}")
    folders = [p for p in Path(out).iterdir() if (p / "meta.json").is_file()]
    if len(folders) != 1:
        raise RuntimeError(f"exporting {job} gave {len(folders)} job folders in {out}")
    return folders[0]


def run_job_prod(lab: NetLab, job: str, args, workspace: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``jobs/<job>/job.py args --env prod --startup-kit <admin kit> --workspace W`` in the admin's namespace."""
    script = REPO / "jobs" / job / "job.py"
    return lab.exec("admin", [sys.executable, script, *args, "--env", "prod", "--startup-kit", lab.admin_kit,
                              "--workspace", workspace, "--timeout", int(timeout)], timeout=timeout + 120)


ICDTA4FL_ARGS = ["--algorithm", "cart", "--dataset", "car", "--partition", "iid", "--seed", "1", "--max-depth", "4"]
XGB_ARGS = ["--dataset", "car", "--partition", "iid", "--seed", "1", "--rounds", "10", "--baselines", ""]


def _cmd_run(args, job: str, job_args: list[str]) -> int:
    root = Path(args.root or "/tmp")
    with NetLab(args.sites, root, keep=args.keep) as lab:
        print(lab.describe(), flush=True)
        lab.prepare_sites_data("--dataset", "car", "--partition", "iid", "--seed", "1")
        lab.start()
        ws = lab.dir / "workspace" / job
        r = run_job_prod(lab, job, [*job_args, "--sites", str(args.sites)], ws, timeout=args.timeout)
        print(r.stdout[-6000:])
        if r.returncode:
            print(r.stderr[-4000:], file=sys.stderr)
        print(f"timings: {lab.timings}")
        if not args.keep:
            print(f"(the lab's folder {lab.dir} goes with the lab; --keep keeps it)")
        return r.returncode


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="netlab.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, help_ in (("up", "bring a lab up, print its hosts, wait for Ctrl-C"),
                        ("run-icdta4fl", "a lab, then ICDTA4FL (car, CART) across it with --env prod"),
                        ("run-xgb", "a lab, then XGBoost direct (car, 10 rounds) across it with --env prod")):
        s = sub.add_parser(name, help=help_)
        s.add_argument("--sites", type=int, default=2)
        s.add_argument("--root", help="where the lab's folder goes (default /tmp)")
        s.add_argument("--keep", action="store_true", help="keep the lab's folder (kits, logs) after teardown")
        s.add_argument("--timeout", type=float, default=600)
        s.add_argument("--no-start", action="store_true", help="up: make the hosts and kits, start nothing")
        s.add_argument("--dataset", help="up: write this embedded data set's sites' files (car, adult, ...) and "
                                         "bind each site to its own (app/site_setup.py bind, on that host)")
    sub.add_parser("list", help="the labs on this machine (their tags), and whether the process that made each "
                                "still runs")
    c = sub.add_parser("clean", help="remove what a lab left behind (a lab killed with SIGKILL cannot clean up): "
                                     "its processes, namespaces and /etc/netns folders; its folder is not touched")
    c.add_argument("tag", help="the lab's tag, as `list` shows it")
    # (helper B's matrix of jobs and faults: `--all` dispatches to scripts/netlab_faults.py; add it here)
    if (sys.argv[1:] if argv is None else list(argv))[:1] == ["--all"]:  # every job and fault, measured
        return __import__("netlab_faults").main((sys.argv[1:] if argv is None else list(argv))[1:])
    args = p.parse_args(argv)
    if args.cmd == "list":
        for tag, (namespaces, alive) in sorted(labs_here().items()):
            print(f"{tag}: {len(namespaces)} namespaces; {'its process runs' if alive else 'its process is gone'}")
        return 0
    if args.cmd == "clean":
        if not TAG_RE.fullmatch(args.tag):
            print(f"error: {args.tag!r} is not a lab tag ('tf', its maker's pid, 4 hex digits)", file=sys.stderr)
            return 2
        print(f"removed: {', '.join(clean_leftovers(args.tag)) or 'nothing'}")
        return 0
    reason = unavailable()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 2
    if args.cmd == "run-icdta4fl":
        return _cmd_run(args, "icdta4fl", ICDTA4FL_ARGS)
    if args.cmd == "run-xgb":
        return _cmd_run(args, "xgb_histogram", XGB_ARGS)
    with NetLab(args.sites, Path(args.root or "/tmp"), keep=args.keep) as lab:
        if args.dataset:
            lab.prepare_sites_data("--dataset", args.dataset, "--seed", "1")
        if not args.no_start:
            lab.start()
        print(lab.describe(), flush=True)
        admin = f"ip netns exec {lab.ns('admin')} env HOME={lab.home('admin')} PATH={Path(sys.executable).parent}:$PATH"
        print(f"  submit as the admin: {admin} nvflare job submit -j JOB_DIR --startup-kit {lab.admin_kit}\n"
              f"  or:                  {admin} python jobs/icdta4fl/job.py --dataset car --sites {lab.n_sites} "
              f"--env prod --startup-kit {lab.admin_kit} --workspace /tmp/out", flush=True)
        print("up; Ctrl-C tears it all down", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("tearing down ...", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
