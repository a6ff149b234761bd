"""``treeflare.data.intersection``, the pure part of PSI every vertical party runs: the id checks (a line, never an
id), the kind-prefixed items, the kept file and the restriction sorted by id."""

import json

import numpy as np
import pandas as pd
import pytest

from treeflare.data import DataError, Feature, Schema, Table
from treeflare.data.intersection import (INTERSECTION_FILE, check_ids, psi_items, read_intersection, restrict,
                                         split_items, write_intersection)

SECRET = "cust-7731-secret"


def ids_table(ids, name="site-2"):
    frame = pd.DataFrame({"x": np.arange(len(ids), dtype=float)})
    return Table(frame, None, Schema((Feature("x", "numeric"),), "y", (), "cid"), np.array(ids, dtype=object), name)


# -- check_ids ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ids, line, problem, count", [
    (["a", "b", SECRET, "c", SECRET, SECRET], 6, "duplicate id", "2 train row(s) repeat"),
    (["a", "  ", "b", None, ""], 3, "empty id", "3 train row(s) with an empty id"),
    # a NaN cell, and the text "nan" that the CSV reader reads as missing too (as "NA", "?", "null", ...)
    (np.array(["a", float("nan"), "nan"], dtype=object), 3, "empty id", "2 train row(s) with an empty id"),
    (["a", "NA", "b"], 3, "empty id", "1 train row(s) with an empty id"),
])
def test_check_ids_names_the_line_never_the_id(ids, line, problem, count):
    with pytest.raises(DataError) as exc:
        check_ids(ids, site="site-2", file="train.csv", column="cid")
    err = exc.value
    assert err.line == line and err.problem == problem and err.site == "site-2" and err.column == "cid"
    assert f"line {line}" in str(err) and count in str(err) and "site-2: train.csv, column 'cid'" in str(err)
    for text in (str(err), err.redacted()):
        assert SECRET not in text and "'a'" not in text
    assert err.redacted() == f"site-2: train.csv, column 'cid', line {line}: {problem}"


def test_check_ids_no_rows_and_good_ids():
    with pytest.raises(DataError, match="site-3: predict.csv, column 'cid': no predict rows") as exc:
        check_ids([], site="site-3", kind="predict", file="predict.csv", column="cid")
    assert exc.value.redacted() == "site-3: predict.csv, column 'cid': no predict rows"
    with pytest.raises(DataError, match="no test rows"):
        check_ids(None, site="site-1", kind="test")
    check_ids(np.array(["a", "b", 3, 4.5], dtype=object), site="site-1")  # distinct: no error
    with pytest.raises(ValueError, match="kind must be one of"):
        check_ids(["a"], site="site-1", kind="validation")


def test_check_ids_compares_ids_as_stripped_text():
    with pytest.raises(DataError, match="line 3"):  # " 7" and 7 are the same customer after the CSV reader
        check_ids([" 7", 7], site="site-1")


# -- items -----------------------------------------------------------------------------------------------------
def test_items_carry_their_kind_and_split_back_sorted():
    items = psi_items({"train": ["b", " a"], "test": ["b"]})
    assert items == ["train:b", "train:a", "test:b"]  # a train id never meets a test id of the same value
    assert split_items(reversed(items)) == {"train": ["a", "b"], "test": ["b"]}
    assert split_items(["predict:x:y"]) == {"predict": ["x:y"]}  # a ':' inside an id is kept
    with pytest.raises(ValueError, match="kind must be one of"):
        psi_items({"valid": ["a"]})


@pytest.mark.parametrize("item", ["nokind", "valid:" + SECRET, "train:", ":" + SECRET])
def test_split_items_refuses_unknown_kinds_without_quoting(item):
    with pytest.raises(DataError, match="site-1: the intersection holds an item of no known kind") as exc:
        split_items(["train:a", item], site="site-1")
    assert SECRET not in str(exc.value) and SECRET not in exc.value.redacted()


# -- the kept file ------------------------------------------------------------------------------------------------
def test_write_read_round_trip(tmp_path):
    path = write_intersection(tmp_path / "psi", psi_items({"train": ["k2", "k10", "k1"], "test": ["t9"]}))
    assert path == tmp_path / "psi" / INTERSECTION_FILE
    assert read_intersection(tmp_path / "psi") == {"train": ["k1", "k10", "k2"], "test": ["t9"]}
    assert [p.name for p in (tmp_path / "psi").iterdir()] == [INTERSECTION_FILE]  # no temporary file left
    write_intersection(tmp_path / "psi", ["predict:p1"])  # a later run replaces the file
    assert read_intersection(tmp_path / "psi") == {"predict": ["p1"]}


@pytest.mark.parametrize("content, problem", [
    (None, "no intersection (the PSI phase did not run)"),
    ("{not json", "unreadable intersection"),
    ('["train:a"]', "malformed intersection file"),
    ('{"format": "other", "version": 1, "ids": {"train": ["a"]}}', "malformed intersection file"),
    ('{"format": "treeflare.psi.intersection", "version": 1, "ids": {"valid": ["a"]}}', "malformed intersection file"),
    ('{"format": "treeflare.psi.intersection", "version": 1, "ids": {"train": ["b", "a"]}}',
     "malformed intersection file"),
    ('{"format": "treeflare.psi.intersection", "version": 1, "ids": {"train": ["a", "a"]}}',
     "malformed intersection file"),
    ('{"format": "treeflare.psi.intersection", "version": 1, "ids": {"train": [1, 2]}}', "malformed intersection file"),
    ('{"format": "treeflare.psi.intersection", "version": 1, "ids": {"train": "a"}}', "malformed intersection file"),
])
def test_read_intersection_refuses_malformed_files(tmp_path, content, problem):
    if content is not None:
        (tmp_path / INTERSECTION_FILE).write_text(content)
    with pytest.raises(DataError) as exc:
        read_intersection(tmp_path, site="site-2")
    assert exc.value.problem == problem and exc.value.site == "site-2"
    assert str(tmp_path) not in str(exc.value) and exc.value.redacted() == f"site-2: {problem}"


def test_read_intersection_file_is_plain_json(tmp_path):
    write_intersection(tmp_path, ["train:b", "train:a"])
    doc = json.loads((tmp_path / INTERSECTION_FILE).read_text())
    assert doc == {"format": "treeflare.psi.intersection", "version": 1, "ids": {"train": ["a", "b"]}}


# -- restrict -----------------------------------------------------------------------------------------------------
def test_restrict_keeps_the_intersection_sorted_by_id():
    t = ids_table(["k3", "k1", "k9", " k2", "k10"])
    r = restrict(t, ["k2", "k10", "k3", "k1"])
    assert r.ids.tolist() == ["k1", "k10", " k2", "k3"]  # sorted by id as text; the table's own values kept
    assert r.frame["x"].tolist() == [1.0, 4.0, 3.0, 0.0]
    # two parties holding the same customers in different orders derive the same row order
    other = ids_table(["k10", "k2", "k1", "k3", "k7"])
    assert [v.strip() for v in restrict(other, ["k3", "k1", "k10", "k2"]).ids] == [v.strip() for v in r.ids]


def test_restrict_refuses_ids_the_party_does_not_hold():
    with pytest.raises(DataError, match="site-2: 1 id\\(s\\) of its train intersection are not among its own rows") \
            as exc:
        restrict(ids_table(["a", "b"]), ["a", SECRET], site="site-2")
    assert SECRET not in str(exc.value) and SECRET not in exc.value.redacted()
    t = ids_table(["a"])
    t.ids = None
    with pytest.raises(DataError, match="no id column; PSI needs one"):
        restrict(t, ["a"], site="site-2")


# -- the items through NVFlare's own DH-PSI (the driver scripts/bench_psi.py times) ---------------------------------
def _dh_psi(run, attempts=3):
    """``run()``, again with fresh keys when NVFlare's DhPSIWorkFlow's own check stops it: at a few ids
    openmined-psi's Bloom filter now and then answers a false positive (measured: about 1 run in 100 at 6-50 ids,
    whatever the FPR; none in 40 runs at 300), which the workflow detects and raises ('Intersection calculation
    failed'). Any other error, or a wrong intersection, fails at once."""
    for attempt in range(attempts):
        try:
            return run()
        except RuntimeError as exc:
            if "Intersection calculation failed" not in str(exc) or attempt == attempts - 1:
                raise


def test_dh_psi_keeps_exactly_the_items_all_parties_hold_per_kind():
    from flare_helpers import load_script

    bench = load_script("scripts/bench_psi.py", "bench_psi_driver")
    a = psi_items({"train": ["c1", "c2", "c3", "x9"], "test": ["t1", "c4"]})
    b = psi_items({"train": ["c3", "t1", "c2", "c4"], "test": ["t1", "c1"]})  # train t1 and test c1: other kinds
    c = psi_items({"train": ["c5", "c2", "c3"], "test": ["t1", "x9"]})
    parties, controller, _ = _dh_psi(lambda: bench.run_workflow([a, b, c]))
    for p in parties.values():
        assert split_items(p.local.kept) == {"train": ["c2", "c3"], "test": ["t1"]}
        assert p.sent > 0 and p.received > 0 and p.seconds["setup"] > 0
    assert len(controller.steps) >= 9  # prepare, two forward rounds of 4 steps, the backward pass
    row = _dh_psi(lambda: bench.one_run(60, 2, 0.5, bench.DEFAULT_FPR, seed=1))
    assert row["intersection"] == 30 and set(row["parties"]) == {"site-1", "site-2"}
