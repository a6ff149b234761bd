"""Persistent worker processes for the crypto-heavy loops, without pickle and without fork.

Each worker is a fresh ``python -m treeflare.crypto.worker_main`` process (started once and reused for
a party's whole run), so it is safe to start from a multithreaded process such as an NVFlare
client, and it inherits nothing.  Parent and worker exchange frames over the worker's stdin/stdout:

    frame = u32 header length | JSON header | u32 blob count | (u64 length | bytes) per blob

A request header is ``{"op": name, "args": {...}}``; the reply is ``{"ok": true, "result": {...}}``
(plus blobs) or ``{"ok": false, "error": "..."}``.  Operations are plain functions
``fn(state, args, blobs) -> (result, blobs)`` registered in an ``OPS`` dict of a ``treeflare.*``
module named when the pool starts; ``state`` is the worker's own dict, kept between calls (a key,
this worker's share of the ciphertexts, ...).

:class:`LocalPool` runs the same operations in the calling process (one worker, no processes):
the code path of every computation is the same with 1 or N workers.

A worker exits when its stdin closes (so it never outlives its parent) and ignores Ctrl-C (the
parent decides).

A party bigger than one machine names a Dask cluster instead of a process count (:func:`parse_workers`):
``dask://HOST:PORT`` (a scheduler the party runs) or ``dask-local:N`` (a local cluster of N worker
processes); :mod:`.dask_pool` runs the same operations there with the same interface.  Every pool also has
:meth:`map_reduce`: one request per worker, the replies combined by a merge operation (in this process for
local pools, by a tree reduction on the cluster for Dask).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import struct
import subprocess
import sys
import threading
import weakref
from pathlib import Path

from ..processes import close_and_wait
from .pool_ops import WorkerError, load_ops, merge_request, per_worker

_PKG_PARENT = str(Path(__file__).resolve().parents[2])   # the folder that holds the treeflare package


# ------------------------------------------------------------------------------------ framing
def _read_exact(fh, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = fh.read(n - len(buf))
        if not chunk:
            raise EOFError("worker pipe closed")
        buf += chunk
    return bytes(buf)


def write_frame(fh, header: dict, blobs=()) -> None:
    h = json.dumps(header, separators=(",", ":")).encode()
    parts = [struct.pack("<I", len(h)), h, struct.pack("<I", len(blobs))]
    for b in blobs:
        parts.append(struct.pack("<Q", len(b)))
        parts.append(b)
    for p in parts:
        fh.write(p)
    fh.flush()


def read_frame(fh) -> tuple:
    (hl,) = struct.unpack("<I", _read_exact(fh, 4))
    header = json.loads(_read_exact(fh, hl))
    (nb,) = struct.unpack("<I", _read_exact(fh, 4))
    blobs = []
    for _ in range(nb):
        (bl,) = struct.unpack("<Q", _read_exact(fh, 8))
        blobs.append(_read_exact(fh, bl))
    return header, blobs


# ------------------------------------------------------------------------------------ pools
def _merge_here(ops, state, merge_op: str, merge_args: dict, replies: list) -> tuple:
    """The replies of a map combined left to right by ``merge_op`` in this process."""
    acc = replies[0]
    for nxt in replies[1:]:
        acc = ops[merge_op](state, merge_request(merge_args, acc, nxt), list(acc[1]) + list(nxt[1]))
    return acc



class LocalPool:
    """The operations run in this process, one 'worker'."""

    n = 1

    def __init__(self, modules):
        self._ops = load_ops(modules)
        self._state: dict = {}

    def map_reduce(self, op: str, args_list, blobs_list, merge_op: str, merge_args: dict) -> tuple:
        return _merge_here(self._ops, self._state, merge_op, merge_args, self.map(op, args_list, blobs_list))

    def map(self, op: str, args_list, blobs_list=None) -> list:
        (args,) = args_list
        blobs = blobs_list[0] if blobs_list else []
        return [self._ops[op](self._state, args, blobs)]

    def run_tasks(self, op: str, tasks) -> list:
        return [self._ops[op](self._state, args, blobs) for args, blobs in tasks]

    def close(self) -> None:
        self._state.clear()


class WorkerPool:
    """``n`` worker processes; :meth:`map` sends one request to each worker and collects the replies
    (in worker order).  All requests are written before any reply is read, so the workers run in
    parallel; a worker reads its whole request before it writes, so the pipes cannot deadlock."""

    def __init__(self, n: int, modules):
        if n < 1:
            raise ValueError("a pool needs at least one worker")
        self.n = int(n)
        self.modules = list(modules)
        for name in self.modules:
            if not name.startswith("treeflare."):
                raise ValueError(f"worker operations must come from the treeflare package, not {name!r}")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([_PKG_PARENT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = "1"
        self._procs = []
        self._lock = threading.Lock()
        try:
            for _ in range(self.n):
                self._procs.append(subprocess.Popen(
                    [sys.executable, "-m", "treeflare.crypto.worker_main", *self.modules],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True))
        except OSError:
            self.close()
            raise
        self._finalizer = weakref.finalize(self, close_and_wait, list(self._procs))
        self._merge_ops = load_ops(self.modules)
        self._merge_state: dict = {}

    def map_reduce(self, op: str, args_list, blobs_list, merge_op: str, merge_args: dict) -> tuple:
        """:meth:`map`, the replies merged here (a reply is as large as the merge's input: shipping partials to a
        worker and back would cost more than merging them)."""
        replies = self.map(op, args_list, blobs_list)
        return _merge_here(self._merge_ops, self._merge_state, merge_op, merge_args, replies)

    def map(self, op: str, args_list, blobs_list=None) -> list:
        args_list, blobs_list = per_worker(self.n, args_list, blobs_list)
        with self._lock:
            try:
                for proc, args, blobs in zip(self._procs, args_list, blobs_list):
                    write_frame(proc.stdin, {"op": op, "args": args}, blobs)
                replies = [read_frame(proc.stdout) for proc in self._procs]
            except (EOFError, BrokenPipeError, OSError) as e:
                codes = [p.poll() for p in self._procs]
                raise WorkerError(f"worker process failed during {op!r} ({e}; exit codes {codes})") from None
        out = []
        for header, blobs in replies:
            if not header.get("ok"):
                raise WorkerError(f"{op}: {header.get('error')}")
            out.append((header.get("result") or {}, blobs))
        return out

    def run_tasks(self, op: str, tasks) -> list:
        """Many independent requests ``(args, blobs)``, handed to whichever worker is free next (so a worker
        slowed down by other load on the machine simply takes fewer); results in task order."""
        tasks = list(tasks)
        out = [None] * len(tasks)
        with self._lock, selectors.DefaultSelector() as sel:
            try:
                todo = iter(enumerate(tasks))
                busy = 0
                for proc in self._procs:
                    nxt = next(todo, None)
                    if nxt is None:
                        break
                    write_frame(proc.stdin, {"op": op, "args": nxt[1][0]}, nxt[1][1])
                    sel.register(proc.stdout, selectors.EVENT_READ, (proc, nxt[0]))
                    busy += 1
                while busy:
                    for key, _ev in sel.select():
                        proc, i = key.data
                        header, blobs = read_frame(proc.stdout)
                        if not header.get("ok"):
                            raise WorkerError(f"{op}: {header.get('error')}")
                        out[i] = (header.get("result") or {}, blobs)
                        sel.unregister(proc.stdout)
                        busy -= 1
                        nxt = next(todo, None)
                        if nxt is not None:
                            write_frame(proc.stdin, {"op": op, "args": nxt[1][0]}, nxt[1][1])
                            sel.register(proc.stdout, selectors.EVENT_READ, (proc, nxt[0]))
                            busy += 1
            except WorkerError:
                # let the busy workers finish, so their replies do not answer the next request
                for key in list(sel.get_map().values()):
                    try:
                        read_frame(key.data[0].stdout)
                    except (EOFError, OSError):
                        pass
                raise
            except (EOFError, BrokenPipeError, OSError) as e:
                codes = [p.poll() for p in self._procs]
                raise WorkerError(f"worker process failed during {op!r} ({e}; exit codes {codes})") from None
        return out

    def close(self) -> None:
        close_and_wait(self._procs)  # a worker exits when its stdin closes; one that hangs is signalled
        self._procs = []

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


MAX_WORKERS = 256
WORKERS_HELP = (f"an integer in [0, {MAX_WORKERS}] (local worker processes, 0 = all cores), 'dask://HOST:PORT' "
                f"(a Dask scheduler this party runs) or 'dask-local:N' (a local Dask cluster of N worker processes, "
                f"N in [1, {MAX_WORKERS}])")


ADDRESS_FROM_SITE_ONLY = ("a Dask scheduler address (dask://) names where the party's key or rows go, so only the "
                          "party itself names one (its site's $TREEFLARE_VERTICAL_WORKERS); a job may ask for a "
                          "number of processes or dask-local:N")


def parse_workers(spec, option: str = "workers", *, allow_address: bool = True):
    """The canonical form of a ``workers`` setting: an int in [0, MAX_WORKERS] (local processes) or a cluster
    spec string ``dask://HOST:PORT`` / ``dask-local:N``.  A bad one is refused naming ``option`` (not echoing
    the value, which may be a host name).  ``allow_address=False`` (a setting that comes from the job, not from the
    party) refuses ``dask://`` too: the party alone chooses the cluster that receives its key."""
    if not allow_address and isinstance(spec, str) and spec.strip().startswith("dask://"):
        raise ValueError(f"{option}: {ADDRESS_FROM_SITE_ONLY}")
    bad = ValueError(f"{option} must be {WORKERS_HELP}")
    if isinstance(spec, bool):
        raise bad
    if isinstance(spec, int):
        if not 0 <= spec <= MAX_WORKERS:
            raise bad
        return spec
    if not isinstance(spec, str):
        raise bad
    text = spec.strip()
    if text.isdigit():
        return parse_workers(int(text), option)
    if text.startswith("dask-local:"):
        n = text[len("dask-local:"):]
        if not n.isdigit() or not 1 <= int(n) <= MAX_WORKERS:
            raise bad
        return f"dask-local:{int(n)}"
    if text.startswith("dask://"):
        host, sep, port = text[len("dask://"):].rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host   # [IPv6]
        if (not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535
                or any(c in host for c in "/@?#[] ") or len(host) > 253):
            raise bad
        return f"dask://{'[' + host + ']' if ':' in host else host}:{int(port)}"
    raise bad


def is_cluster(spec) -> bool:
    """``spec`` (already parsed) names a Dask cluster rather than a number of local processes."""
    return isinstance(spec, str)


def is_address(spec) -> bool:
    """``spec`` (already parsed) is a Dask scheduler's address (``dask://HOST:PORT``), which only the party names."""
    return isinstance(spec, str) and spec.startswith("dask://")


def make_pool(workers, modules):
    """The pool a ``workers`` setting asks for: a Dask pool for a cluster spec (:mod:`.dask_pool`), a
    :class:`WorkerPool` of ``workers`` processes, or a :class:`LocalPool` for ``workers <= 1``."""
    workers = parse_workers(workers)
    if is_cluster(workers):
        from .dask_pool import DaskPool    # dask is imported only by a party that asks for it
        return DaskPool(workers, modules)
    return WorkerPool(workers, modules) if workers > 1 else LocalPool(modules)


# ------------------------------------------------------------------------------------ worker side
def _serve(modules) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fin = sys.stdin.buffer
    # the protocol owns the real stdout; anything printed goes to stderr
    fout = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    ops = load_ops(modules)
    state: dict = {}
    while True:
        try:
            header, blobs = read_frame(fin)
        except EOFError:
            return
        try:
            fn = ops[header["op"]]
            result, out_blobs = fn(state, header.get("args") or {}, blobs)
            write_frame(fout, {"ok": True, "result": result}, out_blobs)
        except Exception as exc:  # report to the parent, keep serving
            write_frame(fout, {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]})

