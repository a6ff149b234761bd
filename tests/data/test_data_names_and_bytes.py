"""One-hot names that cannot collide and split back to the right column (rules, --explain); a
CSV's bad byte named by its line and real file offset (also far into a file and across a chunk boundary); a label
column that is also the id column refused wherever the two are given."""

from __future__ import annotations

import importlib

import argparse
import io
import json

import numpy as np
import pandas as pd
import pytest


from treeflare import cli
from treeflare.data import DataError, Feature, Schema, load_csv
from treeflare.data import csv_io
from treeflare.icdta4fl.export import export_text
from treeflare.icdta4fl.simplify import onehot_groups_from_names


# ------------------------------------------------------------------------------------------------ one-hot names
def colliding_schema() -> Schema:
    """Categorical ``a`` with value ``b=c`` and categorical ``a=b`` with value ``c``: both were ``a=b=c``."""
    return Schema((Feature("a", "categorical", ("b=c", "z")), Feature("a=b", "categorical", ("c", "y")),
                   Feature("p=q", "numeric"), Feature("back\\slash=", "categorical", ("v",))), "label",
                  ("no", "yes"))


def test_onehot_names_are_distinct_and_split_back_to_their_column():
    from treeflare.data.schema import onehot_name, split_onehot_name

    names = colliding_schema().onehot_names()
    assert len(set(names)) == len(names), names
    assert names[0] == "a=b=c" and names[2] == "a\\=b=c"  # names without '=' in the column part are unchanged
    assert [split_onehot_name(n) for n in names] == [("a", "b=c"), ("a", "z"), ("a=b", "c"), ("a=b", "y"),
                                                     ("p=q", None), ("back\\slash=", "v")]
    assert all(split_onehot_name(onehot_name(c, v)) == (c, v) for c, v in
               [("x", "1"), ("=", "="), ("\\", "\\="), ("a\\=b", ""), ("", "x=y")])
    # simplify's one-hot groups: each categorical column's own columns; the numeric column 'p=q' in none
    assert onehot_groups_from_names(names, ["numeric"] * len(names)) == [[0, 1], [2, 3], [5]]


def test_explain_names_the_column_that_holds_the_value(tmp_path):
    """The label follows column 'a=b' (value 'c'); column 'a' (value 'b=c') is noise. The tree's explanation
    must name 'a=b', not 'a'."""
    from test_predict import tree_model
    from treeflare.prediction import predict_csv

    rng = np.random.default_rng(0)
    n = 400
    ab = rng.choice(["c", "y"], n)
    frame = pd.DataFrame({"a": rng.choice(["b=c", "z"], n), "a=b": ab, "x": rng.normal(size=n).round(3),
                          "label": np.where(ab == "c", "yes", "no")})
    frame.to_csv(tmp_path / "train.csv", index=False)
    table = load_csv(tmp_path / "train.csv", label="label")
    model = tree_model(table, "cart", tmp_path / "global_tree.json")
    text = export_text(model)
    assert "|--- a=b = " in text and "|--- a = " not in text, text
    predict_csv(tmp_path, tmp_path / "train.csv", tmp_path / "p.csv", explain=True)
    out = pd.read_csv(tmp_path / "p.csv", dtype=str)
    said = dict(zip(frame["a=b"], out["explanation"]))
    assert said["c"] in ("a=b = c", "a=b != y") and said["y"] in ("a=b = y", "a=b != c"), said
    assert (out["predicted"] == frame["label"]).all()


# ------------------------------------------------------------------------------------------------ bad bytes
def test_bad_byte_far_into_a_file_names_its_line_and_offset(tmp_path):
    head = "x,z,y\n" + "".join(f"{i},{i % 7},{'ab'[i % 2]}\n" for i in range(500_000))
    assert len(head) > 5_000_000
    path = tmp_path / "big.csv"
    path.write_bytes(head.encode() + b"1,\xff,a\n" + b"2,3,b\n")
    with pytest.raises(DataError) as exc:
        load_csv(path, label="y")
    line = head.count("\n") + 1
    assert f"big.csv, line {line}: not UTF-8 text (invalid start byte at byte {len(head) + 2})" in str(exc.value)
    assert exc.value.line == line and "line" in exc.value.redacted()


@pytest.mark.parametrize("chunk", [4, 7, 64])
def test_bad_byte_after_a_character_split_across_chunks(tmp_path, monkeypatch, chunk):
    """With tiny scan chunks every multi-byte character falls across a boundary somewhere: only the real bad
    byte is reported, at its offset; a bad byte straddling a boundary and a cut last character too."""
    monkeypatch.setattr(csv_io, "_SCAN_CHUNK", chunk)
    good = "name,y\n" + "".join(f"é€😀{i},{'ab'[i % 2]}\n" for i in range(40))
    cases = {
        "late.csv": (good.encode() + b"z\xe2\x28\xa1,a\n", len(good.encode()) + 1, "invalid continuation byte"),
        "cut.csv": (good.encode() + b"z,a\xe2\x82", len(good.encode()) + 3, "unexpected end of data"),
    }
    for name, (data, offset, reason) in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(DataError) as exc:
            csv_io.read_raw(path)
        assert f"{name}, line 42: not UTF-8 text ({reason} at byte {offset})" in str(exc.value), str(exc.value)
    assert csv_io._first_bad_utf8(io.BytesIO(good.encode())) is None


# ------------------------------------------------------------------------------------------------ label = id
def test_label_that_is_also_the_id_is_refused(make_csv, tmp_path, capsys):
    path = make_csv("id,x,y\nr1,1,a\nr2,2,b\nr3,3,a\n")
    with pytest.raises(DataError, match=r"--label and --id both name column 'id'"):
        load_csv(path, label="id", id_column="id")
    with pytest.raises(DataError, match="both the label and the id column"):
        Schema((Feature("x", "numeric"),), "id", ("r1", "r2"), "id")
    with pytest.raises(DataError, match="both the label and the id column"):
        Schema.from_dict({"version": 1, "features": [{"name": "x", "kind": "numeric"}], "label": "y",
                          "classes": ["a", "b"], "id_column": "y"})
    with pytest.raises(DataError, match="id column 'x' is also listed as a feature"):
        Schema((Feature("x", "numeric"),), "y", ("a", "b"), "x")
    # the job scripts' one argument check (--csv and --schema discover alike)
    for argv in (["--csv", str(path), "--label", "id", "--id", " id"], ["--schema", "discover", "--label", "id",
                                                                        "--id", "id"]):
        parser = argparse.ArgumentParser()
        cli.add_data_args(parser)
        cli.add_schema_args(parser)
        with pytest.raises(DataError, match="--label and --id both name column 'id'"):
            cli.check_args(parser.parse_args(argv))
    prepare = importlib.import_module("treeflare.tools.prepare_data")
    with pytest.raises(SystemExit) as exc:
        prepare.main(["--csv", str(path), "--label", "id", "--id", "id", "--sites", "2", "--out", str(tmp_path / "f")])
    assert exc.value.code == 2 and "error: --label and --id both name column 'id'" in capsys.readouterr().err
    assert not (tmp_path / "f").exists()


def test_schema_from_dict_checks_types():
    base = {"version": 1, "features": [{"name": "x", "kind": "numeric"}], "label": "y", "classes": ["a", "b"]}
    for change, match in [({"features": ["x"]}, r"features\[0\] must be an object, got str"),
                          ({"features": "x"}, "'features' must be a list"),
                          ({"classes": [1, 2]}, r"classes\[0\] must be a string, got int"),
                          ({"label": 5}, "label must be a string"),
                          ({"id_column": ["i"]}, "id_column must be a string"),
                          ({"version": True}, "unsupported version"),
                          ({"version": 10 ** 5000}, "unsupported version int"),
                          ({"features": [{"name": "x", "kind": "numeric", "categories": "ab"}]},
                           "categories must be a list"),
                          ({"features": [{"name": "x", "kind": "categorical", "categories": ["a", 1]}]},
                           r"categories\[1\] must be a string")]:
        with pytest.raises(DataError, match=match):
            Schema.from_dict({**base, **change})
    assert Schema.from_dict(json.loads(json.dumps(base))).feature_names == ["x"]


def test_schema_file_with_a_huge_integer_or_a_bom(tmp_path):
    from treeflare.data import read_schema_file

    (tmp_path / "huge.json").write_text('{"version": ' + "9" * 5000 + "}")
    with pytest.raises(DataError, match="huge.json: not valid JSON"):
        read_schema_file(tmp_path / "huge.json")
    schema = Schema((Feature("x", "numeric"),), "y", ("a", "b"))
    (tmp_path / "bom.json").write_text("\ufeff" + json.dumps(schema.to_dict()), encoding="utf-8")
    assert read_schema_file(tmp_path / "bom.json") == schema


def test_site_binding_refuses_one_column_as_label_and_id():
    from treeflare.flare.site_config import parse_binding
    with pytest.raises(DataError, match="'label_column' and 'id_column' name the same column"):
        parse_binding({"data_dir": ".", "label_column": "pid", "id_column": "pid"}, "treeflare_site.json")
    assert parse_binding({"data_dir": ".", "label_column": "y", "id_column": "pid"}, "b.json").label_column == "y"


def test_id3_column_named_like_a_onehot_column_is_not_grouped():
    from treeflare.icdta4fl.encoding import feature_space
    schema = Schema((Feature("a", "numeric"), Feature("a=b", "numeric"), Feature("a=c", "numeric")), "y", ("n", "y"))
    names, kinds, _ = feature_space(schema, "id3")
    assert onehot_groups_from_names(names, kinds) == []


def test_huge_integers_in_a_tree_or_a_vertical_model_part_are_errors(tmp_path):
    from treeflare.trees.validate import PayloadError, check_number
    from treeflare.vertical.model_parts import find_model_parts
    with pytest.raises(PayloadError, match="thresholds: is too large for a float"):
        check_number(10 ** 400, "thresholds")
    (tmp_path / "site-1_active_model.json").write_text('{"party": "site-1", "n": ' + "9" * 5000 + "}")
    with pytest.raises(DataError, match="cannot read this model part"):
        find_model_parts(tmp_path)
