"""The schema-discovery job's controller and site executors wired together in one process (tasks and replies through
FLARE's serializer, tests/icdta4fl_inprocess.py): a clean run, a conflict, a site with bad data and a hostile site,
each ending with a result file and no exception into FLARE. Also the job scripts' --schema options."""

from __future__ import annotations

import importlib

import json
from pathlib import Path

import numpy as np
import pytest
from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import make_reply


from icdta4fl_inprocess import InProcessRun
from treeflare.data import DataError, Schema
from treeflare.flare.discovery.controller import RESULT_FILE, SCHEMA_FILE, SchemaDiscoveryController
from treeflare.flare.discovery.executor import SchemaDiscoveryExecutor, profile_site
from treeflare.flare.discovery.job import read_schema_file, schema_file_parties
from treeflare.flare.site_config import SiteBinding, parse_binding

RARE = "violet-0917"
SECRET = "123-45-6789"
SITES = ["site-1", "site-2", "site-3"]


def pooled(n=240, seed=3):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=n).round(3).astype(str), "colour": rng.choice(["red", "green", "blue"], n),
            "grade": rng.choice(["lo", "mid", "hi"], n), "y": rng.choice(["no", "yes"], n)}


def write_site(root: Path, site: str, cols: dict, order=None, columns=None):
    columns = columns or list(cols)
    n = len(cols["y"])
    order = range(n) if order is None else order
    lines = [",".join(columns)] + [",".join(cols[c][i] for c in columns) for i in order]
    (root / site).mkdir(parents=True, exist_ok=True)
    (root / site / "train.csv").write_text("\n".join(lines) + "\n")


def site_folders(root: Path) -> dict:
    """Three sites: site-2's rows reversed (categories first seen in another order), site-3's columns in another
    order with a value held by 4 rows (under k = 5)."""
    data = pooled()
    parts = [{c: v[i::3].copy() for c, v in data.items()} for i in range(3)]
    write_site(root, "site-1", parts[0])
    write_site(root, "site-2", parts[1], order=range(len(parts[1]["y"]) - 1, -1, -1))
    parts[2]["colour"][:4] = RARE
    write_site(root, "site-3", parts[2], columns=["y", "grade", "colour", "x"])
    return data


def run(tmp_path, controller, executors=None, sites=SITES, data_root=None):
    execs = {s: SchemaDiscoveryExecutor(data_root=str(data_root or tmp_path / "data")) for s in sites}
    execs.update(executors or {})
    harness = InProcessRun(tmp_path, sites, executors=execs)
    result = harness.run(controller, tmp_path / "run")
    return result, harness, controller


def test_sites_agree_whatever_their_row_column_and_category_order(tmp_path):
    site_folders(tmp_path / "data")
    result, harness, controller = run(tmp_path, SchemaDiscoveryController(sites=SITES, label="y"))
    assert result["status"] == "completed", result
    schema = Schema.from_dict(result["schema"])
    assert schema.feature_names == ["x", "colour", "grade"]  # site-1's order
    assert schema.feature("colour").categories == ("blue", "green", "red")  # sorted; the rare value left out
    assert schema.feature("x").kind == "numeric" and schema.classes == ("no", "yes")
    assert result["discovery"]["sites"]["site-3"]["n_rows"] == 80
    saved = json.loads((tmp_path / "run" / SCHEMA_FILE).read_text())
    assert Schema.from_dict(saved) == schema and saved["discovery"]["min_category_rows"] == 5
    # the rare value never left site-3; numeric columns sent no values
    sent = [m for m in harness.messages if m[0] == "to_server"]
    assert len(sent) == 3 and all(RARE not in json.dumps(m[3]["profile"]) for m in sent)
    assert all("values" not in c for m in sent for c in m[3]["profile"]["columns"] if c["kind"] == "numeric")


def test_a_conflict_stops_the_job_naming_sites_and_columns(tmp_path):
    data = site_folders(tmp_path / "data")
    part = {c: v[2::3].copy() for c, v in data.items()}
    part["x"][:30] = "n/a-ish"  # many texts: site-3 infers the column categorical
    write_site(tmp_path / "data", "site-3", part)
    result, _, controller = run(tmp_path, SchemaDiscoveryController(sites=SITES, label="y"))
    assert result["status"] == "failed"
    assert "column 'x' is categorical at site-3 but numeric at site-1, site-2" in result["error"]
    assert result["conflicts"] and ("panic", result["error"]) in controller.logged
    assert not (tmp_path / "run" / SCHEMA_FILE).exists()


def test_a_site_with_bad_data_is_named_without_its_values(tmp_path):
    data = site_folders(tmp_path / "data")
    part = {c: v[1::3].copy() for c, v in data.items()}
    part["x"][6] = SECRET  # one text in a numeric column: a typo, refused at the site
    write_site(tmp_path / "data", "site-2", part)
    result, _, _ = run(tmp_path, SchemaDiscoveryController(sites=SITES, label="y"))
    assert result["status"] == "failed"
    assert "site-2: DataError: site-2: train.csv, column 'x', line 8: not a number" in result["error"]
    assert SECRET not in json.dumps(result) and str(tmp_path) not in result["error"]


class HostileExecutor(Executor):
    def __init__(self, profile):
        super().__init__()
        self.profile = profile

    def execute(self, task_name, shareable, fl_ctx, abort_signal):
        reply = make_reply(ReturnCode.OK)
        reply["profile"] = self.profile
        return reply


@pytest.mark.parametrize("profile", [
    None,
    {"version": 2, "min_category_rows": 5, "n_rows": 10, "label": "y", "id_column": None, "classes": ["a", "b"],
     "columns": [{"name": "colour", "kind": "categorical", "values": [str(i) for i in range(200_000)]}]},
    {"version": 2, "min_category_rows": 1, "n_rows": 10, "label": "y", "id_column": None, "classes": ["a", "b"],
     "columns": []},
])
def test_a_hostile_site_cannot_crash_the_server(tmp_path, profile):
    site_folders(tmp_path / "data")
    result, _, _ = run(tmp_path, SchemaDiscoveryController(sites=SITES, label="y"),
                       executors={"site-3": HostileExecutor(profile)})
    assert result["status"] == "failed" and "site-3: invalid schema-discovery reply" in result["error"]
    assert len(result["error"]) < 1000


def test_vertical_parties_and_declarations(tmp_path):
    ids = [f"u{i}" for i in range(40)]
    rng = np.random.default_rng(0)
    active = {"uid": ids, "a": rng.normal(size=40).round(2).astype(str), "y": rng.choice(["p", "q"], 40)}
    passive = {"uid": ids[::-1], "size": rng.choice(["S", "M", "L"], 40), "y": ids}
    write_site(tmp_path / "data", "site-1", active)
    write_site(tmp_path / "data", "site-2", passive, columns=["uid", "size"])
    controller = SchemaDiscoveryController(sites=SITES[:2], label="y", id_column="uid", vertical=True,
                                           ordinal={"size": ["S", "M", "L"]})
    result, _, _ = run(tmp_path, controller, sites=SITES[:2])
    assert result["status"] == "completed", result
    schema = Schema.from_dict(result["schema"])
    assert schema.feature_names == ["a", "size"] and schema.id_column == "uid"
    assert schema.feature("size").kind == "ordinal" and schema.feature("size").categories == ("S", "M", "L")
    # who holds which column: recorded by the server from which reply listed it, written for the reviewer,
    # and read back with the schema (issue 21)
    assert result["parties"] == {"a": "site-1", "size": "site-2"}
    saved = tmp_path / "run" / SCHEMA_FILE
    assert [f["party"] for f in json.loads(saved.read_text())["features"]] == ["site-1", "site-2"]
    assert read_schema_file(saved) == schema
    assert schema_file_parties(saved, schema, SITES[:2]) == {"a": "site-1", "size": "site-2"}


def test_site_binding_names_and_its_own_k(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    rows = ["pid,c,outcome"] + [f"p{i},{'ab'[i % 2] if i < 12 else 'z'},{'01'[i % 2]}" for i in range(14)]
    (d / "train.csv").write_text("\n".join(rows) + "\n")
    binding = SiteBinding(d, label_column="outcome", id_column="pid", min_category_rows=6)
    p = profile_site(binding, "site-1", {"label": "y", "id_column": "uid", "min_category_rows": 2})
    assert p["label"] == "y" and p["id_column"] == "uid" and p["min_category_rows"] == 6
    assert p["columns"] == [{"name": "c", "kind": "categorical", "values": ["a", "b"]}]  # 'z': 2 rows < 6
    # no job label: the binding's own name is reported
    assert profile_site(binding, "site-1", {})["label"] == "outcome"


def test_the_site_not_the_job_sets_the_floor_of_k(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    # 'b' and 'c' are held by 2 rows and 1 row, 'a' by 9
    (d / "train.csv").write_text("c,y\n" + "".join(f"{v},{i % 2}\n" for i, v in enumerate("aaaaaaaaabbc")))
    for request in ({"min_category_rows": 1}, {}):  # no floor in the binding: the default, 5
        p = profile_site(SiteBinding(d), "site-1", {"label": "y", **request})
        assert p["min_category_rows"] == 5 and p["columns"] == [{"name": "c", "kind": "categorical", "values": ["a"]}]
    # the site's operator may set its own floor, lower or higher; a job may only ask for more
    assert profile_site(SiteBinding(d, min_category_rows=2), "site-1",
                        {"label": "y", "min_category_rows": 1})["columns"][0]["values"] == ["a", "b"]
    assert profile_site(SiteBinding(d, min_category_rows=2), "site-1",
                        {"label": "y", "min_category_rows": 10})["columns"][0]["values"] == []


def zip_sites(root: Path, last_zip: str):
    """Three sites of 80 rows, zip codes each held by many rows; site-2's last row holds ``last_zip``."""
    rng = np.random.default_rng(7)
    for site in SITES:
        zips = rng.choice(["Z10001", "Z10002"], 80).astype(object)
        if site == "site-2":
            zips[-1] = last_zip
        write_site(root, site, {"zip": list(zips), "income": [str(v) for v in rng.integers(1000, 9000, 80)],
                                "y": list(rng.choice(["no", "yes"], 80))})


@pytest.mark.parametrize("levels", [["Z90210"], ["Z10001", "Z10002"]])
def test_a_job_declaring_ordinal_levels_learns_no_count(tmp_path, levels):
    """The finding, through the controller: a hostile job declares a guessed zip code as the column's one level.
    The result (conflict text included) is the same whether one row holds it or none."""
    results = []
    for i, last in enumerate(("Z90210", "Z10001")):
        zip_sites(tmp_path / f"data{i}", last)
        result, harness, _ = run(tmp_path / f"r{i}", SchemaDiscoveryController(sites=SITES, label="y",
                                                                                ordinal={"zip": levels}),
                                 data_root=tmp_path / f"data{i}")
        results.append(result)
        sent = json.dumps([m[3]["profile"] for m in harness.messages if m[0] == "to_server"])
        assert "79" not in sent and "80" in sent  # the rows outside the level are not counted; the row count is
    assert results[0] == results[1]
    if levels == ["Z90210"]:
        assert results[0]["status"] == "failed"
        assert "ordinal column 'zip': site-1 holds a value in 5 rows or more that is not one of the declared " \
               "levels Z90210" in results[0]["error"]
    else:
        assert results[0]["status"] == "completed", results[0]


def test_a_numeric_column_is_reported_as_categories_only_with_the_sites_leave(tmp_path):
    zip_sites(tmp_path / "data", "Z10001")
    controller = SchemaDiscoveryController(sites=SITES, label="y", categorical=["income"])
    result, harness, _ = run(tmp_path, controller)
    assert result["status"] == "failed"
    assert ("site-1: DataError: site-1: train.csv, column 'income': the job declares it categorical, but this site "
            "reads it as numbers") in result["error"] and "categorical_allowed" in result["error"]
    assert not [m for m in harness.messages if m[0] == "to_server" and "profile" in m[3]]  # no site sent one
    # the binding allows it: the column's common values are reported
    binding = parse_binding({"data_dir": str(tmp_path / "data" / "site-1"), "categorical_allowed": ["income"]},
                            "treeflare_site.json")
    p = profile_site(binding, "site-1", {"label": "y", "categorical": ["income"], "min_category_rows": 1})
    assert p["columns"][1]["name"] == "income" and p["columns"][1]["kind"] == "categorical"
    with pytest.raises(DataError, match="'categorical' is not a list of column names"):  # not read as i, n, c, ...
        profile_site(binding, "site-1", {"label": "y", "categorical": "income"})
    for bad in ("income", [1], [""], {"income": True}):
        with pytest.raises(DataError, match="'categorical_allowed' must be a list of column names"):
            parse_binding({"data_dir": "d", "categorical_allowed": bad}, "treeflare_site.json")


def test_a_job_may_rename_the_sites_label_column_but_not_pick_another(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    (d / "train.csv").write_text("pid,zip,outcome\n" + "".join(f"p{i},Z{i},{i % 2}\n" for i in range(10)))
    binding = SiteBinding(d, label_column="outcome", id_column="pid")
    assert profile_site(binding, "site-1", {"label": "y", "min_category_rows": 1})["classes"] == ["0", "1"]
    for request in ({"label": "zip"}, {"label": "y", "id_column": "zip"}):
        with pytest.raises(DataError) as err:  # 'zip' is another column: its values would be reported as classes
            profile_site(binding, "site-1", request)
        assert "is also another column of its file" in err.value.redacted() and "Z1" not in err.value.redacted()


def test_reviewed_schema_file(tmp_path):
    f = tmp_path / "schema.json"
    good = Schema.from_dict({"version": 1, "features": [{"name": "a", "kind": "numeric"}], "label": "y",
                             "classes": ["0", "1"]})
    f.write_text(json.dumps({**good.to_dict(), "discovery": {"note": "ignored"}}))
    assert read_schema_file(f) == good
    f.write_text(json.dumps({**good.to_dict(), "classes": ["0"]}))
    with pytest.raises(DataError, match="at least 2 classes"):
        read_schema_file(f)
    f.write_text("{")
    with pytest.raises(DataError, match="not valid JSON"):
        read_schema_file(f)
    with pytest.raises(DataError, match="schema file not found"):
        read_schema_file(tmp_path / "none.json")


@pytest.mark.parametrize("argv, message", [
    (["--schema", "discover", "--csv", "x.csv", "--label", "y"], "give one or the other"),
    (["--schema", "s.json", "--label", "y"], "--label: --schema s.json already says it"),
    (["--dataset", "car", "--min-category-rows", "3"], "--min-category-rows applies only to --schema discover"),
    (["--schema", "discover", "--min-category-rows", "0"], "--min-category-rows must be an integer >= 1"),
    (["--schema", "discover", "--export", "out"], "--export writes one job folder"),
])
def test_job_script_schema_options(tmp_path, argv, message, capsys):
    job = importlib.import_module("treeflare.jobs.icdta4fl")
    with pytest.raises(SystemExit) as exit_:
        job.main([*argv, "--sites", "2", "--workspace", str(tmp_path / "ws")])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_schema_defaults_to_discover_on_poc_and_prod_only():
    import argparse

    from treeflare.cli import schema_source

    def ns(**kw):
        return argparse.Namespace(**{"dataset": None, "csv": None, "schema": None, "env": "sim", **kw})

    assert schema_source(ns()) == "data"  # the simulator keeps today's behaviour
    assert schema_source(ns(env="poc")) == "discover" and schema_source(ns(env="prod")) == "discover"
    assert schema_source(ns(env="poc", dataset="car")) == "data"
    assert schema_source(ns(schema="discover")) == "discover" and schema_source(ns(schema="f.json")) == "file"
