"""Predictions on hostile inputs are bounded, and refused before the expensive work: the input CSV's header (at most
max(4 x the model's features, 10,000) columns), its lines (1 MiB), the model file's size (read with os.stat
before the file is: 64 MiB a global tree, 512 MiB an XGBoost model or a vertical model part), and fields our
model files never hold. Each refusal names the file and the bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import treeflare.data.csv_bounds as csv_bounds
import treeflare.data.csv_io as csv_io
from test_predict import tree_model, write_rows, xgb_model
from treeflare.data import DataError, load_csv
from treeflare.icdta4fl.model import MAX_MODEL_BYTES, GlobalTree, ModelPayloadError
from treeflare.prediction import predict_csv
from treeflare.vertical.model_parts import find_model_parts
from treeflare.vertical.prediction import ModelPartError, check_active_model, check_passive_model
from treeflare.xgb import model_file

pytest.importorskip("xgboost")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bounds")
    train = load_csv(write_rows(tmp / "train.csv"), label="label", id_column="id", ordinal={"size": ["S", "M", "L"]})
    write_rows(tmp / "new.csv", n=20, seed=1)
    tree_model(train, "cart", tmp / "global_tree.json")
    xgb_model(train, tmp / "model.json")
    return tmp


def no_parse(monkeypatch):
    """Fail the test if pandas starts parsing: every refusal here comes before it."""
    def refuse(*a, **k):
        raise AssertionError("the CSV was parsed before it was refused")
    monkeypatch.setattr(csv_io.pd, "read_csv", refuse)


# ------------------------------------------------------------------------------------------------ the input CSV
@pytest.mark.parametrize("kind", ["global_tree.json", "model.json"])
def test_a_million_column_header_is_refused_before_parsing(models, tmp_path, monkeypatch, kind):
    csv = tmp_path / "wide.csv"
    csv.write_text(",".join(f"c{i}" for i in range(10**6)) + "\n" + ",".join("1" for _ in range(10)) + "\n")
    no_parse(monkeypatch)
    with pytest.raises(DataError) as err:
        predict_csv(models / kind, csv, tmp_path / "out.csv")
    assert "wide.csv" in str(err.value) and "line 1 is longer than 1,048,576 bytes" in str(err.value)
    assert not (tmp_path / "out.csv").exists()


def test_a_header_with_too_many_columns_is_refused(models, tmp_path, monkeypatch):
    csv = tmp_path / "many.csv"  # 20,000 short names: under the line bound, over the column bound
    csv.write_text(",".join(f"c{i}" for i in range(20_000)) + "\n1\n")
    no_parse(monkeypatch)
    with pytest.raises(DataError) as err:
        predict_csv(models / "model.json", csv, tmp_path / "out.csv")
    assert "many.csv" in str(err.value) and "20,000 columns, more than the 10,000 allowed" in str(err.value)
    assert "4 per model feature" in str(err.value)


def test_columns_up_to_the_bound_are_read(models, tmp_path, monkeypatch):
    monkeypatch.setattr(csv_bounds, "MIN_MAX_COLUMNS", 30)  # 5 features: max(4 x 5, 30)
    extra = [f"note{i}" for i in range(30 - 6)]
    src = (models / "new.csv").read_text().splitlines()
    rows = [src[0] + "," + ",".join(extra)] + [r + "," + ",".join("x" for _ in extra) for r in src[1:]]
    (tmp_path / "ok.csv").write_text("\n".join(rows) + "\n")
    assert predict_csv(models / "model.json", tmp_path / "ok.csv", tmp_path / "out.csv")["rows"] == 20
    (tmp_path / "over.csv").write_text(rows[0] + ",one_more\n" + "\n".join(r + ",x" for r in rows[1:]) + "\n")
    with pytest.raises(DataError, match="31 columns, more than the 30 allowed"):
        predict_csv(models / "model.json", tmp_path / "over.csv", tmp_path / "out.csv")


@pytest.mark.parametrize("chunk", [1 << 20, 7])  # a line split across chunks of the scan, too
def test_a_long_line_is_refused_naming_it(models, tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(csv_bounds, "MAX_LINE_BYTES", 200)
    monkeypatch.setattr(csv_bounds, "_SCAN_CHUNK", chunk)
    lines = (models / "new.csv").read_text().splitlines()
    lines[4] = lines[4].replace("red", "r" * 300).replace("green", "g" * 300).replace("blue", "b" * 300)
    (tmp_path / "long.csv").write_text("\n".join(lines) + "\n")
    no_parse(monkeypatch)
    with pytest.raises(DataError) as err:
        predict_csv(models / "model.json", tmp_path / "long.csv", tmp_path / "out.csv")
    assert "long.csv" in str(err.value) and "line 5 is longer than 200 bytes" in str(err.value)


def test_lines_at_the_bound_pass_the_scan(tmp_path, monkeypatch):
    monkeypatch.setattr(csv_bounds, "_SCAN_CHUNK", 5)
    path = tmp_path / "exact.csv"
    path.write_bytes(b"a,b\r\n" + b"1," + b"x" * 8 + b"\r\n" + b"2,y\n")  # line 2: 11 bytes before its line feed
    assert csv_bounds.check_bounds(path, max_columns=2, max_line_bytes=11) == ","
    with pytest.raises(DataError, match="line 2 is longer than 10 bytes"):
        csv_bounds.check_bounds(path, max_columns=2, max_line_bytes=10)


def test_the_first_long_line_is_named_and_a_header_the_csv_module_refuses_is_counted(tmp_path):
    path = tmp_path / "two.csv"
    path.write_text("a,b\n1," + "x" * 30 + "\n2,y\n3," + "z" * 90 + "\n")
    with pytest.raises(DataError, match="line 2 is longer than 20 bytes"):
        csv_bounds.check_bounds(path, max_columns=2, max_line_bytes=20)
    path = tmp_path / "huge_field.csv"  # a name over the csv module's field limit (128 KiB), then 1,000 columns
    path.write_text("a" * 200_000 + "," * 1000 + "\n1\n")
    with pytest.raises(DataError, match="the header has 1,001 columns, more than the 100 allowed"):
        csv_bounds.check_bounds(path, sep=",", max_columns=100)


def test_a_quoted_header_over_many_lines_is_bounded(tmp_path):
    path = tmp_path / "quoted.csv"
    path.write_text(",".join(f'"c\n{i}"' for i in range(5000)) + "\n")
    with pytest.raises(DataError, match="the header is longer than 1,000 bytes"):
        csv_bounds.check_bounds(path, sep=",", max_columns=10, max_line_bytes=1000)


# ------------------------------------------------------------------------------------------------ model files
def sparse(path: Path, head: bytes, size: int) -> Path:
    """A file of ``size`` bytes starting with ``head``: the rest a hole, so the test writes almost nothing."""
    with path.open("wb") as fh:
        fh.write(head)
        fh.truncate(size)
    return path


def test_a_global_tree_over_the_size_bound_is_refused_unread(models, tmp_path, monkeypatch):
    doc = (models / "global_tree.json").read_bytes()
    big = sparse(tmp_path / "global_tree.json", doc[:-1] + b', "padding": "', MAX_MODEL_BYTES + 1)
    assert MAX_MODEL_BYTES == 64 << 20
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} was read"))
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: pytest.fail(f"{self} was read"))
    with pytest.raises(DataError) as err:
        predict_csv(big, models / "new.csv", tmp_path / "out.csv")
    assert "global_tree.json" in str(err.value) and "67,108,864" in str(err.value)
    with pytest.raises(ModelPayloadError, match="more than the 67,108,864"):
        GlobalTree.load_json(big)


def test_a_global_tree_with_an_unknown_field_is_refused(models, tmp_path):
    doc = json.loads((models / "global_tree.json").read_text())
    path = tmp_path / "global_tree.json"
    path.write_text(json.dumps({**doc, "padding": "x" * 1000}))
    with pytest.raises(DataError) as err:
        predict_csv(path, models / "new.csv", tmp_path / "out.csv")
    assert str(path) in str(err.value) and "padding: unknown field" in str(err.value)
    with pytest.raises(ModelPayloadError, match="padding: unknown field"):
        GlobalTree.load_json(path)


def test_an_xgboost_model_over_the_size_bound_is_refused_unread(models, tmp_path, monkeypatch):
    assert model_file.MAX_FILE_BYTES == 512 << 20
    big = sparse(tmp_path / "model.json", b'{"padding": "', model_file.MAX_FILE_BYTES + 1)
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} was read"))
    with pytest.raises(DataError) as err:
        predict_csv(big, models / "new.csv", tmp_path / "out.csv")
    assert "model.json" in str(err.value) and "536,870,912 bytes" in str(err.value)


def test_an_xgboost_model_with_an_unknown_top_field_is_refused(models, tmp_path):
    doc = json.loads((models / "model.json").read_text())
    assert set(doc) == {"learner", "version"}
    path = tmp_path / "model.json"
    path.write_text(json.dumps({**doc, "padding": "x" * 1000}))
    with pytest.raises(DataError) as err:
        predict_csv(path, models / "new.csv", tmp_path / "out.csv")
    assert str(path) in str(err.value) and "padding: unknown field" in str(err.value)


def test_vertical_model_parts_are_bounded(tmp_path, monkeypatch):
    from treeflare.vertical import model_parts

    monkeypatch.setattr(model_parts, "MAX_MODEL_BYTES", 1000)
    sparse(tmp_path / "site-1_active_model.json", b'{"padding": "', 1001)
    with pytest.raises(DataError, match=r"site-1_active_model.json is 1,001 bytes, more than the 1,000"):
        find_model_parts(tmp_path)
    with pytest.raises(ModelPartError, match="unknown field 'padding'"):
        check_active_model({"format": "treeflare.vertical.active/2", "party": "a", "padding": "x"})
    with pytest.raises(ModelPartError, match="unknown field 'padding'"):
        check_passive_model({"format": "treeflare.vertical.passive/2", "party": "b", "features": [], "splits": {},
                             "padding": "x"})

