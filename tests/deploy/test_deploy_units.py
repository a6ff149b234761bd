"""Fast checks of the deployment tooling that start no FLARE process: provisioning output, site setup, kit helpers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from deploy_helpers import stop_kits
from treeflare.flare.admin import DeployError, admin_username, local_site_dirs
from treeflare.flare.poc import LocalPoc, service_pids

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kits(tmp_path_factory):
    ws = tmp_path_factory.mktemp("prov")
    proc = subprocess.run(["bash", str(REPO / "scripts" / "provision.sh"), "-w", str(ws), "--port", "18123",
                           "--sites", "2", "--install-package"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return ws / "treeflare" / "prod_00", proc.stdout


def test_provision_makes_kits(kits):
    prod, out = kits
    assert sorted(p.name for p in prod.iterdir()) == ["admin@treeflare.org", "localhost", "site-1", "site-2"]
    for site in ("site-1", "site-2"):
        assert (prod / site / "startup" / "start.sh").is_file()
        # no --data-dir: a template for the site operator, not a binding
        assert (prod / site / "local" / "treeflare_site.json.example").is_file()
        assert not (prod / site / "local" / "treeflare_site.json").exists()
    admin = json.loads((prod / "admin@treeflare.org" / "startup" / "fed_admin.json").read_text())["admin"]
    assert admin["port"] == 18123
    assert "site site-2" in out and "nvflare job submit" in out


def test_install_package_extends_the_allow_list(kits):
    prod, _ = kits
    for kit in ("localhost", "site-1", "site-2"):
        resources = json.loads((prod / kit / "local" / "resources.json").read_text())
        default = json.loads((prod / kit / "local" / "resources.json.default").read_text())
        assert resources["class_allow_list"] == default["class_allow_list"] + ["treeflare."]
        assert {k: v for k, v in resources.items() if k != "class_allow_list"} == \
            {k: v for k, v in default.items() if k != "class_allow_list"}


def test_site_setup_bind_and_allow_are_idempotent(kits, tmp_path):
    prod, _ = kits
    kit = prod / "site-1"
    run = lambda *a: subprocess.run(["python3", str(REPO / "app" / "site_setup.py"), *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    for name in ("train.csv", "test.csv"):  # bind refuses a folder without the site's files
        (tmp_path / name).write_text("age,outcome\n40,yes\n")
    p = run("bind", str(kit), "--data-dir", str(tmp_path), "--label-column", "outcome")
    assert p.returncode == 0, p.stderr
    assert json.loads((kit / "local" / "treeflare_site.json").read_text()) == \
        {"data_dir": str(tmp_path), "label_column": "outcome"}
    before = (kit / "local" / "resources.json").read_text()
    assert run("allow-package", str(kit)).returncode == 0
    assert (kit / "local" / "resources.json").read_text() == before
    bad = run("allow-package", str(kit), "--prefix", "treeflare")
    assert bad.returncode != 0 and "must end with '.'" in bad.stderr
    assert run("bind", str(tmp_path), "--data-dir", "/x").returncode != 0


def test_admin_username_from_the_kit_certificate(kits, tmp_path):
    prod, _ = kits
    assert admin_username(prod / "admin@treeflare.org") == "admin@treeflare.org"
    with pytest.raises(DeployError, match="not an admin startup kit"):
        admin_username(tmp_path)
    assert sorted(local_site_dirs(prod / "admin@treeflare.org")) == ["site-1", "site-2"]


def test_poc_helpers_without_a_poc(tmp_path):
    poc = LocalPoc(tmp_path / "nothing")
    assert not poc.prepared() and not poc.running() and poc.sites == []
    poc.stop()  # a no-op, not an error
    with pytest.raises(DeployError, match="treeflare poc up"):
        _ = poc.admin_kit
    assert service_pids(tmp_path) == {"daemon": None, "main": None}
    assert stop_kits([tmp_path], timeout=0.1) is False


def test_project_file_is_valid():
    import yaml

    cfg = yaml.safe_load((REPO / "configs" / "project.yml").read_text())
    kinds = [p["type"] for p in cfg["participants"]]
    assert cfg["api_version"] == 3 and kinds.count("server") == 1 and kinds.count("client") == 3
    admin = next(p for p in cfg["participants"] if p["type"] == "admin")
    assert admin["role"] == "project_admin"  # BYOC jobs need it (or lead)


def test_poc_server_stages_site_logs_in_its_workspace_and_stop_removes_the_empty_folders(tmp_path):
    """NVFlare's JobLogReceiver staged each job's streamed site logs in <system temp>/<job id>/<site>/ and left the
    folders behind (issue 21): a prepared POC points it into its own workspace, and stop removes what is empty."""
    poc = LocalPoc(tmp_path / "system")
    poc.prepare(["site-1", "site-2"], port=18577)  # prepares files only; starts no process
    for name in ("resources.json", "resources.json.default"):
        doc = json.loads((poc.server_dir / "local" / name).read_text())
        receivers = [c for c in doc["components"] if c["path"].endswith(".JobLogReceiver")]
        assert receivers and all(c["args"]["dest_dir"] == str(poc.log_staging) for c in receivers)
    assert poc.log_staging.is_relative_to(poc.workspace)
    # what the receiver leaves once the job store took its files goes; a partial log stays
    (poc.log_staging / "job-a" / "site-1").mkdir(parents=True)
    (poc.log_staging / "job-b" / "site-2").mkdir(parents=True)
    (poc.log_staging / "job-b" / "site-2" / "log.txt").write_text("partial")
    poc.stop()  # nothing runs: it only tidies
    assert sorted(str(p.relative_to(poc.log_staging)) for p in poc.log_staging.rglob("*")) == \
        ["job-b", "job-b/site-2", "job-b/site-2/log.txt"]
