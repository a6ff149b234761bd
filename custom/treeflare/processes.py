"""Finding and ending processes: the one way the package stops what it started (psutil; no NVFlare).

Two kinds of process are ended here:

* trees of processes this process does not own through a pipe -- the FLARE simulator and its sites, a POC's
  or a startup kit's services -- found by parent (:func:`child_processes`, :func:`descendants`) or by command
  line (:func:`processes_with_cmdline`) and ended with :func:`end_tree` (SIGTERM, then SIGKILL after a grace
  period) or signalled with :func:`send_signal`;
* children started with ``subprocess.Popen`` that exit when their stdin closes (the crypto workers, XGBoost's
  federated server), ended with :func:`close_and_wait`, which signals only one that hangs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import psutil


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def alive(pid: int | None) -> bool:
    """``pid`` names a process that runs (a zombie, ended but not yet reaped, does not count)."""
    proc = _process(pid) if pid else None
    try:
        return proc is not None and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def child_processes(exclude=frozenset()) -> list[psutil.Process]:
    """This process's direct children, apart from the pids in ``exclude``."""
    try:
        return [c for c in psutil.Process().children() if c.pid not in exclude]
    except psutil.Error:
        return []


def descendants(pids) -> list[int]:
    """Pids of every live descendant of ``pids`` (e.g. the ``sleep`` a watchdog script is waiting on)."""
    out: list[int] = []
    for pid in pids:
        proc = _process(pid) if pid else None
        if proc is None:
            continue
        with contextlib.suppress(psutil.Error):
            out += [c.pid for c in proc.children(recursive=True) if c.pid not in out]
    return out


def processes_with_cmdline(needle: str) -> list[int]:
    """Pids of the processes (other than this one) whose command line contains ``needle``, e.g. a kit's folder."""
    me, found = os.getpid(), []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid != me and needle in "\0".join(proc.info["cmdline"] or ()):
            found.append(proc.pid)
    return found


def send_signal(pids, sig=signal.SIGKILL) -> None:
    """``sig`` to each of ``pids``; one that is gone (or not ours to signal) is passed over."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_gone(pids, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds until none of ``pids`` runs; True if none does."""
    procs = [p for p in map(_process, {p for p in pids if p}) if p is not None]
    _, running = psutil.wait_procs(procs, timeout=timeout)
    return not any(alive(p.pid) for p in running)


def end_tree(roots, grace: float = 5.0) -> list[int]:
    """End ``roots`` (processes or pids) and everything below them: SIGTERM, then SIGKILL to what is left after
    ``grace`` seconds. The whole tree is listed before anything is signalled, since an orphan leaves it (and a
    process that starts itself in a session of its own is missed by a process-group signal). Returns the pids."""
    procs: list[psutil.Process] = []
    for root in roots:
        proc = root if isinstance(root, psutil.Process) else _process(root)
        if proc is None:
            continue
        with contextlib.suppress(psutil.Error):
            procs += [proc, *proc.children(recursive=True)]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, running = psutil.wait_procs(procs, timeout=grace)
    for p in running:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(running, timeout=grace)
    return [p.pid for p in procs]


def close_and_wait(popens, grace: float = 5.0) -> bool:
    """End ``subprocess.Popen`` children that exit when their stdin closes: close every stdin, wait up to
    ``grace`` seconds; SIGTERM any still running, wait again; then SIGKILL. Their stdout pipes are closed and
    every one is reaped. True if all have ended."""
    popens = list(popens)
    for p in popens:
        with contextlib.suppress(OSError):
            if p.stdin:
                p.stdin.close()
    running = _wait_popens(popens, grace)
    for stop in (subprocess.Popen.terminate, subprocess.Popen.kill):
        if not running:
            break
        for p in running:
            with contextlib.suppress(OSError):
                stop(p)
        running = _wait_popens(running, grace)
    for p in popens:
        with contextlib.suppress(OSError):
            if p.stdout:
                p.stdout.close()
    return not running


def _wait_popens(popens, timeout: float) -> list:
    """Those of ``popens`` still running after ``timeout`` seconds (one deadline for all)."""
    deadline = time.monotonic() + timeout
    running = []
    for p in popens:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            running.append(p)
    return running
