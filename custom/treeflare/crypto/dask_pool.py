"""The crypto worker pool on a Dask distributed cluster that the party runs (``--workers dask://HOST:PORT``)
or starts for itself (``--workers dask-local:N``).

The interface is :mod:`.workers`' (``n``, ``map``, ``run_tasks``, ``map_reduce``, ``close``), so the key
holder and the histogram engine use it unchanged, and the operations are the same functions
``fn(state, args, blobs) -> (result, blobs)`` from the same ``OPS`` tables:

* :meth:`DaskPool.map` sends request i to Dask worker i, pinned there (``workers=[address]``, no other worker
  allowed), so what an operation keeps in its ``state`` (the key, a shard's ciphertexts and bins) stays on that
  worker between calls.  Each worker keeps one state dict per pool (keyed by a random pool id) in this module's
  ``_STATES``; :meth:`DaskPool.close` drops it on every worker.
* :meth:`DaskPool.run_tasks` lets the scheduler hand independent tasks to whichever of the pool's workers is free.
* :meth:`DaskPool.map_reduce` merges the workers' replies pairwise on the cluster (a tree reduction, each merge
  pinned to the worker that holds its left input), and only the final reply comes back to the party.

What crosses the party's cluster is what crosses the local worker pipes: an operation's name, JSON-like args and
bytes blobs.  Dask's own protocol pickles task functions (referenced by name: this module's top-level
functions) inside the party's cluster; the scheduler and workers are therefore inside the party's trust boundary
and must not be reachable by any other party (SECURITY.md).  Whoever can connect to a Dask scheduler can run code on
its workers, so every connection is authenticated:

* ``dask-local:N`` starts its cluster with ``security=True``: TLS with certificates made for this cluster, held in
  memory by the party's process (and given to its worker processes); a client without them is refused.
* ``dask://HOST:PORT`` is refused unless Dask's configuration requires encryption
  (``distributed.comm.require-encryption: true``) or makes TLS the default scheme
  (``distributed.comm.default-scheme: tls``); it connects over ``tls://`` with the ``distributed.comm.tls.*``
  certificates (a cluster whose scheduler requires them authenticates the party, and the party the cluster).

Every call has an overall deadline (``$TREEFLARE_DASK_CALL_DEADLINE_S``, default one hour): a worker that is stuck
but still listed fails the call instead of hanging the run.  Workers run the operations one at a time (a lock per
pool state); the arithmetic holds the GIL, so one thread per worker process is what to run.
"""
from __future__ import annotations

import logging
import os
import secrets
import threading
import time
import weakref

from .pool_ops import WorkerError, load_ops, merge_request, per_worker

_STATES: dict = {}            # on a Dask worker: pool id -> that pool's state dict
_LOCKS: dict = {}
_OPS: dict = {}               # on a Dask worker: modules -> loaded OPS tables
_GUARD = threading.Lock()
_SCATTER_BYTES = 1 << 20      # larger blobs go straight to their worker instead of through the task graph
_CONNECT_S = 30
_POLL_S = 2                   # how often a wait for results checks that the pool's workers are still there
DEADLINE_ENV = "TREEFLARE_DASK_CALL_DEADLINE_S"
DEFAULT_DEADLINE_S = 3600.0   # one call (a layer's histograms, a batch's encryption) takes seconds to minutes
TLS_NEEDED = ("workers: a dask:// scheduler is reached only over TLS (whoever can connect to it can read what its "
              "workers hold): set distributed.comm.require-encryption: true and the distributed.comm.tls.ca-file, "
              ".client.cert and .client.key certificates in Dask's configuration (or DASK_DISTRIBUTED__COMM__"
              "REQUIRE_ENCRYPTION=True and DASK_DISTRIBUTED__COMM__TLS__* in the site's environment)")
# no dashboard; the scheduler's plain HTTP routes (health) on a free loopback port, not the fixed 8787
_NO_FIXED_PORT = {"dashboard_address": "127.0.0.1:0"}


# ------------------------------------------------------------------------------ on the Dask workers
def _state_of(pool_id: str):
    with _GUARD:
        return _STATES.setdefault(pool_id, {}), _LOCKS.setdefault(pool_id, threading.Lock())


def _ops_of(modules: tuple) -> dict:
    with _GUARD:
        ops = _OPS.get(modules)
        if ops is None:
            ops = _OPS[modules] = load_ops(modules)
        return ops


def run_op(pool_id: str, modules: tuple, op: str, args: dict, blobs: list) -> tuple:
    """One operation on this worker's state of the pool (a Dask task)."""
    fn = _ops_of(tuple(modules))[op]
    state, lock = _state_of(pool_id)
    with lock:
        result, out = fn(state, args, [b if isinstance(b, bytes) else bytes(b) for b in blobs])
    return result or {}, list(out)


def merge_op(pool_id: str, modules: tuple, op: str, merge_args: dict, left: tuple, right: tuple) -> tuple:
    """Two replies merged by the operation ``op`` (a Dask task of the tree reduction)."""
    return run_op(pool_id, modules, op, merge_request(merge_args, left, right), list(left[1]) + list(right[1]))


def drop_state(pool_id: str) -> bool:
    with _GUARD:
        found = _STATES.pop(pool_id, None) is not None
        _LOCKS.pop(pool_id, None)
    return found


def count_states() -> int:
    """How many pools' states this worker holds (tests: a closed pool leaves none)."""
    with _GUARD:
        return len(_STATES)


# ------------------------------------------------------------------------------ in the party's process
def deadline_s() -> float:
    """The overall deadline of one pool call, in seconds (``$TREEFLARE_DASK_CALL_DEADLINE_S``)."""
    raw = os.environ.get(DEADLINE_ENV, "").strip()
    if not raw:
        return DEFAULT_DEADLINE_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise ValueError(f"${DEADLINE_ENV} must be a positive number of seconds")
    return value


def remote_security():
    """The Security of a ``dask://`` connection, from Dask's configuration; refused (naming what to set) unless
    that configuration requires encryption or makes TLS the default scheme."""
    import dask
    from distributed.security import Security

    sec = Security()
    if not (sec.require_encryption or dask.config.get("distributed.comm.default-scheme", "tcp") == "tls"):
        raise WorkerError(TLS_NEEDED)
    if not (sec.tls_ca_file and sec.tls_client_cert):
        raise WorkerError(TLS_NEEDED.replace("reached only over TLS", "reached over TLS with certificates"))
    return sec


def _close(client, cluster, pool_id, addrs) -> None:
    try:
        if client is not None and addrs:
            present = set(client.scheduler_info(n_workers=-1)["workers"])   # a worker that left holds nothing
            live = [a for a in addrs if a in present]
            if live:
                client.run(drop_state, pool_id, workers=live, on_error="return")
    except Exception:   # a cluster that is gone already holds no state
        pass
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()


class DaskPool:
    """The pool on a Dask cluster: ``spec`` is ``dask://HOST:PORT`` or ``dask-local:N`` (as
    :func:`treeflare.crypto.workers.parse_workers` returns it)."""

    def __init__(self, spec: str, modules):
        from distributed import Client, LocalCluster   # only a party that asks for a cluster imports Dask

        self.modules = tuple(modules)
        load_ops(self.modules)           # the same check as the local pools: operations from treeflare only
        self.pool_id = secrets.token_hex(16)
        self.deadline_s = deadline_s()
        self._cluster = None
        self._client = None
        self._lock = threading.Lock()
        try:
            if spec.startswith("dask-local:"):
                n = int(spec.split(":", 1)[1])
                # loopback only, no dashboard; TLS with this cluster's own temporary certificates (security=True:
                # another local process that finds the port cannot connect); no memory limit (the party sizes its
                # machine; a nanny that restarts a worker would lose the worker's shard)
                self._cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                                             dashboard_address=None, silence_logs=logging.ERROR, memory_limit=0,
                                             security=True, scheduler_kwargs=_NO_FIXED_PORT)
                self._client = Client(self._cluster, set_as_default=False)
            elif spec.startswith("dask://"):
                sec = remote_security()
                self._client = Client("tls://" + spec[len("dask://"):], security=sec, timeout=_CONNECT_S,
                                      set_as_default=False)
                self._client.wait_for_workers(1, timeout=_CONNECT_S)
            else:
                raise ValueError("workers: not a Dask cluster spec")
            self.addrs = sorted(self._client.scheduler_info(n_workers=-1)["workers"])
        except (OSError, TimeoutError) as e:
            self.close()
            raise WorkerError(f"workers: cannot reach the Dask cluster ({type(e).__name__})") from None
        except BaseException:
            self.close()
            raise
        self.n = len(self.addrs)
        if self.n < 1:
            self.close()
            raise WorkerError("workers: the Dask cluster has no workers")
        self._finalizer = weakref.finalize(self, _close, self._client, self._cluster, self.pool_id, list(self.addrs))

    # -- helpers
    def _blobs_for(self, blobs, addrs) -> list:
        out = []
        for b in blobs:
            b = bytes(b)
            if len(b) >= _SCATTER_BYTES:
                out.append(self._client.scatter(b, workers=list(addrs), hash=False))
            else:
                out.append(b)
        return out

    def _submit(self, op: str, args: dict, blobs, addrs):
        return self._client.submit(run_op, self.pool_id, self.modules, op, dict(args or {}),
                                   self._blobs_for(blobs, addrs), workers=list(addrs), allow_other_workers=False,
                                   pure=False)

    def _gather(self, op: str, futures) -> list:
        """The results in order; a task pinned to a worker that left would wait for it for ever, so while waiting
        the pool checks that its workers are still there, and gives up on the whole call at its deadline (a worker
        stuck but still listed)."""
        out = []
        end = time.monotonic() + self.deadline_s
        for fut in futures:
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    self._client.cancel(list(futures))
                    raise WorkerError(f"{op}: no reply from the pool's Dask workers within {self.deadline_s:g} s "
                                      f"(${DEADLINE_ENV}); a worker may be stuck") from None
                try:
                    res, blobs = fut.result(timeout=min(_POLL_S, left))
                    break
                except TimeoutError:
                    gone = set(self.addrs) - set(self._client.scheduler_info(n_workers=-1)["workers"])
                    if gone:
                        self._client.cancel(list(futures))
                        raise WorkerError(f"{op}: {len(gone)} of the pool's {self.n} Dask workers left the cluster "
                                          f"(the rows' state they held is lost)") from None
                except Exception as exc:   # the operation's own error, re-raised here by Dask
                    self._client.cancel(list(futures))
                    raise WorkerError(f"{op}: {type(exc).__name__}: {exc}"[:2000]) from None
            out.append((res, list(blobs)))
        return out

    def _check_open(self) -> None:
        if self._client is None:
            raise WorkerError("the Dask pool is closed")

    # -- the pool interface
    def map(self, op: str, args_list, blobs_list=None) -> list:
        args_list, blobs_list = per_worker(self.n, args_list, blobs_list)
        with self._lock:
            self._check_open()
            futs = [self._submit(op, a, b, [addr]) for addr, a, b in zip(self.addrs, args_list, blobs_list)]
            return self._gather(op, futs)

    def run_tasks(self, op: str, tasks) -> list:
        with self._lock:
            self._check_open()
            futs = [self._submit(op, a, b, self.addrs) for a, b in tasks]
            return self._gather(op, futs)

    def map_reduce(self, op: str, args_list, blobs_list, merge_op_name: str, merge_args: dict) -> tuple:
        """One request per worker; the replies merged pairwise on the cluster (neighbours first, so a merge's
        inputs are on two workers and its output stays on the first), and only the result comes back."""
        args_list, blobs_list = per_worker(self.n, args_list, blobs_list)
        with self._lock:
            self._check_open()
            level = [(self._submit(op, a, b, [addr]), addr) for addr, a, b in zip(self.addrs, args_list, blobs_list)]
            while len(level) > 1:
                nxt = []
                for i in range(0, len(level) - 1, 2):
                    (left, addr), (right, _) = level[i], level[i + 1]
                    fut = self._client.submit(merge_op, self.pool_id, self.modules, merge_op_name, dict(merge_args),
                                              left, right, workers=[addr], allow_other_workers=False, pure=False)
                    nxt.append((fut, addr))
                if len(level) % 2:
                    nxt.append(level[-1])
                level = nxt
            (final,) = self._gather(op, [level[0][0]])
            return final

    def close(self) -> None:
        fin = getattr(self, "_finalizer", None)
        if fin is not None:
            fin()
        else:
            _close(self._client, self._cluster, self.pool_id, getattr(self, "addrs", []))
        self._client = None
        self._cluster = None

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
