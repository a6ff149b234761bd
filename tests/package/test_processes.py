"""The one way the package ends processes (treeflare.processes): a whole tree, also a grandchild that put itself
in a session of its own and ignores SIGTERM; piped children that end when their stdin closes, and one that hangs."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid

from treeflare.processes import (alive, child_processes, close_and_wait, descendants, end_tree,
                                 processes_with_cmdline, send_signal, wait_gone)

# a grandchild in its own session that ignores SIGTERM (as a stuck site process would), then the child sleeps
TREE = """
import signal, subprocess, sys, time
g = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                      "print('ready', flush=True); time.sleep(60)", sys.argv[1]],
                     start_new_session=True, stdout=subprocess.PIPE, text=True)
g.stdout.readline()
print(g.pid, flush=True)
time.sleep(60)
"""


def test_end_tree_ends_every_process_below_a_child_even_one_that_ignores_sigterm():
    token = uuid.uuid4().hex
    before = {p.pid for p in child_processes()}
    child = subprocess.Popen([sys.executable, "-c", TREE, token], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        assert sorted(processes_with_cmdline(token)) == sorted([child.pid, grandchild])  # both carry it
        assert descendants([child.pid]) == [grandchild] and alive(grandchild)
        ended = end_tree(child_processes(exclude=before), grace=0.5)
        assert sorted(ended) == sorted([child.pid, grandchild])
        assert wait_gone([grandchild], timeout=5) and not alive(grandchild)
        assert child.wait(5) is not None and not processes_with_cmdline(token)
    finally:  # the grandchild too, should an assertion fail before end_tree
        send_signal([child.pid, *processes_with_cmdline(token)], signal.SIGKILL)
        child.wait(5)


def test_close_and_wait_ends_piped_children_and_signals_only_one_that_hangs():
    reads = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    hangs = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); print(flush=True); time.sleep(60)"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        hangs.stdout.readline()  # its SIGTERM handler is set
        assert close_and_wait([reads, hangs], grace=0.5) is True
        assert reads.returncode == 0  # ended by its stdin closing, no signal
        assert hangs.returncode == -9  # SIGTERM ignored, then killed
        assert reads.stdout.closed and hangs.stdout.closed and hangs.stdin.closed
        assert close_and_wait([reads, hangs]) is True  # again: nothing to do
        assert not alive(None) and not alive(hangs.pid)
    finally:  # nothing left behind should an assertion fail first
        send_signal([p.pid for p in (reads, hangs) if p.poll() is None], signal.SIGKILL)
