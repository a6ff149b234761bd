"""What the operator sees while a job goes through an admin session (flare.admin) and after ``--export``
(flare.runner): in-process, with NVFlare's admin API stood in for by a fake session (no FLARE system)."""

from __future__ import annotations

import argparse
import json

import pytest

from treeflare.flare import admin
from treeflare.flare.runner import add_run_args, export_hint


class FakeSession:
    """An admin session whose opening prints what NVFlare's AdminAPI.connect prints (as its print_human does, to
    standard output), and a failed download, which must still reach the user."""

    def __init__(self):
        print("Connecting to FLARE ...")
        print("login: certificate accepted")  # any other line of the opening still prints

    def submit_job(self, job_dir):
        return "job-1"

    def wait_for_job(self, job_id, timeout, poll_interval):
        return {"status": "FINISHED:COMPLETED"}

    def download_job_result(self, job_id, destination):
        print(f"failed to receive file {job_id}.zip: no space left")
        return None

    def show_stats(self, job_id, target):
        return {}

    def close(self):
        pass


def test_a_job_says_connecting_once_and_keeps_nvflare_errors(tmp_path, monkeypatch, capsys):
    import nvflare.fuel.flare_api.flare_api as flare_api

    monkeypatch.setattr(flare_api, "new_secure_session", lambda *a, **k: FakeSession())
    kit, job_dir = tmp_path / "admin@x", tmp_path / "job"
    (kit / "startup").mkdir(parents=True)
    (kit / "startup" / "client.crt").write_text("not a certificate")  # the user name falls back to the folder's
    job_dir.mkdir()
    (job_dir / "meta.json").write_text(json.dumps({"name": "job"}))
    opened = []

    def watch(job_id):  # the progress printer opens a third session while the job runs
        opened.append(job_id)
        return admin.admin_session(kit)

    outcome = admin.submit_and_collect(kit, job_dir, tmp_path / "out", timeout=5, watch=watch)
    out = capsys.readouterr()
    text = out.out + out.err
    assert outcome.ok and opened == ["job-1"]
    assert "Connecting to FLARE ..." not in text  # three sessions, NVFlare's line never
    assert text.count("connecting to the FLARE server") == 1 and f"admin kit {kit.resolve()}" in text
    assert "failed to receive file job-1.zip: no space left" in text  # NVFlare's other messages still print
    assert text.count("login: certificate accepted") == 3


def test_export_hint_names_the_admin_kit_on_every_command(tmp_path):
    kit = tmp_path / "prod 00" / "admin@x"  # a space: the printed commands still run as pasted
    lines = export_hint(tmp_path / "jobs" / "icdta4fl", kit).splitlines()
    commands = [line.strip() for line in lines if line.strip().startswith("nvflare job")]
    assert [c.split()[2] for c in commands] == ["submit", "wait", "download"]
    assert all(c.split("#")[0].rstrip().endswith(f"--startup-kit '{kit.resolve()}'") for c in commands)
    assert "ADMIN_KIT" in export_hint(tmp_path / "job") and "--startup-kit ADMIN_KIT" in export_hint(tmp_path / "j")


def test_a_missing_workspace_says_why(capsys):
    p = argparse.ArgumentParser()
    add_run_args(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--export", "jobs_out"])
    err = capsys.readouterr().err
    assert "--workspace" in err and "exported job points the sites at that folder" in err


@pytest.mark.parametrize("env", ["poc", "prod"])
def test_a_failed_job_names_the_server_log_where_it_is(env, tmp_path, monkeypatch, capsys):
    """A job that ends badly points at the server's log: the POC's own file on this machine, or, for a provisioned
    server elsewhere, where it is on that host; never a placeholder such as `<server kit>/log.txt`."""
    from treeflare.flare import runner

    def failed(admin_kit, job_dir, out, **kwargs):
        return admin.JobOutcome("job-9", "FINISHED:EXECUTION_EXCEPTION", {}, out, server_dir=tmp_path / "server")

    monkeypatch.setattr(admin, "submit_and_collect", failed)
    monkeypatch.setattr(runner, "export_job", lambda recipe, folder: folder)
    args = argparse.Namespace(env=env, timeout=5)
    poc_log = tmp_path / "poc" / "server" / "log.txt"
    runner._submit(None, args, tmp_path / "ws", tmp_path / "kit", {}, server_log=poc_log if env == "poc" else None)
    err = capsys.readouterr().err
    assert "job job-9 ended FINISHED:EXECUTION_EXCEPTION" in err and "<server kit>" not in err
    assert (f"Server log: {poc_log}" if env == "poc" else "Server log: log.txt in the server kit folder, on the "
            "server host") in err
