"""CSV files the loader used to misread, or fail on with a traceback. Each is now read
correctly or refused with a DataError naming the file, column and line."""

from __future__ import annotations

import importlib

import pytest

from data_helpers import set_cell
from treeflare.data import DataError, load_csv, prepare_federation, read_site, write_federation


# -- item 7: labels that are the same number are one class ------------------------------------------
def test_labels_1_and_1_0_are_one_class(make_csv):
    t = load_csv(make_csv("x,y\n1,1\n2,1.0\n3,0\n4, 1 \n5,2.50\n6,2.5\n"), label="y")
    assert t.schema.classes == ("0", "1", "2.5")
    assert list(t.y) == ["1", "1", "0", "1", "2.5", "2.5"]


def test_numeric_labels_mixed_with_names(make_csv):
    t = load_csv(make_csv("x,y\n1,1\n2,1.0\n3,yes\n4,yes\n"), label="y")
    assert t.schema.classes == ("1", "yes")


def test_site_file_writing_1_0_reads_as_class_1(make_csv, tmp_path):
    t = load_csv(make_csv("x,y\n" + "".join(f"{i},{i % 2}\n" for i in range(40))), label="y")
    root = write_federation(prepare_federation(t, 2, seed=0), tmp_path / "fed")
    path = root / "site-1" / "train.csv"
    path.write_text(path.read_text().replace(",1\n", ",1.0\n"))
    assert set(read_site(root, "site-1").train.y) == {"0", "1"}


# -- item 9: an infinite label ----------------------------------------------------------------------
@pytest.mark.parametrize("cell", ["inf", "-Infinity", "1e999"])
def test_infinite_label_is_refused(make_csv, cell):
    path = make_csv(f"x,y\n1,0\n2,1\n3,{cell}\n")
    with pytest.raises(DataError) as e:
        load_csv(path, label="y")
    assert (e.value.column, e.value.line) == ("y", 4)
    assert "not a finite number" in str(e.value) and str(path) in str(e.value)


# -- item 8: duplicate column names ---------------------------------------------------------------
@pytest.mark.parametrize("header, second", [("x,x,y", 2), ("x, x,y", 2), ("x,y,x ", 3), ('"x",x,y', 2)])
def test_duplicate_column_names_are_refused(make_csv, header, second):
    path = make_csv(f"{header}\n1,2,a\n2,3,b\n")
    with pytest.raises(DataError) as e:
        load_csv(path, label="y")
    assert (e.value.column, e.value.line) == ("x", 1)
    assert f"duplicate column name (columns 1 and {second})" in str(e.value) and str(path) in str(e.value)


def test_pandas_style_suffix_is_just_a_name(make_csv):
    t = load_csv(make_csv("x,x.1,y\n1,2,a\n2,3,b\n"), label="y")  # a real column called x.1 is fine
    assert t.schema.feature_names == ["x", "x.1"]


def test_nameless_column_is_refused(make_csv):
    with pytest.raises(DataError, match="column 2 of the header has no name"):
        load_csv(make_csv("x,,y\n1,2,a\n2,3,b\n"), label="y")


def test_site_file_with_a_duplicated_column(make_csv, tmp_path):
    t = load_csv(make_csv("x,z,y\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40))), label="y")
    root = write_federation(prepare_federation(t, 2, seed=0), tmp_path / "fed")
    path = root / "site-2" / "test.csv"
    path.write_text(path.read_text().replace("x,z,y", "x,x,y", 1))
    with pytest.raises(DataError) as e:
        read_site(root, "site-2")
    assert e.value.redacted() == "test.csv, column 'x', line 1: duplicate column name"


# -- item 13: names are read by the CSV reader everywhere -------------------------------------------
def test_vertical_split_with_a_comma_in_the_label_name(make_csv, tmp_path):
    rows = "".join(f"{i},{i * 2},{i % 3},{'ja' if i % 2 else 'nein'}\n" for i in range(60))
    t = load_csv(make_csv('id,a,"b,c","ü,y"\n' + rows), label="ü,y", id_column="id")
    root = write_federation(prepare_federation(t, 2, seed=0, vertical=True, n_passive=1), tmp_path / "fed")
    active, passive = read_site(root, "site-1"), read_site(root, "site-2")
    assert active.train.y is not None and passive.train.y is None
    assert active.train.schema.feature_names + passive.train.schema.feature_names == ["a", "b,c"]


def test_read_header_uses_the_csv_reader(make_csv):
    from treeflare.data.federation import read_site_header

    assert read_site_header(make_csv('"a,b", c ,"d""e"\n1,2,3\n')) == ["a,b", "c", 'd"e']
    with pytest.raises(DataError, match="duplicate column name"):
        read_site_header(make_csv("a,b,a\n"))


# -- item 10: numbers beyond float32 ----------------------------------------------------------------
@pytest.mark.parametrize("cell", ["1e308", "-3.5e38", "1e39"])
def test_number_beyond_float32_is_refused_at_load(make_csv, cell):
    path = make_csv(f"x,z,y\n1,1,a\n2,{cell},b\n3,3,a\n")
    with pytest.raises(DataError) as e:
        load_csv(path, label="y")
    assert (e.value.column, e.value.line) == ("z", 3)
    assert "float32" in str(e.value) and str(path) in str(e.value)
    assert e.value.redacted() == "data.csv, column 'z', line 3: number beyond the float32 range"


def test_float32_limit_itself_is_fine(make_csv):
    import numpy as np

    t = load_csv(make_csv("x,y\n3.4e38,a\n-3.4e38,b\n1e-60,a\n"), label="y")
    assert np.isfinite(t.frame["x"].to_numpy(np.float32)).all()


def test_site_file_beyond_float32_is_refused(make_csv, tmp_path):
    t = load_csv(make_csv("x,z,y\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(40))), label="y")
    root = write_federation(prepare_federation(t, 2, seed=0), tmp_path / "fed")
    set_cell(root / "site-1" / "train.csv", 3, 0, "1e300")
    with pytest.raises(DataError) as e:
        read_site(root, "site-1")
    assert (e.value.site, e.value.column, e.value.line) == ("site-1", "x", 3)


# -- item 11: a column with no values at all --------------------------------------------------------
def _with_empty_column(n=60):
    return "x,m,c,y\n" + "".join(f"{i},{'?' if i % 2 else ''},{'ab'[i % 2]},{i % 2}\n" for i in range(n))


def test_all_missing_column_is_left_out_with_a_warning(make_csv):
    from treeflare.data import DataWarning

    path = make_csv(_with_empty_column())
    with pytest.warns(DataWarning, match=r"column\(s\) \['m'\] hold no values"):
        t = load_csv(path, label="y", categorical=["m", "c"])
    assert t.schema.feature_names == ["x", "c"]


@pytest.mark.parametrize("algorithm", ["id3", "cart"])
def test_every_algorithm_trains_without_the_empty_column(make_csv, algorithm):
    import warnings

    from treeflare.icdta4fl import pipeline
    from treeflare.icdta4fl.encoding import encode, feature_space

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = load_csv(make_csv(_with_empty_column()), label="y")
    _, kinds, n_categories = feature_space(t.schema, algorithm)
    tree = pipeline.train_local_tree(encode(t, algorithm), t.y_codes(), algorithm=algorithm, n_classes=2,
                                     feature_kinds=kinds, n_categories=n_categories, params={"max_depth": 2})
    from treeflare.trees.tree import Tree

    assert Tree.from_dict(tree).n_leaves >= 2  # it learned from x and c


def test_only_empty_feature_columns_is_an_error(make_csv):
    with pytest.warns(Warning), pytest.raises(DataError, match="no feature columns"):
        load_csv(make_csv("m,y\n,a\n?,b\n"), label="y")


def test_infer_schema_refuses_an_empty_column_clearly():
    import pandas as pd

    from treeflare.data.csv_io import infer_schema

    with pytest.raises(DataError, match="column 'm': the column holds no values"):
        infer_schema(pd.DataFrame({"m": ["", "?"], "y": ["a", "b"]}), label="y", file="f.csv")


def test_cli_prints_the_warning_plainly(make_csv, tmp_path, capsys):


    mod = importlib.import_module("treeflare.tools.prepare_data")
    assert mod.main(["--csv", str(make_csv(_with_empty_column())), "--label", "y", "--sites", "2",
                     "--out", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "['m'] hold no values" in err and "Warning" not in err


# -- item 12: missing ids ---------------------------------------------------------------------------
@pytest.mark.parametrize("cell", ["", "NaN", " ", "?", "null"])
def test_missing_id_is_refused(make_csv, cell):
    path = make_csv(f"id,x,y\n1,1,a\n2,2,b\n{cell},3,a\n4,4,b\n")
    with pytest.raises(DataError) as e:
        load_csv(path, label="y", id_column="id")
    assert (e.value.column, e.value.line) == ("id", 4) and "missing id" in str(e.value)


def test_site_file_with_a_missing_id(make_csv, tmp_path):
    t = load_csv(make_csv("id,x,z,y\n" + "".join(f"r{i},{i},{i % 3},{i % 2}\n" for i in range(40))), label="y",
                 id_column="id")
    root = write_federation(prepare_federation(t, 2, seed=0, vertical=True, n_passive=1), tmp_path / "fed")
    set_cell(root / "site-2" / "train.csv", 4, 0, "")
    with pytest.raises(DataError) as e:
        read_site(root, "site-2")
    assert e.value.redacted() == "site-2: train.csv, column 'id', line 4: missing id"


def test_categorical_option_reads_quoted_names(make_csv):
    from treeflare import cli

    assert cli.parse_categorical("a, b,,c") == ["a", "b", "c"]
    assert cli.parse_categorical('"ü,y", b') == ["ü,y", "b"]
    t = load_csv(make_csv('"x,1",z,y\n1,2,a\n2,3,b\n'), label="y", categorical=cli.parse_categorical('"x,1"'))
    assert t.schema.feature("x,1").kind == "categorical" and t.schema.feature("z").kind == "numeric"
