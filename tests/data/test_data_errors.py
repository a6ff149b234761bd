"""Every bad input the data layer knows of gets a DataError naming the file/column/line or site/field, and nothing is
half-written."""

import argparse
import hashlib
import json

import numpy as np
import pandas as pd
import pytest

from treeflare import cli
from treeflare.data import (DataError, Feature, Schema, Table, load_csv, load_dataset, prepare_federation,
                            read_partition, read_site, write_federation)
from treeflare.data import federation as federation_module
from treeflare.data.errors import where
from treeflare.data.partition import vertical_columns


def numeric_csv(n=30, bad_row=None, bad_value="abc"):
    lines = ["x,z,y"]
    for i in range(n):
        x = bad_value if i == bad_row else str(i * 0.5)
        lines.append(f"{x},{i % 3},{'pos' if i % 2 else 'neg'}")
    return "\n".join(lines) + "\n"


def test_where_renders_locations():
    assert where("a.csv", "age", 17, "site-2") == "site-2: a.csv, column 'age', line 17"
    assert where("a.csv", "age", 3) == "a.csv, column 'age', line 3"
    assert where(site="site-1") == "site-1"


# -- files ----------------------------------------------------------------------------------------
def test_missing_file(tmp_path):
    path = tmp_path / "nope.csv"
    with pytest.raises(DataError, match="file not found") as e:
        load_csv(path, label="y")
    assert str(path) in str(e.value)


@pytest.mark.parametrize("text,what", [("", "file is empty"), ("\n\n  \n", "file is empty"),
                                       ("x,y\n", "no data rows")])
def test_empty_file(make_csv, text, what):
    path = make_csv(text, "empty.csv")
    with pytest.raises(DataError, match=what) as e:
        load_csv(path, label="y")
    assert str(path) in str(e.value)


def test_ragged_row(make_csv):
    path = make_csv("x,y\n1,a\n2,b,extra\n")
    with pytest.raises(DataError, match="cannot parse as CSV") as e:
        load_csv(path, label="y")
    assert str(path) in str(e.value) and "line 3" in str(e.value)


# -- columns and labels ---------------------------------------------------------------------------
def test_missing_label_column(make_csv):
    path = make_csv("a,b\n1,2\n3,4\n")
    with pytest.raises(DataError) as e:
        load_csv(path, label="target")
    msg = str(e.value)
    assert str(path) in msg and "'target'" in msg and "not found" in msg and "['a', 'b']" in msg


def test_missing_id_column(make_csv):
    path = make_csv("a,y\n1,p\n3,n\n")
    with pytest.raises(DataError, match=r"id column 'uid' not found"):
        load_csv(path, label="y", id_column="uid")


def test_label_with_one_class(make_csv):
    path = make_csv("a,y\n1,yes\n2,yes\n3, yes\n")
    with pytest.raises(DataError, match=r"single class 'yes'") as e:
        load_csv(path, label="y")
    assert str(path) in str(e.value) and "'y'" in str(e.value)


def test_label_with_one_class_after_selection():
    car = load_dataset("car")
    only = car.subset(np.flatnonzero(car.y == "unacc"))
    with pytest.raises(DataError, match="single class"):
        prepare_federation(only, 2, "iid", None, seed=0)


def test_missing_label_value(make_csv):
    path = make_csv("a,y\n1,p\n2,\n3,n\n")
    with pytest.raises(DataError, match=r"column 'y', line 3: missing label") as e:
        load_csv(path, label="y")
    assert str(path) in str(e.value)


def test_mostly_numeric_column_with_a_typo(make_csv):
    path = make_csv(numeric_csv(bad_row=6, bad_value="1;5"))
    with pytest.raises(DataError) as e:
        load_csv(path, label="y")
    msg = str(e.value)
    assert str(path) in msg and "column 'x'" in msg and "line 8" in msg and "'1;5'" in msg
    assert "--categorical x" in msg
    # ... and the way out the message offers works
    t = load_csv(path, label="y", categorical=["x"])
    assert t.schema.feature("x").kind == "categorical"


def test_unknown_categorical_column(make_csv):
    path = make_csv(numeric_csv())
    with pytest.raises(DataError) as e:
        load_csv(path, label="y", categorical=["x", "colour"])
    msg = str(e.value)
    assert str(path) in msg and "--categorical column 'colour'" in msg and "['x', 'z']" in msg
    with pytest.raises(DataError, match="--categorical column 'y'"):  # the label is no feature
        load_csv(path, label="y", categorical=["y"])


def test_duplicate_ids(make_csv):
    path = make_csv("uid,a,y\nu1,1,p\nu2,2,n\nu3,3,p\nu2,4,n\n")
    with pytest.raises(DataError) as e:
        load_csv(path, label="y", id_column="uid")
    msg = str(e.value)
    assert str(path) in msg and "column 'uid'" in msg and "line 5" in msg and "duplicate id 'u2'" in msg


def test_duplicate_ids_in_vertical_mode():
    schema = Schema((Feature("a", "numeric"), Feature("b", "numeric")), "y", ("0", "1"), id_column="uid")
    n = 50
    frame = pd.DataFrame({"a": np.arange(n, dtype=float), "b": np.ones(n)})
    ids = np.array([f"u{i % 40}" for i in range(n)], dtype=object)
    t = Table(frame, np.array(["0", "1"] * (n // 2), dtype=object), schema, ids)
    with pytest.raises(DataError, match=r"id column 'uid' has duplicate ids"):
        prepare_federation(t, 2, vertical=True, n_passive=1, seed=0)


def test_vertical_without_id_column_gets_row_ids():
    fed = prepare_federation(load_dataset("car"), 2, vertical=True, n_passive=1)
    active, passive = fed.sites["site-1"].train, fed.sites["site-2"].train
    assert fed.schema.id_column == "row_id"
    assert list(active.ids) == list(passive.ids) and len(set(active.ids)) == len(active)


def test_vertical_generated_id_name_clash():
    table = load_dataset("car")
    with pytest.raises(DataError, match="cannot add id column 'buying'"):
        table.with_row_ids("buying")


@pytest.mark.parametrize("n_passive,match", [(0, "--passive must be a positive integer"),
                                             (3, "--passive 3: 3 feature columns")])
def test_vertical_bad_passive(n_passive, match):
    with pytest.raises(DataError, match=match):
        vertical_columns(["a", "b", "c"], n_passive)


# -- partition arguments --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def car():
    return load_dataset("car")


def test_more_sites_than_rows(make_csv):
    t = load_csv(make_csv("a,y\n1,p\n2,n\n3,p\n4,n\n5,p\n"), label="y")
    with pytest.raises(DataError, match=r"--sites 5 is more than the 4 rows"):
        prepare_federation(t, 5, "iid", None, seed=0)


@pytest.mark.parametrize("kind", ["quantity", "label"])
@pytest.mark.parametrize("alpha", [0, -1.0, float("nan"), float("inf"), None])
def test_alpha_must_be_positive(car, kind, alpha):
    with pytest.raises(DataError, match=rf"--alpha must be a positive number for the '{kind}' partition"):
        prepare_federation(car, 3, kind, alpha, seed=0)


def test_iid_ignores_alpha(car):
    assert len(prepare_federation(car, 3, "iid", None, seed=0).sites) == 3


@pytest.mark.parametrize("sites,kind,match", [(0, "iid", "--sites must be a positive integer"),
                                              (3, "dirichlet", "--partition must be one of")])
def test_bad_sites_or_kind(car, sites, kind, match):
    with pytest.raises(DataError, match=match):
        prepare_federation(car, sites, kind, 0.5, seed=0)


def test_unknown_dataset_or_part():
    with pytest.raises(DataError, match=r"unknown dataset 'iris'.*--csv"):
        load_dataset("iris")
    with pytest.raises(DataError, match="'car' has no separate test file"):
        load_dataset("car", "test")


def test_embedded_file_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("TREEFLARE_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError, match=r"car\.data\.gz: embedded dataset file not found"):
        load_dataset("car")


# -- site files read against the federation's schema ----------------------------------------------
@pytest.fixture
def fed_dir(tmp_path, make_csv):
    table = load_csv(make_csv(numeric_csv(n=120)), label="y")
    return write_federation(prepare_federation(table, 3, "iid", None, seed=0), tmp_path / "fed")


def edit_site(root, site, fn, name="train.csv"):
    path = root / site / name
    lines = path.read_text().splitlines()
    path.write_text("\n".join(fn(lines)) + "\n")
    return path


def test_site_file_non_numeric_value(fed_dir):
    def corrupt(lines):
        cells = lines[3].split(",")
        cells[0] = "twelve"
        lines[3] = ",".join(cells)
        return lines
    edit_site(fed_dir, "site-2", corrupt)
    with pytest.raises(DataError) as e:
        read_site(fed_dir, "site-2")
    msg = str(e.value)
    assert msg.startswith("site-2: ") and "train.csv" in msg and "column 'x'" in msg and "line 4" in msg
    assert "'twelve' is not a number" in msg
    read_site(fed_dir, "site-1")  # the other sites are fine


def test_site_file_with_an_extra_column(fed_dir):
    edit_site(fed_dir, "site-1", lambda ls: [ls[0] + ",extra"] + [l + ",0" for l in ls[1:]])
    with pytest.raises(DataError) as e:
        read_site(fed_dir, "site-1")
    msg = str(e.value)
    assert "site-1" in msg and "train.csv" in msg and "unexpected column(s) ['extra']" in msg and "disagree" in msg


def test_site_file_with_a_missing_column(fed_dir):
    def drop_z(lines):
        return [",".join(c for i, c in enumerate(l.split(",")) if i != 1) for l in lines]
    edit_site(fed_dir, "site-3", drop_z, "test.csv")
    with pytest.raises(DataError) as e:
        read_site(fed_dir, "site-3")
    msg = str(e.value)
    assert "site-3" in msg and "test.csv" in msg and "missing column(s) ['z']" in msg


def test_site_file_with_an_unknown_class(fed_dir):
    def relabel(lines):
        lines[5] = lines[5].rsplit(",", 1)[0] + ",maybe"
        return lines
    edit_site(fed_dir, "site-1", relabel)
    with pytest.raises(DataError) as e:
        read_site(fed_dir, "site-1")
    msg = str(e.value)
    assert "site-1" in msg and "column 'y'" in msg and "line 6" in msg and "unknown class 'maybe'" in msg
    assert "['neg', 'pos']" in msg


def test_site_unknown_or_partition_missing(fed_dir, tmp_path):
    with pytest.raises(DataError, match=r"no site 'site-9'"):
        read_site(fed_dir, "site-9")
    with pytest.raises(DataError, match=r"partition\.json: not found"):
        read_partition(tmp_path / "elsewhere")
    (fed_dir / "partition.json").write_text("{not json")
    with pytest.raises(DataError, match=r"partition\.json: not valid JSON"):
        read_partition(fed_dir)


def test_schema_from_bad_json():
    with pytest.raises(DataError, match="unsupported version"):
        Schema.from_dict({"version": 99})
    with pytest.raises(DataError, match=r"features\[0\]\.name must be a string, got NoneType"):
        Schema.from_dict({"version": 1, "features": [{"kind": "numeric"}], "label": "y", "classes": []})


# -- nothing is half-written ----------------------------------------------------------------------
def digest(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_refuses_a_folder_it_did_not_write_even_with_overwrite(car, tmp_path):
    out = tmp_path / "fed"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    fed = prepare_federation(car, 2, "iid", None, seed=0)
    for overwrite in (False, True):
        with pytest.raises(DataError, match=r"was not written by treeflare .*left as it is") as e:
            write_federation(fed, out, overwrite=overwrite)
        assert str(out) in str(e.value)
        assert digest(out) == {"notes.txt": hashlib.sha256(b"mine").hexdigest()}
        assert sorted(p.name for p in tmp_path.iterdir()) == ["fed"]


def test_replaces_its_own_folder_only_with_overwrite(car, tmp_path):
    out = write_federation(prepare_federation(car, 2, "iid", None, seed=0), tmp_path / "fed")
    before = digest(out)
    with pytest.raises(DataError, match=r"already exists and is not empty.*--overwrite"):
        write_federation(prepare_federation(car, 3, "iid", None, seed=0), out)
    assert digest(out) == before
    write_federation(prepare_federation(car, 3, "iid", None, seed=0), out, overwrite=True)
    assert read_partition(out)["n_sites"] == 3 and not (out / "site-3").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fed"]


def test_out_is_a_file(car, tmp_path):
    out = tmp_path / "fed"
    out.write_text("x")
    with pytest.raises(DataError, match="not a folder"):
        write_federation(prepare_federation(car, 2, "iid", None, seed=0), out)
    assert out.read_text() == "x"


def test_empty_out_folder_is_used(car, tmp_path):
    out = tmp_path / "fed"
    out.mkdir()
    write_federation(prepare_federation(car, 2, "iid", None, seed=0), out)
    assert (out / "site-2" / "test.csv").is_file()


class Boom(RuntimeError):
    pass


def fail_on_call(monkeypatch, n):
    """Make the n-th DataFrame.to_csv call (one per file) raise, after the earlier files were written."""
    real = pd.DataFrame.to_csv
    calls = {"n": 0}

    def to_csv(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == n:
            raise Boom("disk full")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_csv", to_csv)
    return calls


def test_failure_mid_write_leaves_no_partial_folder(car, tmp_path, monkeypatch):
    fed = prepare_federation(car, 3, "iid", None, seed=0)
    calls = fail_on_call(monkeypatch, 4)  # server/test.csv, site-1 train+test written, then fail
    with pytest.raises(Boom):
        write_federation(fed, tmp_path / "fed")
    assert calls["n"] == 4
    assert list(tmp_path.iterdir()) == []


def test_failure_mid_write_keeps_existing_federation(car, tmp_path, monkeypatch):
    out = write_federation(prepare_federation(car, 2, "iid", None, seed=0), tmp_path / "fed")
    before = digest(out)
    monkeypatch.setattr(federation_module.json, "dumps", lambda *a, **k: (_ for _ in ()).throw(Boom("late")))
    with pytest.raises(Boom):  # every CSV written, then partition.json fails
        write_federation(prepare_federation(car, 4, "label", 0.5, seed=1), out, overwrite=True)
    assert digest(out) == before
    assert json.loads((out / "partition.json").read_text())["n_sites"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fed"]


# -- command-line pieces --------------------------------------------------------------------------
def parse(argv, **kw):
    p = argparse.ArgumentParser()
    cli.add_data_args(p, **kw)
    cli.add_partition_args(p)
    return p.parse_args(argv)


@pytest.mark.parametrize("argv,match", [
    ([], "give --dataset NAME"),
    (["--dataset", "car", "--csv", "x.csv"], "either --dataset or --csv, not both"),
    (["--csv", "x.csv"], "--label COL is required"),
    (["--dataset", "car", "--label", "class"], "--label applies only to --csv"),
    (["--dataset", "car", "--categorical", "a", "--id", "k"], "--categorical, --id apply only to --csv"),
    (["--dataset", "iris"], "unknown dataset 'iris'"),
])
def test_load_table_validates_the_combination(argv, match):
    with pytest.raises(DataError, match=match):
        cli.load_table(parse(argv))


def test_load_table_csv_and_default_dataset(make_csv):
    path = make_csv("k,c,n,y\nr1,1,2.5,a\nr2,2,3.5,b\nr3,1,,a\n")
    t = cli.load_table(parse(["--csv", str(path), "--label", "y", "--categorical", " c, ,", "--id", "k"]))
    assert t.schema.kinds == ["categorical", "numeric"] and t.schema.id_column == "k"
    assert cli.parse_categorical("a, b,,c ") == ["a", "b", "c"] and cli.parse_categorical(None) == []
    assert cli.load_table(parse([], default_dataset="car")).name == "car"
    args = parse([])
    assert (args.sites, args.partition, args.alpha, args.seed) == (5, "iid", 0.5, 0)


def test_main_guard_exits_2_with_a_message(capsys):
    @cli.main_guard
    def bad_data():
        raise DataError("data.csv, column 'x', line 3: 'abc' is not a number")

    @cli.main_guard
    def bad_path():
        open("/nonexistent/dir/file.csv")

    @cli.main_guard
    def fine(v):
        return v

    with pytest.raises(SystemExit) as e:
        bad_data()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: data.csv, column 'x', line 3: 'abc' is not a number\n"
    with pytest.raises(SystemExit) as e:
        bad_path()
    assert e.value.code == 2
    assert capsys.readouterr().err.startswith("error: /nonexistent/dir/file.csv: No such file")
    assert fine(7) == 7
    with pytest.raises(KeyError):  # a bug is not dressed up as bad input
        cli.main_guard(lambda: {}["x"])()
