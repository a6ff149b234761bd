"""XGBoost's own federated gRPC server (``xgboost.federated``) as a child process that always ends, and what a
worker needs to reach it.

Why a child process: xgboost 3.2's federated server never returns after training (``run_federated_server``
blocks until the process ends) and has no stop call, so the only clean stop is ending its process. The child
reads its stdin; when the parent closes the pipe -- on :meth:`FederatedServer.stop`, or because the parent
died, even by SIGKILL -- the child exits. Nothing can outlive its owner.

The server always binds ``0.0.0.0:<port>`` (hard-coded in xgboost). With TLS (``ServerTLS``) it is mutual TLS:
the server presents its certificate and accepts only clients whose certificate is signed by the root CA.

This file is also the child's program (``python fedserver.py ...``): the part below ``__main__`` uses only the
standard library and xgboost, so the child needs nothing of treeflare on its path.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

DEFAULT_XGB_PORT = 8003  # FLARE's POC uses 8002 for FL and admin; the XGBoost server listens on the next one
MAX_PORT = 65535


class FederatedServerError(RuntimeError):
    """The federated server could not start, or a worker cannot reach it; the message says where and why."""


@dataclass(frozen=True)
class _KitTLS:
    """One side of mutual TLS, from its startup kit: its own key and certificate, and the root CA that signed
    every kit's certificate (the server checks the sites' with it, a site the server's)."""
    key: str
    cert: str
    ca: str
    KIT_NAME: ClassVar[str] = ""  # the kit's key and certificate are <KIT_NAME>.key and <KIT_NAME>.crt
    WHO: ClassVar[str] = ""

    @classmethod
    def from_kit(cls, startup_dir):
        names = {"key": f"{cls.KIT_NAME}.key", "cert": f"{cls.KIT_NAME}.crt", "ca": "rootCA.pem"}
        return cls(**_existing(Path(startup_dir), names, cls.WHO))


class ServerTLS(_KitTLS):
    """The server's side: its key and certificate, and the root CA that signed the clients'."""
    KIT_NAME, WHO = "server", "server"


class ClientTLS(_KitTLS):
    """A site's side: the site's own key and certificate, and the root CA (to check the server)."""
    KIT_NAME, WHO = "client", "site"


def _existing(folder: Path, names: dict, who: str) -> dict:
    missing = [n for n in names.values() if not (folder / n).is_file()]
    if missing:
        raise FederatedServerError(f"the {who}'s startup kit has no {', '.join(missing)} in its startup folder: "
                                   "XGBoost's federated server needs the kit's certificates for TLS")
    return {k: str(folder / n) for k, n in names.items()}


def check_port(port, what: str = "--xgb-port") -> int:
    """``port`` as an int in 1..65535 that nothing on this machine listens on; else a clear error.

    Checked by binding ``0.0.0.0:port`` the way a second server would, without SO_REUSEPORT: gRPC sets
    SO_REUSEPORT, so without this check two federated servers could share one port and split the sites."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= MAX_PORT:
        raise FederatedServerError(f"{what} must be a port number in 1..{MAX_PORT}, got {port!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not count as in use
        try:
            s.bind(("0.0.0.0", port))
        except OSError as exc:
            why = "is already in use on this machine" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc})"
            raise FederatedServerError(f"{what} {port} {why}: choose another port for XGBoost's federated server "
                                       "(the sites must be able to reach it)") from None
    return port


def free_port() -> int:
    """A port free on 0.0.0.0 right now (for ``--xgb-port 0``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def listening(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class FederatedServer:
    """``xgboost.federated`` server for ``world_size`` workers on ``port``, in a child process.

    Use as a context manager, or call :meth:`start` and (always) :meth:`stop`. ``log_path`` receives the
    child's output (xgboost prints one line when it listens)."""

    def __init__(self, world_size: int, port: int, tls: ServerTLS | None = None, *, log_path=None,
                 ready_timeout: float = 30.0):
        if not isinstance(world_size, int) or world_size < 1:
            raise FederatedServerError(f"world size must be >= 1, got {world_size!r}")
        self.world_size = world_size
        self.port = port
        self.tls = tls
        self.log_path = Path(log_path) if log_path else None
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self._log = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def describe(self) -> str:
        mode = "mutual TLS with the startup kits' certificates" if self.tls else "plain TCP, no TLS"
        return f"XGBoost federated server on 0.0.0.0:{self.port} for {self.world_size} workers ({mode})"

    def start(self) -> "FederatedServer":
        check_port(self.port)
        cmd = [sys.executable, str(Path(__file__).resolve()), str(self.world_size), str(self.port)]
        if self.tls:
            cmd += [self.tls.key, self.tls.cert, self.tls.ca]
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "ab")
        out = self._log or subprocess.DEVNULL
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
                                     close_fds=True)
        deadline = time.monotonic() + self.ready_timeout
        while not listening(self.port):
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise FederatedServerError(f"the XGBoost federated server exited at start (code {code}) on port "
                                           f"{self.port}: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise FederatedServerError(f"the XGBoost federated server did not listen on port {self.port} "
                                           f"within {self.ready_timeout:.0f} s: {self.log_tail()}")
            time.sleep(0.05)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 5.0) -> bool:
        """End the server (idempotent): close its stdin, then SIGTERM, then SIGKILL; wait until it is gone.
        Returns True once no server process of ours is left."""
        # imported here: this file is also the child's program, which has no treeflare package on its path
        from ..processes import close_and_wait

        proc, self.proc = self.proc, None
        ended = close_and_wait([proc], timeout) if proc is not None else True  # closing stdin ends it at once
        if self._log:
            self._log.close()
            self._log = None
        return ended

    def log_tail(self, n: int = 800) -> str:
        if not self.log_path or not self.log_path.is_file():
            return "(no log)"
        return self.log_path.read_text(errors="replace")[-n:].strip() or "(empty log)"

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def communicator_args(host: str, port: int, world_size: int, rank: int, tls: ClientTLS | None = None) -> dict:
    """Keyword arguments of ``xgboost.collective.CommunicatorContext`` for one worker.

    The TLS keys are the ones libxgboost reads (``..._path``; the docstring of ``xgboost.collective`` omits it)."""
    args = {"dmlc_communicator": "federated", "federated_server_address": f"{host}:{port}",
            "federated_world_size": int(world_size), "federated_rank": int(rank)}
    if tls:
        args.update(federated_server_cert_path=tls.ca, federated_client_key_path=tls.key,
                    federated_client_cert_path=tls.cert)
    return args


def wait_reachable(host: str, port: int, timeout: float, who: str = "this site") -> float:
    """Return once a TCP connection to ``host:port`` succeeds; raise naming host and port after ``timeout``
    seconds (XGBoost itself would retry for minutes). Returns the seconds it took."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    last = "no answer"
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            with socket.create_connection((host, port), timeout=min(left, 5.0)):
                return time.monotonic() - t0
        except socket.gaierror as exc:
            raise FederatedServerError(f"{who} cannot resolve {host!r}, the XGBoost federated server's host "
                                       f"({exc.strerror or exc})") from None
        except OSError as exc:
            last = exc.strerror or type(exc).__name__
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    raise FederatedServerError(f"{who} cannot reach the XGBoost federated server at {host}:{port} within "
                               f"{timeout:g} s ({last}); the server's port {port} must be open to the sites")


def _serve(argv: list[str]) -> None:  # the child process
    import threading

    world, port = int(argv[0]), int(argv[1])
    tls = dict(zip(("server_key_path", "server_cert_path", "client_cert_path"), argv[2:5])) if len(argv) >= 5 else {}

    def watch_parent():
        try:
            sys.stdin.buffer.read()  # returns at EOF: the owner closed the pipe or died
        finally:
            os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    from xgboost.federated import run_federated_server

    # timeout: seconds the server waits for all workers to connect before giving up (xgboost's default 300)
    run_federated_server(n_workers=world, port=port, blocking=True, timeout=24 * 3600, **tls)
    threading.Event().wait()  # training over: stay until the owner stops us


if __name__ == "__main__":
    _serve(sys.argv[1:])
