"""The CSV separator: detected from a file's first records (the UCI Bank Marketing file is published with ';'),
or given with --sep; one data layer reads every file this way (your own CSV, site files, a site's bound files,
rows to predict). A header read as one column holding ';' or a tab says so in the error. Synthetic files only."""

from __future__ import annotations

import importlib

import json

import pytest


from treeflare.data import DataError, load_csv, read_site_csv
from treeflare.data import separators
from treeflare.data.csv_io import frame_to_table, read_header, read_raw
from treeflare.data.separators import check_separator, detect_separator

# as the UCI file is published: every string quoted, ';' between fields, "unknown" as a category, a few empty cells
BANK = '''"age";"job";"marital";"balance";"housing";"y"
30;"unemployed";"married";1787;"no";"no"
33;"services";"married";4789;"yes";"no"
35;"management";"single";1350;"yes";"no"
30;"unknown";"married";;"yes";"yes"
59;"blue-collar";"";0;"yes";"no"
35;"management";"single";747;"no";"yes"
36;"self-employed";"married";307;"yes";"no"
39;"technician";"unknown";147;"yes";"yes"
'''
TAB = "age\tcity\tscore\ty\n30\tNew York, NY\t1.5\tno\n41\tParis; FR\t\tyes\n25\tOslo\t2\tno\n"
# a comma file whose quoted values hold ';' (more of them than commas): it stays comma-separated
COMMA = 'a,note,y\n1,"x;y;z;w",no\n2,"p;q;r;s",yes\n3,"",no\n'


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_semicolon_file_with_quotes_and_missing_values(tmp_path):
    path = write(tmp_path, "bank.csv", BANK)
    assert detect_separator(path) == ";"
    table = load_csv(path, label="y")
    kinds = {f.name: f.kind for f in table.schema.features}
    assert kinds == {"age": "numeric", "job": "categorical", "marital": "categorical", "balance": "numeric",
                     "housing": "categorical"}
    assert table.schema.classes == ("no", "yes")
    assert "unknown" in table.schema.feature("job").categories  # a category, as the file means it
    assert int(table.frame["balance"].isna().sum()) == 1 and int(table.frame["marital"].isna().sum()) == 1
    assert list(table.frame["job"][:2]) == ["unemployed", "services"]  # the quotes are the CSV's, not the value's
    assert load_csv(path, label="y", sep=";").schema == table.schema


def test_tab_file_and_comma_file_with_semicolons_in_quotes(tmp_path):
    tab = write(tmp_path, "t.tsv", TAB)
    assert detect_separator(tab) == "\t"
    raw = read_raw(tab)
    assert list(raw.columns) == ["age", "city", "score", "y"] and list(raw["city"]) == ["New York, NY", "Paris; FR",
                                                                                       "Oslo"]
    comma = write(tmp_path, "c.csv", COMMA)
    assert detect_separator(comma) == ","
    assert list(read_raw(comma)["note"]) == ["x;y;z;w", "p;q;r;s", ""]
    assert read_header(tab) == ["age", "city", "score", "y"] and read_header(comma) == ["a", "note", "y"]


def test_one_column_file_is_read_as_one_column(tmp_path):
    path = write(tmp_path, "one.csv", "y\nno\nyes\nno\n")
    assert detect_separator(path) == ","
    assert list(read_raw(path).columns) == ["y"]
    with pytest.raises(DataError, match="no feature columns besides the label"):
        load_csv(path, label="y")


def test_detection_reads_whole_records_only(tmp_path, monkeypatch):
    # a sample that ends inside a record must not count that record's fields
    path = write(tmp_path, "bank.csv", BANK)
    monkeypatch.setattr(separators, "_SNIFF_CHARS", len(BANK.splitlines()[0]) + 20)
    assert detect_separator(path) == ";"


def test_wrong_separator_says_so(tmp_path):
    """--sep ',' on the semicolon file: the header is one column; the error names the separator it holds."""
    path = write(tmp_path, "bank.csv", BANK)
    with pytest.raises(DataError) as e:
        load_csv(path, label="y", sep=",")
    text = str(e.value)
    assert "label column 'y' not found" in text
    assert "the header is one column holding ';': is the file semicolon-separated? use --sep ';'" in text
    tab = write(tmp_path, "t.tsv", TAB)
    with pytest.raises(DataError, match=r"holding '\\t': is the file tab-separated\? use --sep '\\t'"):
        load_csv(tab, label="y", sep=",")
    # what a site sends the server: the hint, never a cell value or a path
    schema = load_csv(path, label="y").schema
    with pytest.raises(DataError) as e:
        frame_to_table(read_raw(path, sep=","), schema, file=str(path), site="site-1")
    problem = e.value.problem
    assert "is the file semicolon-separated? use --sep ';'" in problem
    assert "unemployed" not in problem and str(tmp_path) not in problem


@pytest.mark.parametrize("text,sep", [(None, None), ("auto", None), (";", ";"), ("\\t", "\t"), ("tab", "\t"),
                                      ("|", "|"), (",", ",")])
def test_sep_values(text, sep):
    assert check_separator(text) == sep


@pytest.mark.parametrize("text", ["", ";;", '"', "a", "1", " ", "\n"])
def test_bad_sep_is_refused(text):
    with pytest.raises(DataError, match="give one separator character"):
        check_separator(text)


def test_site_files_and_a_sites_bound_file(tmp_path):
    """The site's own data path: a bound semicolon file and a semicolon site file read as the comma ones."""
    from treeflare.flare.site_config import SiteBinding

    path = write(tmp_path, "train.csv", BANK)
    schema = load_csv(path, label="y").schema
    site = read_site_csv(path, schema, site="site-1")
    assert len(site.frame) == 8 and list(site.y[:2]) == ["no", "no"]
    bound = SiteBinding(data_dir=tmp_path, label_column="y").read("train", schema, "site-1")
    assert list(bound.frame.columns) == schema.feature_names and len(bound.frame) == 8


@pytest.fixture(scope="module")
def prepare():
    return importlib.import_module("treeflare.tools.prepare_data")


def test_prepare_data_reads_a_semicolon_file(prepare, tmp_path, capsys):
    path = write(tmp_path, "bank.csv", BANK * 1)
    assert prepare.main(["--csv", str(path), "--label", "y", "--sites", "2", "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "partition.json").read_text())
    assert [f["name"] for f in summary["schema"]["features"]] == ["age", "job", "marital", "balance", "housing"]
    # the files it writes are comma-separated, whatever the input was
    assert (tmp_path / "out" / "site-1" / "train.csv").read_text().splitlines()[0] == "age,job,marital,balance,housing,y"
    assert prepare.main(["--csv", str(path), "--label", "y", "--sep", ";", "--sites", "2",
                         "--out", str(tmp_path / "out2")]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        prepare.main(["--csv", str(path), "--label", "y", "--sep", ",", "--out", str(tmp_path / "o3")])
    assert e.value.code == 2
    assert "use --sep ';'" in capsys.readouterr().err and not (tmp_path / "o3").exists()
    with pytest.raises(SystemExit):
        prepare.main(["--dataset", "car", "--sep", ";", "--out", str(tmp_path / "o4")])
    assert "--sep applies only to --csv" in capsys.readouterr().err


def test_rows_to_predict_read_with_their_separator(tmp_path):
    """scripts/predict.py's reader: the same new rows, semicolon- or comma-separated, get the same predictions."""
    xgb = pytest.importorskip("xgboost")
    from treeflare.prediction import predict_csv
    from treeflare.xgb.encoding import dmatrix, table_arrays
    from treeflare.xgb.model import attach_schema
    from treeflare.xgb.params import make_params

    table = load_csv(write(tmp_path, "bank.csv", BANK), label="y")
    booster = xgb.train(make_params(2, max_depth=2), dmatrix(table_arrays(table)), 3)
    attach_schema(booster, table.schema, "horizontal", None)
    booster.save_model(str(tmp_path / "model.json"))
    semi = write(tmp_path, "new_semi.csv", BANK)
    comma = write(tmp_path, "new_comma.csv", read_raw(semi).to_csv(index=False))
    assert detect_separator(comma) == ","
    a = predict_csv(tmp_path / "model.json", semi, tmp_path / "a.csv")
    b = predict_csv(tmp_path / "model.json", comma, tmp_path / "b.csv")
    assert a["rows"] == b["rows"] == 8
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()


def test_sep_without_csv_is_refused():
    """--sep with the sites' data (--schema discover/FILE) would do nothing: each site detects its own files'."""
    import argparse

    from treeflare.cli import schema_source

    for schema in ("discover", "schema.json"):
        args = argparse.Namespace(schema=schema, dataset=None, csv=None, sep=";", env="poc")
        with pytest.raises(DataError, match="--sep applies only to --csv"):
            schema_source(args)
    assert schema_source(argparse.Namespace(schema=None, dataset=None, csv="a.csv", sep=";", env="sim")) == "data"
