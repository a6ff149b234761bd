"""Named site bindings: ``app/site_setup.py bind --name`` writes them, ``site_config.load_binding`` reads the one a
job names, an existing binding is never overwritten silently, and a binding name is never a path."""

from __future__ import annotations

import importlib

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from treeflare.data import DataError
from treeflare.flare.site_config import SITE_CONFIG_ENV, DATA_ROOT_ENV, binding_file_name, load_binding

REPO = Path(__file__).resolve().parents[2]
site_setup = importlib.import_module("treeflare.tools.site_setup")

BAD_NAMES = ["../x", "a/b", "..", ".hidden", "a.b", "1st", "a b", "x" * 65, "\u00e9t\u00e9"]


@pytest.fixture
def kit(tmp_path, monkeypatch):
    for var in (SITE_CONFIG_ENV, DATA_ROOT_ENV):
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "kit" / "local").mkdir(parents=True)
    return tmp_path / "kit"


def test_named_bindings_sit_beside_the_default_one(kit, tmp_path):
    site_setup.bind(kit, str(tmp_path / "h"), label_column="y")
    site_setup.bind(kit, str(tmp_path / "v"), id_column="pid", name="vertical", categorical_allowed=["zip"])
    local = kit / "local"
    assert sorted(p.name for p in local.iterdir()) == ["treeflare_site.json", "treeflare_site.vertical.json"]
    default = load_binding("site-1", config_dir=local, job_data_root="/elsewhere")
    vertical = load_binding("site-1", config_dir=local, job_data_root="/elsewhere", name="vertical")
    assert (default.data_dir, default.label_column, default.id_column) == (tmp_path / "h", "y", None)
    assert (vertical.data_dir, vertical.id_column, vertical.categorical_allowed) == (tmp_path / "v", "pid", ("zip",))


def test_a_named_binding_the_site_lacks_refuses_the_job(kit, tmp_path, monkeypatch):
    default = site_setup.bind(kit, str(tmp_path / "h"))
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path / "root"))
    monkeypatch.setenv(SITE_CONFIG_ENV, str(default))
    # neither the default binding nor a data root stands in for it: those are another job's files
    with pytest.raises(DataError, match="does not hold") as err:
        load_binding("site-1", config_dir=kit / "local", job_data_root="/elsewhere", name="vertical")
    assert str(kit) not in err.value.redacted()


def test_rebinding_with_other_contents_is_refused_unless_replaced(kit, tmp_path):
    out = site_setup.bind(kit, str(tmp_path / "h"), label_column="y")
    assert site_setup.bind(kit, str(tmp_path / "h"), label_column="y") == out  # the same binding again: a no-op
    with pytest.raises(SystemExit, match="already holds the default binding.*--replace"):
        site_setup.bind(kit, str(tmp_path / "v"))
    assert json.loads(out.read_text())["data_dir"] == str(tmp_path / "h")
    site_setup.bind(kit, str(tmp_path / "v"), replace=True)
    assert json.loads(out.read_text()) == {"data_dir": str(tmp_path / "v")}
    site_setup.bind(kit, str(tmp_path / "a"), name="vertical")
    with pytest.raises(SystemExit, match="already holds binding 'vertical'"):
        site_setup.main(["bind", str(kit), "--name", "vertical", "--data-dir", str(tmp_path / "b")])


def test_categorical_allowed_from_the_command_line(kit, tmp_path):
    assert site_setup.main(["bind", str(kit), "--data-dir", str(tmp_path), "--categorical-allowed", "zip",
                            "region", "--allow-missing"]) == 0
    assert load_binding("site-1", config_dir=kit / "local").categorical_allowed == ("zip", "region")


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_binding_name_is_never_a_path(kit, tmp_path, name):
    with pytest.raises(SystemExit, match="binding name"):
        site_setup.bind(kit, str(tmp_path), name=name)
    with pytest.raises(DataError, match="binding name"):
        load_binding("site-1", config_dir=kit / "local", name=name)
    with pytest.raises(DataError, match="binding name"):
        binding_file_name(name)
    assert list((kit / "local").iterdir()) == []


def _site_ctx(local: Path):
    """Just enough of an FLContext for the binding lookup: the site's local/ folder."""
    workspace = SimpleNamespace(get_site_config_dir=lambda: str(local))
    return SimpleNamespace(get_engine=lambda: SimpleNamespace(get_workspace=lambda: workspace))


def test_the_discovery_executor_reads_the_binding_the_job_names(kit, tmp_path):
    from treeflare.flare.discovery.executor import SchemaDiscoveryExecutor

    for name, rows in (("", "x,y\n1,a\n2,b\n"), ("vertical", "row_id,z\n1,3\n2,4\n3,5\n")):
        folder = tmp_path / (name or "default")
        folder.mkdir()
        (folder / "train.csv").write_text(rows)
        site_setup.bind(kit, str(folder), name=name)
    task = {"request": {"vertical": True, "id_column": "row_id"}}
    executor = SchemaDiscoveryExecutor(binding="vertical")
    executor.log_info = lambda *args: None  # FLARE's logging wants a whole FLContext
    reply = executor._profile("site-1", task, _site_ctx(kit / "local"))
    assert reply["profile"]["n_rows"] == 3 and "z" in json.dumps(reply["profile"])


def test_the_icdta4fl_job_hands_its_binding_to_the_sites(tmp_path, monkeypatch):

    from treeflare.data import Feature, Schema

    monkeypatch.chdir(tmp_path)
    schema = Schema((Feature("age", "numeric"),), "y", ("no", "yes"))
    (tmp_path / "schema.json").write_text(json.dumps(schema.to_dict()))
    with pytest.raises(SystemExit) as done:
        importlib.import_module("treeflare.jobs.icdta4fl").main(
            ["--schema", "schema.json", "--binding", "vertical", "--workspace", "ws", "--export", "out"])
    assert done.value.code == 0
    client = json.loads(next((tmp_path / "out").rglob("config_fed_client.json")).read_text())
    assert '"binding": "vertical"' in json.dumps(client)
