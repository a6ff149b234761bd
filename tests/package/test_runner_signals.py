"""SIGTERM or Ctrl-C (SIGINT) to a job script ends every process the job started (the
simulator puts itself and each site in a session of its own) and removes the temporary folders; the script
exits with 128 + the signal's number."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from flare_helpers import REPO, flare_lock, isolated_env, kill_token, processes_with_token
from treeflare.flare.runner import SIM_TMP_PREFIX

pytestmark = [pytest.mark.flare, pytest.mark.flare_lock]  # runs under the machine-wide FLARE lock


def _sim_tmp_folders(token: str) -> set[Path]:
    """The run's own private folders (``/tmp/tf-sim-*``): the processes the simulator started have their TMPDIR
    inside one. Other simulator runs on this machine (another pytest worker, another user) have folders of their own,
    so the test looks for these, not for any new ``tf-sim-*``."""
    found = set()
    for proc in processes_with_token(token):
        try:
            tmp = Path(proc.environ().get("TMPDIR", ""))
        except psutil.Error:
            continue
        found.update(f for f in (tmp, *tmp.parents) if f.name.startswith(SIM_TMP_PREFIX))
    return found


def _wait(predicate, timeout, step=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_every_process_and_removes_temporary_folders(tmp_path, signum):
    token = uuid.uuid4().hex
    env = isolated_env(tmp_path, token)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env["TMPDIR"] = str(tmpdir)
    ws = tmp_path / "ws"
    # site-3 never answers its training task, so the job is surely still running when the signal comes
    cmd = [sys.executable, str(REPO / "tests" / "hostile_job.py"), "--hostile-mode", "sleep", "--dataset", "car",
           "--sites", "3", "--workspace", str(ws)]
    with flare_lock():
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        try:
            site3 = ws / "flare" / "icdta4fl" / "site-3"
            started = _wait(lambda: site3.is_dir() and len(processes_with_token(token)) >= 5, timeout=120)
            assert started, "the simulator did not start its sites"
            sim_tmp = _sim_tmp_folders(token)
            assert sim_tmp, "the simulator's processes have no private temporary folder"
            os.kill(proc.pid, signum)  # the job script alone, as `kill PID` or a CI timeout would
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 128 + signum, err[-3000:]
            assert f"interrupted ({signal.Signals(signum).name})" in err
            assert "Traceback" not in err, err[-3000:]
            assert _wait(lambda: not processes_with_token(token), timeout=10), \
                [p.cmdline() for p in processes_with_token(token)]
            assert sorted(p.name for p in tmpdir.iterdir()) == []  # no staged package or job folder left
            assert not [f for f in sim_tmp if f.exists()]  # nor the simulator's own
            assert not (ws / "report.json").exists() or "running" not in (ws / "report.json").read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
            kill_token(token)
