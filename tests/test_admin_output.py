"""What the operator sees while a job goes through an admin session (flare.admin) and after ``--export``
(flare.runner): in-process, with NVFlare's admin API stood in for by a fake session (no FLARE system)."""

from __future__ import annotations

import argparse
import json

import pytest

from treeflare.flare import admin
from treeflare.flare.runner import add_run_args, export_hint


class FakeSession:
    """An admin session whose opening prints what NVFlare's AdminAPI.connect prints (through the same function),
    and a failed download, which must still reach the user."""

    def __init__(self):
        from nvflare.fuel.hci.client import api

        api._print_hci_message("Connecting to FLARE ...")

    def submit_job(self, job_dir):
        return "job-1"

    def wait_for_job(self, job_id, timeout, poll_interval):
        return {"status": "FINISHED:COMPLETED"}

    def download_job_result(self, job_id, destination):
        from nvflare.fuel.hci.client import api

        api._print_hci_message(f"failed to receive file {job_id}.zip: no space left")
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
