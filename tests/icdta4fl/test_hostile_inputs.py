"""Bad data files at a site, bad site configuration and bad job arguments: each gets a clear error naming what is
wrong, and an existing report is never clobbered by a failed write."""

from __future__ import annotations

import importlib

import json
from pathlib import Path

import numpy as np
import pytest


from treeflare.data import DataError, Feature, Schema
from treeflare.flare.site_config import SITE_CONFIG_ENV, load_binding, parse_binding

SCHEMA = Schema((Feature("age", "numeric"), Feature("colour", "categorical", ("red", "blue"))), "y", ("no", "yes"))


class _Ctx:
    """Just enough of an FLContext for the site-config lookup: the site's workspace."""

    def __init__(self, kit: Path):
        self.kit = kit

    def get_engine(self):
        return self

    def get_workspace(self):
        return self

    def get_site_config_dir(self):
        return str(self.kit / "local")


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site kit whose local/treeflare_site.json points at a data folder with good files."""
    for var in (SITE_CONFIG_ENV, "TREEFLARE_DATA_ROOT"):
        monkeypatch.delenv(var, raising=False)
    kit = tmp_path / "kit"
    (kit / "local").mkdir(parents=True)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").write_text("age,colour,outcome\n30,red,yes\n40,blue,no\n50,red,no\n")
    (data / "test.csv").write_text("age,colour,outcome\n35,blue,yes\n")
    cfg = {"data_dir": str(data), "label_column": "outcome"}
    (kit / "local" / "treeflare_site.json").write_text(json.dumps(cfg))
    return kit, data, _Ctx(kit)


def test_site_binding_reads_own_column_names(site):
    kit, data, ctx = site
    b = load_binding("site-1", ctx, job_data_root="/elsewhere")
    assert b.data_dir == data and "treeflare_site.json" in b.source
    t = b.read("train", SCHEMA, "site-1")
    assert len(t) == 3 and list(t.y_codes()) == [1, 0, 0]


def test_unknown_class_in_site_csv(site):
    kit, data, ctx = site
    (data / "train.csv").write_text("age,colour,outcome\n30,red,yes\n40,blue,maybe\n")
    with pytest.raises(DataError, match=r"site-1.*line 3.*unknown class 'maybe'"):
        load_binding("site-1", ctx).read("train", SCHEMA, "site-1")


def test_unknown_category_and_garbage_number(site):
    kit, data, ctx = site
    # a category the schema does not know is treated as missing (trees route it like NaN), never a crash
    (data / "train.csv").write_text("age,colour,outcome\n30,green,yes\n40,blue,no\n")
    X, _, _ = load_binding("site-1", ctx).read("train", SCHEMA, "site-1").codes()
    assert np.isnan(X[0, 1]) and X[1, 1] == 1
    (data / "train.csv").write_text("age,colour,outcome\nthirty,red,yes\n40,blue,no\n")
    with pytest.raises(DataError, match="age"):
        load_binding("site-1", ctx).read("train", SCHEMA, "site-1")


def test_missing_or_extra_column(site):
    kit, data, ctx = site
    (data / "train.csv").write_text("age,outcome\n30,yes\n")
    with pytest.raises(DataError, match="colour"):
        load_binding("site-1", ctx).read("train", SCHEMA, "site-1")
    (data / "train.csv").write_text("age,colour,outcome,ssn\n30,red,yes,123\n")
    with pytest.raises(DataError, match="ssn"):
        load_binding("site-1", ctx).read("train", SCHEMA, "site-1")


def test_empty_and_binary_files(site):
    kit, data, ctx = site
    (data / "train.csv").write_text("")
    with pytest.raises(DataError, match="empty"):
        load_binding("site-1", ctx).read("train", SCHEMA, "site-1")
    (data / "train.csv").write_bytes(b"\x00\x01\x02\xff\xfe" * 100)
    with pytest.raises((DataError, UnicodeDecodeError)):
        load_binding("site-1", ctx).read("train", SCHEMA, "site-1")
    (data / "train.csv").unlink()
    with pytest.raises(DataError, match="its data file train.csv is missing"):
        load_binding("site-1", ctx).read("train", SCHEMA, "site-1")


def test_label_column_named_in_binding_missing(site):
    kit, data, ctx = site
    cfg = {"data_dir": str(data), "label_column": "diagnosis"}
    (kit / "local" / "treeflare_site.json").write_text(json.dumps(cfg))
    with pytest.raises(DataError, match="'diagnosis'.*not found"):
        load_binding("site-1", ctx).read("train", SCHEMA, "site-1")


@pytest.mark.parametrize("content, match", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('{"data_dir": "/d", "password": "x"}', "unknown keys"),
    ('{"train": "train.csv"}', "'data_dir' is required"),
    ('{"data_dir": "/d", "train": "../../etc/passwd"}', "file name inside data_dir"),
    ('{"data_dir": 7}', "non-empty string"),
])
def test_bad_site_config(site, content, match):
    kit, data, ctx = site
    (kit / "local" / "treeflare_site.json").write_text(content)
    with pytest.raises(DataError, match=match):
        load_binding("site-1", ctx)


def test_site_config_env_and_fallbacks(site, monkeypatch, tmp_path):
    kit, data, ctx = site
    monkeypatch.setenv(SITE_CONFIG_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(DataError, match="not found"):
        load_binding("site-1", ctx)
    monkeypatch.delenv(SITE_CONFIG_ENV)
    (kit / "local" / "treeflare_site.json").unlink()
    assert load_binding("site-2", ctx, "/jobroot").data_dir == Path("/jobroot/site-2")
    monkeypatch.setenv("TREEFLARE_DATA_ROOT", "/siteroot")
    assert load_binding("site-2", ctx, "/jobroot").data_dir == Path("/siteroot/site-2")
    monkeypatch.delenv("TREEFLARE_DATA_ROOT")
    with pytest.raises(DataError, match="no data configured"):
        load_binding("site-2", ctx, "")
    assert parse_binding({"data_dir": "rel"}, "/nonexistent/x.json").data_dir.is_absolute()


def test_failed_report_write_keeps_the_old_report(tmp_path):
    from treeflare.files import write_json_atomic

    path = write_json_atomic(tmp_path / "report.json", {"job": "icdta4fl", "ok": True})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"job": "icdta4fl", "ok": True}
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no half-written temp file left


@pytest.fixture(scope="module")
def job_script():
    """jobs/icdta4fl/job.py loaded in-process (its main() is what the command line runs)."""
    return importlib.import_module("treeflare.jobs.icdta4fl")


def _job(mod, args, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        rc = mod.main([*args, "--workspace", str(tmp_path / "ws")])
        raise SystemExit(rc)
    err = capsys.readouterr().err + (exc.value.code if isinstance(exc.value.code, str) else "")
    return exc.value.code, err


@pytest.mark.parametrize("args, match", [
    (["--dataset", "car", "--percentile", "150"], "--percentile must be in"),
    (["--dataset", "car", "--max-depth", "0"], "--max-depth must be an integer >= 1, got 0"),
    (["--dataset", "car", "--algorithm", "c4.5"], "invalid choice"),
    (["--dataset", "car", "--env", "cloud"], "invalid choice"),
    (["--dataset", "no_such_dataset"], "no_such_dataset"),
    (["--dataset", "car", "--sites", "2", "--env", "prod"], "--env prod needs --startup-kit"),
])
def test_bad_job_arguments(job_script, args, match, tmp_path, capsys):
    code, err = _job(job_script, args, tmp_path, capsys)
    assert code not in (0, None)
    assert match in err, err[-2000:]
    assert "Traceback" not in err


def test_prod_with_a_folder_that_is_not_an_admin_kit(job_script, tmp_path, capsys):
    code, err = _job(job_script, ["--dataset", "car", "--sites", "2", "--env", "prod", "--startup-kit",
                                  str(tmp_path)], tmp_path, capsys)
    assert code not in (0, None) and "not an admin startup kit" in err, err[-2000:]
    assert "Traceback" not in err


def test_submit_a_folder_that_is_not_a_job(tmp_path):
    from treeflare.flare.admin import DeployError, submit_job

    with pytest.raises(DeployError, match="not a job folder"):
        submit_job(tmp_path, tmp_path)
