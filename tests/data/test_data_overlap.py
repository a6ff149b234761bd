import importlib
"""Vertical data whose parties hold different customers (issue 22): ``prepare_federation(..., overlap=F)``,
``--overlap`` on the command line, ``data.join_parties`` and the centralized XGBoost inputs on the rows every
party holds. All in process, on small tables."""

import argparse
import json
import re

import numpy as np
import pandas as pd
import pytest


from treeflare.cli import check_args, prepare_from_args
from treeflare.data import (DataError, Feature, Schema, Table, join_parties, load_csv, prepare_federation, read_site,
                            write_federation)
from treeflare.data.partition import overlap_sizes
from treeflare.xgb.encoding import Arrays, global_test, hstack_parties, table_arrays, union_train

HEX_ID = re.compile(r"^[0-9a-f]{16}$")


def table(n=400, seed=0, with_ids=False) -> Table:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({f"n{i}": rng.normal(size=n) for i in range(5)})
    frame["c"] = rng.choice(["u", "v", "w"], size=n).astype(object)
    feats = tuple(Feature(f"n{i}", "numeric") for i in range(5)) + (Feature("c", "categorical", ("u", "v", "w")),)
    ids = np.array([f"cust{i:05d}" for i in rng.permutation(n)], dtype=object) if with_ids else None
    return Table(frame, rng.choice(["no", "yes"], size=n).astype(object),
                 Schema(feats, "y", ("no", "yes"), "cid" if with_ids else None), ids, "toy")


def train_ids(fed):
    return {name: set(s.train.ids) for name, s in fed.sites.items()}


@pytest.fixture(scope="module")
def fed3():
    """The issue's target configuration: 3 parties (active + 2 passive) at 70% overlap."""
    return prepare_federation(table(600), 3, vertical=True, n_passive=2, overlap=0.7, seed=5)


# -- the split -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_passive, overlap", [(1, 0.5), (2, 0.7), (2, 0.9), (3, 0.3)])
def test_each_party_holds_the_overlap_share_of_its_rows_shared(n_passive, overlap):
    fed = prepare_federation(table(500), n_passive + 1, vertical=True, n_passive=n_passive, overlap=overlap, seed=1)
    ids = train_ids(fed)
    shared = set.intersection(*ids.values())
    n_shared = fed.summary["partition"]["n_shared"]
    assert len(shared) == n_shared >= 2
    n_rows = len(fed.sites["site-1"].train)
    for name, own in ids.items():
        assert len(own) == n_rows  # every party the same number of rows
        assert abs(n_shared / len(own) - overlap) <= 1.5 / len(own)  # its own share of shared rows is F
    # rows no party was given are only the rounding left over
    held = set.union(*ids.values())
    n_train_rows = 500 - len(fed.server_test)
    assert 0 <= n_train_rows - len(held) <= n_passive + 1


def test_private_rows_are_held_by_one_party_only(fed3):
    ids = train_ids(fed3)
    shared = set.intersection(*ids.values())
    test_ids = set(fed3.server_test.ids)
    for name, own in ids.items():
        private = own - shared
        others = set.union(*(v for k, v in ids.items() if k != name))
        assert len(private) == fed3.summary["sites"][name]["n_private"] > 0
        assert not private & others and not private & test_ids
        for other in fed3.sites.values():
            assert not private & set(other.test.ids)
    assert fed3.sites["site-1"].train.y is not None  # the label party has private rows too, labelled
    assert all(s.train.y is None for n, s in fed3.sites.items() if n != "site-1")


def test_each_party_has_its_own_row_order(fed3):
    shared = sorted(set.intersection(*train_ids(fed3).values()))
    orders = [[i for i in s.train.ids if i in set(shared)] for s in fed3.sites.values()]
    assert orders[0] != orders[1] != orders[2] != orders[0]
    assert all(o != shared for o in orders)  # not sorted either: the order says nothing
    test_orders = [s.test.ids.tolist() for s in fed3.sites.values()]
    assert test_orders[0] != test_orders[1] != test_orders[2]
    assert all(sorted(o) == sorted(fed3.server_test.ids) for o in test_orders)  # every party all test rows


def test_rows_keep_their_values_and_labels_through_the_ids(fed3):
    t = table(600)
    full = fed3.server_test  # its ids name the original rows only through the values: join on a column value
    joined_test = join_parties([s.test for s in fed3.sites.values()])
    by_id = {i: k for k, i in enumerate(full.ids)}
    rows = [by_id[i] for i in joined_test.ids]
    pd.testing.assert_frame_equal(joined_test.frame, full.frame.iloc[rows].reset_index(drop=True))
    assert joined_test.y.tolist() == full.y[rows].tolist()
    # the training rows are the original table's rows: each n0 value is one row's (continuous, unique)
    n0 = dict(zip(t.frame["n0"], t.y))
    active = fed3.sites["site-1"].train
    assert [n0[v] for v in active.frame["n0"]] == active.y.tolist()


def test_random_ids_when_the_data_has_none(fed3):
    everything = [i for s in fed3.sites.values() for i in (*s.train.ids, *s.test.ids)] + list(fed3.server_test.ids)
    assert all(HEX_ID.match(i) for i in everything)
    assert not set(everything) & {str(i) for i in range(600)}  # not row numbers
    assert len(set(everything)) == len(fed3.server_test) + len(set.union(*train_ids(fed3).values()))
    assert fed3.schema.id_column == "row_id"
    again = prepare_federation(table(600), 3, vertical=True, n_passive=2, overlap=0.7, seed=5)
    assert again.sites["site-2"].train.ids.tolist() == fed3.sites["site-2"].train.ids.tolist()  # seeded
    other = prepare_federation(table(600), 3, vertical=True, n_passive=2, overlap=0.7, seed=6)
    assert not set(other.server_test.ids) & set(fed3.server_test.ids)


def test_the_datas_own_id_column_keeps_its_name_but_gets_random_values():
    """Sequential customer numbers (an embedded data set's, a CSV's) would tell a party the others' private ids."""
    t = table(300, with_ids=True)
    fed = prepare_federation(t, 2, vertical=True, n_passive=1, overlap=0.6, seed=2)
    held = set.union(*train_ids(fed).values()) | set(fed.server_test.ids)
    assert fed.schema.id_column == "cid" and not held & set(t.ids) and all(HEX_ID.match(i) for i in held)
    whole = prepare_federation(t, 2, vertical=True, n_passive=1, seed=2)  # overlap 1: the data's own ids, as before
    assert set.union(*train_ids(whole).values()) <= set(t.ids)
    # your CSV (the job scripts pass keep_ids with --csv): its ids are yours, and the rows you predict on carry them
    kept = prepare_federation(t, 2, vertical=True, n_passive=1, overlap=0.6, seed=2, keep_ids=True)
    assert set.union(*train_ids(kept).values()) | set(kept.server_test.ids) <= set(t.ids)


def test_default_overlap_is_the_classic_split_byte_for_byte(tmp_path):
    t = table(300)
    a = write_federation(prepare_federation(t, 2, vertical=True, n_passive=1, seed=3), tmp_path / "a")
    b = write_federation(prepare_federation(t, 2, vertical=True, n_passive=1, seed=3, overlap=1.0), tmp_path / "b")
    for f in ("server/test.csv", "site-1/train.csv", "site-1/test.csv", "site-2/train.csv", "site-2/test.csv"):
        assert (a / f).read_bytes() == (b / f).read_bytes()
    site1 = (a / "site-1" / "train.csv").read_text().splitlines()[1:]
    ids = [line.split(",")[0] for line in site1]
    assert ids == sorted(ids, key=int) and set(ids) <= {str(i) for i in range(300)}  # row numbers, table order
    p = json.loads((a / "partition.json").read_text())["partition"]
    assert p["overlap"] == 1.0 and p["n_shared"] == len(site1)


def test_the_global_test_rows_are_the_same_whatever_the_overlap():
    t = table(400)
    classic = prepare_federation(t, 3, vertical=True, n_passive=2, seed=4)
    partial = prepare_federation(t, 3, vertical=True, n_passive=2, seed=4, overlap=0.5)
    pd.testing.assert_frame_equal(classic.server_test.frame, partial.server_test.frame)  # server/test.csv's rows
    assert classic.server_test.y.tolist() == partial.server_test.y.tolist()


def test_partition_json_and_files_record_the_overlap(fed3, tmp_path):
    out = write_federation(fed3, tmp_path / "vfl")
    summary = json.loads((out / "partition.json").read_text())
    p = summary["partition"]
    assert p["overlap"] == 0.7 and p["n_shared"] == len(set.intersection(*train_ids(fed3).values()))
    for name, s in fed3.sites.items():
        info = summary["sites"][name]
        assert info["n_train"] == len(s.train) and info["n_private"] == len(s.train) - p["n_shared"]
        back = read_site(out, name)
        assert back.train.ids.tolist() == s.train.ids.tolist() and back.test.ids.tolist() == s.test.ids.tolist()
    server = (out / "server" / "test.csv").read_text().splitlines()
    assert server[0] == "row_id,y" and [r.split(",")[0] for r in server[1:]] == fed3.server_test.ids.tolist()


@pytest.mark.parametrize("overlap", [0, -0.2, 1.01, float("nan"), float("inf"), True, "0.5", None])
def test_overlap_outside_0_1_is_refused(overlap):
    with pytest.raises(DataError, match=r"--overlap must be a number in \(0, 1\]"):
        prepare_federation(table(100), 2, vertical=True, overlap=overlap)


def test_overlap_too_small_for_two_shared_rows_is_refused():
    with pytest.raises(DataError, match="leave 1 row.*need at least 2"):
        prepare_federation(table(100), 3, vertical=True, n_passive=2, overlap=0.05)
    assert overlap_sizes(10, 2, 0.5) == (3, 3) and overlap_sizes(400, 4, 0.3) == (38, 90)


def test_overlap_with_a_horizontal_split_is_refused():
    with pytest.raises(DataError, match="only to a vertical split"):
        prepare_federation(table(100), 2, overlap=0.5)


def test_honest_data_with_missing_values_and_a_rare_category(tmp_path):
    """A CSV as users have them: blank cells, one category held by a single row, no id column."""
    rng = np.random.default_rng(7)
    n = 240
    age = rng.integers(18, 80, size=n).astype(object)
    age[rng.choice(n, 20, replace=False)] = ""
    plan = rng.choice(["basic", "plus", "pro"], size=n).astype(object)
    plan[17] = "enterprise"  # a rare category: one row in the whole file
    plan[rng.choice(n, 10, replace=False)] = ""
    spend = np.round(rng.gamma(2.0, 30.0, size=n), 2).astype(object)
    spend[rng.choice(n, 15, replace=False)] = ""
    frame = pd.DataFrame({"age": age, "plan": plan, "region": rng.choice(["n", "s"], size=n), "spend": spend,
                          "churn": rng.choice(["0", "1"], size=n)})
    src = tmp_path / "customers.csv"
    frame.to_csv(src, index=False)
    t = load_csv(src, label="churn")
    fed = prepare_federation(t, 2, vertical=True, n_passive=1, overlap=0.7, seed=0)
    out = write_federation(fed, tmp_path / "vfl")
    parts = [read_site(out, s) for s in fed.site_names]
    assert "enterprise" in fed.schema.feature("plan").categories
    joined = join_parties([p.train for p in parts])
    assert len(joined) == fed.summary["partition"]["n_shared"]
    assert joined.schema.feature_names == ["age", "plan", "region", "spend"]
    # missing cells stay missing through the split, the files and the join
    assert joined.frame["age"].isna().any() and joined.frame["spend"].isna().any() and joined.frame["plan"].isna().any()
    original = {(a, s): c for a, s, c in zip(t.frame["age"], t.frame["spend"], t.y) if a == a and s == s}
    keyed = [(a, s, c) for a, s, c in zip(joined.frame["age"], joined.frame["spend"], joined.y) if a == a and s == s]
    assert keyed and all(original[(a, s)] == c for a, s, c in keyed)
    arrays = union_train(out)
    assert arrays.X.shape == (len(joined), 4) and np.isnan(arrays.X).any()


# -- the command line ------------------------------------------------------------------------------------------
def ns(**kw):
    base = {"seed": 0, "sites": 3, "passive": 2, "vertical": True, "overlap": 0.7, "dataset": "adult", "csv": None,
            "schema": None, "env": "sim"}
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kw, match", [
    ({"overlap": 0.0}, r"--overlap must be a number in \(0, 1\]"),
    ({"overlap": 1.5}, r"--overlap must be a number in \(0, 1\]"),
    ({"vertical": False}, "--overlap applies only to a vertical split"),
    ({"vertical": False, "mode": "horizontal"}, "--overlap applies only to a vertical split"),
    ({"schema": "discover", "dataset": None}, "--overlap splits data this script prepares"),
    ({"dataset": None, "env": "poc"}, "--overlap splits data this script prepares"),
])
def test_cli_overlap_checks(kw, match):
    with pytest.raises(DataError, match=match):
        check_args(ns(**kw))


def test_cli_overlap_accepted_and_passed_on():
    assert check_args(ns(vertical=False, mode="vertical")).overlap == 0.7  # xgb_histogram --mode vertical
    assert check_args(ns(overlap=None, vertical=False)).overlap is None  # not given: horizontal is fine
    fed = prepare_from_args(table(300), ns(passive=1))
    assert fed.summary["partition"]["overlap"] == 0.7 and fed.site_names == ["site-1", "site-2"]
    assert prepare_from_args(table(300), ns(passive=1, overlap=None)).summary["partition"]["overlap"] == 1.0


def test_prepare_data_overlap(tmp_path, capsys):
    script = importlib.import_module("treeflare.tools.prepare_data")
    src = tmp_path / "t.csv"
    table(200).to_frame().to_csv(src, index=False)
    assert script.main(["--csv", str(src), "--label", "y", "--vertical", "--overlap", "0.6",
                        "--out", str(tmp_path / "v")]) == 0
    printed = capsys.readouterr().out
    assert "overlap=0.6" in printed and "training rows no other party holds" in printed
    assert json.loads((tmp_path / "v" / "partition.json").read_text())["partition"]["overlap"] == 0.6
    with pytest.raises(SystemExit) as exc:
        script.main(["--csv", str(src), "--label", "y", "--overlap", "0.6", "--out", str(tmp_path / "h")])
    assert exc.value.code == 2 and "only to a vertical split" in capsys.readouterr().err
    assert not (tmp_path / "h").exists()


# -- join_parties and the centralized inputs ------------------------------------------------------------------
def party(cols, ids, *, label=None, name=""):
    frame = pd.DataFrame({c: np.arange(len(ids), dtype=float) + 10 * k for k, c in enumerate(cols)})
    schema = Schema(tuple(Feature(c, "numeric") for c in cols), "y", ("a", "b") if label is not None else (), "id")
    return Table(frame, None if label is None else np.array(label, dtype=object), schema,
                 np.array(ids, dtype=object), name)


def test_join_parties_on_the_ids_all_hold_sorted_by_id():
    p1 = party(["x"], ["k3", "k1", "k9", "k2"], name="site-1")
    p2 = party(["u", "v"], ["k2", "k7", "k3", "k1"], label=["a", "b", "b", "a"], name="site-2")
    p3 = party(["w"], ["k1", "k2", "k3", "k8"], name="site-3")
    j = join_parties([p1, p2, p3])
    assert j.ids.tolist() == ["k1", "k2", "k3"]
    assert j.schema.feature_names == ["x", "u", "v", "w"] and j.schema.classes == ("a", "b")
    assert j.frame["x"].tolist() == [1.0, 3.0, 0.0]  # p1's rows of k1, k2, k3
    assert j.frame["u"].tolist() == [3.0, 0.0, 2.0] and j.frame["w"].tolist() == [0.0, 1.0, 2.0]
    assert j.y.tolist() == ["a", "a", "b"]  # the label comes from the party holding it (site-2)


def test_join_parties_refuses_what_cannot_be_joined():
    with pytest.raises(DataError, match="no id in common"):
        join_parties([party(["x"], ["a1"]), party(["w"], ["b1"])])
    no_ids = party(["w"], ["a1"], name="site-2")
    no_ids.ids = None
    with pytest.raises(DataError, match="site-2: its rows have no id column"):
        join_parties([party(["x"], ["a1"]), no_ids])
    with pytest.raises(DataError, match="site-1: its ids repeat") as exc:
        join_parties([party(["x"], ["a1", "a1"], name="site-1"), party(["w"], ["a1"])])
    assert "a1" not in str(exc.value)
    with pytest.raises(DataError, match="no party tables"):
        join_parties([])


def test_union_train_and_global_test_on_overlap_data(fed3, tmp_path):
    out = write_federation(fed3, tmp_path / "vfl")
    train = union_train(out)
    expected = table_arrays(join_parties([s.train for s in fed3.sites.values()]))
    assert train.ids.tolist() == sorted(set.intersection(*train_ids(fed3).values()))
    assert train.feature_names == fed3.schema.feature_names
    np.testing.assert_array_equal(train.X, expected.X)
    np.testing.assert_array_equal(train.y, expected.y)
    test = global_test(out)
    assert test.ids.tolist() == sorted(fed3.server_test.ids) and test.X.shape[1] == 6
    by_id = dict(zip(fed3.server_test.ids, fed3.server_test.y_codes()))
    assert test.y.tolist() == [by_id[i] for i in test.ids]


def test_hstack_parties_aligns_unsorted_parts_on_common_ids():
    a = Arrays(np.array([[1.], [2.], [3.]], np.float32), np.array([0, 1, 0]), ["a"], ["q"],
               np.array(["z", "x", "y"], dtype=object))
    b = Arrays(np.array([[20.], [30.]], np.float32), None, ["b"], ["q"], np.array(["x", "z"], dtype=object))
    j = hstack_parties([a, b])
    assert j.ids.tolist() == ["x", "z"] and j.X.tolist() == [[2., 20.], [1., 30.]] and j.y.tolist() == [1, 0]
    c = Arrays(np.array([[5.]], np.float32), None, ["c"], ["q"], np.array(["w"], dtype=object))
    with pytest.raises(DataError, match="no row id in common"):
        hstack_parties([a, c])


def test_job_scripts_take_and_check_overlap(tmp_path):
    """--overlap reaches both vertical jobs' argument checks (before anything is written or FLARE starts)."""
    vertical = importlib.import_module("treeflare.jobs.vertical_tree")
    assert vertical.parse_args(["--overlap", "0.7", "--workspace", str(tmp_path / "v")]).overlap == 0.7
    with pytest.raises(DataError, match=r"--overlap must be a number in \(0, 1\]"):
        vertical.parse_args(["--overlap", "1.5", "--workspace", str(tmp_path / "v")])
    xgb = importlib.import_module("treeflare.jobs.xgb_histogram")
    args = xgb.build_parser().parse_args(["--dataset", "adult", "--mode", "vertical", "--overlap", "0.5",
                                          "--workspace", str(tmp_path / "x")])
    assert check_args(args).overlap == 0.5
    with pytest.raises(DataError, match="--overlap applies only to a vertical split"):
        xgb.check_args(xgb.build_parser().parse_args(["--dataset", "adult", "--overlap", "0.5",
                                                      "--workspace", str(tmp_path / "x")]))
    assert not (tmp_path / "v").exists() and not (tmp_path / "x").exists()
