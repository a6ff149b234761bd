"""Ordinal features (the data layer): a third feature kind with ordered levels. Codes follow
the declared order, the one-hot matrix keeps an ordinal column as one numeric column of its codes, a value that
is not a level is refused with its column and line, and the schema travels as JSON."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from data_helpers import set_cell
from treeflare import cli
from treeflare.data import (DataError, Feature, Schema, load_csv, load_dataset, prepare_federation, read_site,
                            write_federation)

SIZE = ("S", "M", "L", "XL")
CSV = "size,weight,colour,y\n" + "".join(
    f"{SIZE[i % 4]},{i * 1.5},{'red' if i % 3 else 'blue'},{'big' if i % 4 >= 2 else 'small'}\n" for i in range(40))


def _table(make_csv, text=CSV, **kw):
    return load_csv(make_csv(text), label="y", ordinal={"size": list(SIZE)}, **kw)


# -- the schema ----------------------------------------------------------------------------------------
def test_feature_checks():
    assert Feature("s", "ordinal", ("lo", "hi")).categories == ("lo", "hi")
    with pytest.raises(DataError, match="needs its ordered levels"):
        Feature("s", "ordinal")
    with pytest.raises(DataError, match="duplicate categories"):
        Feature("s", "ordinal", ("lo", "hi", "lo"))
    with pytest.raises(DataError, match="has no categories"):
        Feature("x", "numeric", ("a",))
    with pytest.raises(DataError, match="kind must be one of"):
        Feature("x", "interval")


def test_schema_json_round_trip_keeps_the_order():
    schema = Schema((Feature("size", "ordinal", SIZE), Feature("w", "numeric"),
                     Feature("c", "categorical", ("blue", "red"))), "y", ("big", "small"))
    d = schema.to_dict()
    assert d["features"][0] == {"name": "size", "kind": "ordinal", "categories": ["S", "M", "L", "XL"]}
    assert Schema.from_dict(d) == schema
    assert schema.ordinal == ["size"] and schema.categorical == ["c"] and schema.numeric == ["w"]
    assert schema.onehot_names() == ["size", "w", "c=blue", "c=red"]
    d["features"][0]["categories"] = "SMLXL"
    with pytest.raises(DataError, match="categories must be a list"):
        Schema.from_dict(d)
    d["features"][0]["categories"] = []
    with pytest.raises(DataError, match="ordered levels"):
        Schema.from_dict(d)


# -- encodings -----------------------------------------------------------------------------------------
def test_codes_follow_the_declared_order_and_onehot_keeps_one_column(make_csv):
    t = _table(make_csv, CSV + "?,1,red,big\n")
    X, names, kinds = t.codes()
    assert kinds == ["ordinal", "numeric", "categorical"]
    assert X[:5, 0].tolist() == [0, 1, 2, 3, 0]  # S M L XL, not alphabetical (L M S XL)
    assert np.isnan(X[-1, 0])  # missing stays missing
    H, onehot_names = t.onehot()
    assert onehot_names == ["size", "weight", "colour=blue", "colour=red"] and H.shape == (41, 4)
    assert np.array_equal(H[:, 0], X[:, 0], equal_nan=True)


def test_value_that_is_not_a_level_is_refused(make_csv):
    path = make_csv(CSV.replace("\nXL,", "\nXXL,", 1))
    with pytest.raises(DataError) as e:
        load_csv(path, label="y", ordinal={"size": list(SIZE)})
    assert (e.value.column, e.value.line) == ("size", 5)
    assert "'XXL' is not one of the levels S < M < L < XL of ordinal column 'size'" in str(e.value)
    assert "XXL" not in e.value.redacted()


def test_site_file_with_an_unknown_level(make_csv, tmp_path):
    root = write_federation(prepare_federation(_table(make_csv), 2, seed=0), tmp_path / "fed")
    assert read_site(root, "site-1").train.schema.feature("size").categories == SIZE
    set_cell(root / "site-2" / "test.csv", 2, 0, "XXL")
    with pytest.raises(DataError) as e:
        read_site(root, "site-2")
    assert e.value.redacted() == "site-2: test.csv, column 'size', line 2: value is not a level of the ordinal column"


def test_consumers_see_an_ordered_number(make_csv):
    """XGBoost declares it a quantitative feature; CART's one-hot input holds its codes in one column."""
    from treeflare.icdta4fl.encoding import encode, feature_space
    from treeflare.xgb.encoding import feature_types, table_arrays

    t = _table(make_csv)
    assert feature_types(t.schema) == ["q", "q", "c"]
    arrays = table_arrays(t)
    assert arrays.X.dtype == np.float32 and arrays.X[:4, 0].tolist() == [0, 1, 2, 3]
    names, kinds, _ = feature_space(t.schema, "cart")
    assert names[0] == "size" and kinds[0] == "numeric" and encode(t, "cart").shape == (40, 4)


# -- the command line ----------------------------------------------------------------------------------
def test_parse_ordinal():
    assert cli.parse_ordinal(["size=S<M<L", " grade = 1 < 2 < 3 "]) == {"size": ["S", "M", "L"],
                                                                        "grade": ["1", "2", "3"]}
    assert cli.parse_ordinal(None) == {}
    for spec, match in [("size", "expected COL=low"), ("=a<b", "expected COL=low"), ("s=a<<b", "give its levels"),
                        ("s=a<b<a", "listed twice"), ("s=lo<NA<hi", "reads as a missing value")]:
        with pytest.raises(DataError, match=match):
            cli.parse_ordinal([spec])
    with pytest.raises(DataError, match="given twice"):
        cli.parse_ordinal(["s=a<b", "s=b<c"])


def _args(argv):
    p = argparse.ArgumentParser()
    cli.add_data_args(p)
    return p.parse_args(argv)


def test_ordinal_option_loads_a_csv(make_csv):
    t = cli.load_table(_args(["--csv", str(make_csv(CSV)), "--label", "y", "--ordinal", "size=S<M<L<XL"]))
    assert t.schema.feature("size") == Feature("size", "ordinal", SIZE)


@pytest.mark.parametrize("extra, match", [
    (["--ordinal", "nope=a<b"], "--ordinal column 'nope' is not a feature column"),
    (["--ordinal", "y=big<small"], "--ordinal column 'y' is not a feature column"),
    (["--ordinal", "colour=blue<red", "--categorical", "colour"], "both as --categorical and as --ordinal"),
    (["--ordinal", "size=S<M<L"], r"column 'size': 10 cells are not among the levels S < M < L of ordinal column "
                                  r"'size' \(lines 5, 9, 13, 17, 21 and 5 more; the first is 'XL'\)"),
])
def test_ordinal_option_errors(make_csv, extra, match):
    with pytest.raises(DataError, match=match):
        cli.load_table(_args(["--csv", str(make_csv(CSV)), "--label", "y", *extra]))


def test_ordinal_applies_only_to_csv():
    with pytest.raises(DataError, match="--ordinal applies only to --csv"):
        cli.load_table(_args(["--dataset", "car", "--ordinal", "safety=low<high"]))


def test_embedded_car_federation_keeps_the_ordinal_schema(tmp_path):
    car = load_dataset("car")
    root = write_federation(prepare_federation(car, 3, "iid", None, seed=0), tmp_path / "fed")
    site = read_site(root, "site-2")
    assert site.train.schema == car.schema
    assert site.train.codes()[2] == ["ordinal"] * 6
