"""Schema discovery, in process: what a site reports (site_profile), what the server accepts (check_profile) and
the union with its conflict checks (merge_profiles)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from treeflare.data import DataError, Feature, Schema
from treeflare.data.csv_io import infer_schema
from treeflare.data.discovery import (DEFAULT_MIN_CATEGORY_ROWS, MAX_CATEGORIES, MAX_NAME_CHARS, SchemaConflict,
                                      check_profile, merge_profiles, site_profile)

RARE = "magenta-7731"  # a value seen in fewer than k rows: it must never reach the server


def frame(rows: dict) -> pd.DataFrame:
    return pd.DataFrame({k: [str(v) for v in vals] for k, vals in rows.items()})


def pooled(n=300, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    colour = rng.choice(["red", "green", "blue"], n)
    size = rng.choice(["S", "M", "L"], n)
    x = rng.normal(size=n).round(3)
    y = np.where((x > 0) ^ (colour == "red"), "yes", "no")
    return frame({"x": x, "colour": colour, "size": size, "count": rng.integers(0, 9, n), "y": y})


def profiles_of(frames: dict, **kw) -> dict:
    kw.setdefault("label", "y")
    out = {}
    for site, f in frames.items():
        # through JSON and the server's checks, as a reply travels
        wire = json.loads(json.dumps(site_profile(f, site=site, file="train.csv", **kw)))
        out[site] = check_profile(wire, site, declared_ordinal=kw.get("ordinal"))
    return out


def three_sites(df: pd.DataFrame) -> dict:
    bounds = np.linspace(0, len(df), 4).astype(int)
    return {f"site-{i + 1}": df.iloc[bounds[i]:bounds[i + 1]].reset_index(drop=True) for i in range(3)}


def test_rows_and_categories_in_any_order_and_rare_values_give_the_same_schema():
    df = pooled()
    sites = three_sites(df)
    base = merge_profiles(profiles_of(sites), site_order=list(sites))
    # another run: each site's rows shuffled (so categories appear in another order) and a rare value at two sites
    shuffled = {s: f.sample(frac=1.0, random_state=i).reset_index(drop=True) for i, (s, f) in enumerate(sites.items())}
    for s in ("site-2", "site-3"):
        shuffled[s].loc[: DEFAULT_MIN_CATEGORY_ROWS - 2, "colour"] = RARE  # k-1 rows each: never reported
    other = merge_profiles(profiles_of(shuffled), site_order=list(shuffled))
    assert other == base
    # ... and it is the schema the pooled data would give (columns in site-1's order, categories sorted)
    assert base == infer_schema(df, label="y")
    assert base.feature("colour").categories == ("blue", "green", "red")
    assert base.feature("x").kind == "numeric" and base.feature("count").kind == "numeric"
    assert base.classes == ("no", "yes")


def test_k_threshold_counts_rows_per_site_and_numeric_columns_report_nothing():
    f = frame({"x": [1.5] * 12, "c": ["a"] * 5 + ["b"] * 4 + ["c"] * 3, "y": ["p", "q"] * 6})
    p = site_profile(f, label="y", min_category_rows=5)
    assert p["columns"] == [{"name": "x", "kind": "numeric"}, {"name": "c", "kind": "categorical", "values": ["a"]}]
    assert p["n_rows"] == 12 and p["classes"] == ["p", "q"] and p["label"] == "y" and p["min_category_rows"] == 5
    assert site_profile(f, label="y", min_category_rows=3)["columns"][1]["values"] == ["a", "b", "c"]
    # 4 + 4 rows at two sites: each under k, so neither reports it, although 8 rows hold it
    merged = merge_profiles(profiles_of({"site-1": f, "site-2": f}, min_category_rows=5))
    assert merged.feature("c").categories == ("a",)


def test_every_class_is_reported_whatever_its_count():
    f = frame({"x": range(10), "y": ["a"] * 9 + ["rare"]})
    assert site_profile(f, label="y")["classes"] == ["a", "rare"]


def merge(sites, vertical=False, **kw):
    return merge_profiles(profiles_of(sites, **kw), site_order=list(sites), vertical=vertical,
                          ordinal=kw.get("ordinal"))


def conflicts(sites, vertical=False, **kw) -> str:
    with pytest.raises(SchemaConflict) as err:
        merge(sites, vertical=vertical, **kw)
    text = str(err.value)
    assert RARE not in text  # names sites and columns, never a value
    assert text == err.value.redacted()  # the whole message may leave the server's log
    return text


def test_numeric_at_one_site_and_categorical_at_another():
    a = frame({"x": ["1", "2", "3", "4", "5"], "y": ["p", "q", "p", "q", "p"]})
    b = frame({"x": ["u", "v", "w", RARE, "z"], "y": ["p", "q", "p", "q", "p"]})
    text = conflicts({"site-1": a, "site-2": a, "site-3": b})
    assert "column 'x' is categorical at site-3 but numeric at site-1, site-2" in text
    assert "--categorical x" in text
    # declared categorical (and site-1 and site-2's bindings allow it, as they read x as numbers), the sites agree
    assert merge({"site-1": a, "site-2": b}, categorical=["x"], categorical_allowed=["x"],
                 min_category_rows=1).feature("x").kind == "categorical"


def test_a_column_missing_at_one_site():
    a = frame({"x": [1, 2, 3, 4], "z": [1, 1, 2, 2], "y": ["p", "q"] * 2})
    b = a.drop(columns=["z"])
    text = conflicts({"site-1": a, "site-2": b, "site-3": a})
    assert "column 'z' is missing at site-2 (present at site-1, site-3)" in text


def test_label_named_differently_by_the_sites_bindings():
    a = frame({"x": [1, 2, 3, 4], "outcome": ["p", "q"] * 2})
    b = frame({"x": [1, 2, 3, 4], "target": ["p", "q"] * 2})
    # no --label: each site reports the label its binding names
    profiles = {"site-1": check_profile(site_profile(a, label="outcome"), "site-1"),
                "site-2": check_profile(site_profile(b, label="target"), "site-2")}
    with pytest.raises(SchemaConflict) as err:
        merge_profiles(profiles)
    text = str(err.value)
    assert "the label column is named differently: 'outcome' at site-1, 'target' at site-2" in text
    assert "label_column in its binding" in text
    # a site that names no label at all
    profiles["site-2"] = check_profile(site_profile(b, label=None), "site-2")
    with pytest.raises(SchemaConflict, match="no label column at site-2"):
        merge_profiles(profiles)


def test_ordinal_levels_that_disagree_with_a_sites_values():
    levels = {"size": ["S", "M", "L"]}
    a = frame({"size": ["S", "M", "L", "M"] * 3, "y": ["p", "q"] * 6})
    b = frame({"size": ["S", "M", "XL", RARE] * 3, "y": ["p", "q"] * 6})  # XL and RARE: 3 rows each
    schema = merge({"site-1": a, "site-2": a}, ordinal=levels, min_category_rows=1)
    assert schema.feature("size") == Feature("size", "ordinal", ("S", "M", "L"))
    text = conflicts({"site-1": a, "site-2": b}, ordinal=levels, min_category_rows=3)
    assert "ordinal column 'size': site-2 holds a value in 3 rows or more that is not one of the declared levels " \
        "S < M < L" in text
    # held by fewer than k rows: not flagged here (training stops at it, naming the line)
    assert merge({"site-1": a, "site-2": b}, ordinal=levels, min_category_rows=4).feature("size").kind == "ordinal"


def test_vertical_parties():
    ids = [f"u{i}" for i in range(6)]
    active = frame({"uid": ids, "a": range(6), "y": ["p", "q"] * 3})
    passive = frame({"uid": ids[::-1], "b": range(6), "c": ["k"] * 6})
    schema = merge({"site-1": active, "site-2": passive}, vertical=True, id_column="uid")
    assert schema.feature_names == ["a", "b", "c"] and schema.id_column == "uid" and schema.classes == ("p", "q")
    both = frame({"uid": ids, "a": range(6)})
    text = conflicts({"site-1": active, "site-2": both}, vertical=True, id_column="uid")
    assert "column 'a' is held by site-1, site-2" in text
    text = conflicts({"site-1": active, "site-2": frame({"uid": ids, "b": range(6), "y": ["p"] * 6})},
                     vertical=True, id_column="uid")
    assert "site-2 is a passive party but holds the label column 'y'" in text
    text = conflicts({"site-1": active, "site-2": frame({"b": range(6)})}, vertical=True, id_column="uid")
    assert "no id column at site-2" in text
    text = conflicts({"site-1": active, "site-2": passive.iloc[:5]}, vertical=True, id_column="uid")
    assert "different numbers of rows (site-1: 6, site-2: 5)" in text


def test_single_class_empty_and_all_rare_columns():
    a = frame({"x": [1, 2, 3], "e": ["", "?", ""], "c": ["u", "v", "w"], "y": ["p"] * 3})
    text = conflicts({"site-1": a, "site-2": a})
    assert "column 'e' holds no values at any site" in text
    assert "categorical column 'c': no value is seen in 5 rows or more at any site" in text
    assert "label column 'y' holds a single class at every site" in text
    # a column empty at one site takes its kind from the others
    b = frame({"x": [1, 2, 3], "e": ["1", "2", "3"], "c": ["u"] * 3, "y": ["p", "q", "q"]})
    assert merge({"site-1": a, "site-2": b}, min_category_rows=1).feature("e").kind == "numeric"


def test_every_conflict_at_once_in_one_error():
    a = frame({"x": [1, 2, 3, 4, 5], "z": [1] * 5, "y": ["p", "q"] * 2 + ["p"]})
    b = frame({"x": ["a", "b", "c", "d", "e"], "y": ["p", "q"] * 2 + ["p"]})
    with pytest.raises(SchemaConflict) as err:
        merge({"site-1": a, "site-2": b})
    assert len(err.value.conflicts) == 2


def test_site_refuses_data_no_schema_could_describe():
    typo = frame({"x": [str(i) for i in range(30)] + ["12O"], "y": ["p"] * 31})
    with pytest.raises(DataError) as err:
        site_profile(typo, label="y", file="/secret/path/train.csv", site="site-2")
    assert "'12O'" in str(err.value)  # for the site's own log ...
    red = err.value.redacted()  # ... while the server gets where and what, not the value or the path
    assert "12O" not in red and "/secret" not in red and "column 'x', line 32" in red
    many = frame({"id": [f"r{i // 5}" for i in range(5 * (MAX_CATEGORIES + 1))], "y": ["p"] * 5 * (MAX_CATEGORIES + 1)})
    with pytest.raises(DataError, match="is it an id column"):
        site_profile(many, label="y")
    long = frame({"c": ["v" * (MAX_NAME_CHARS + 1)] * 5, "y": ["p"] * 5})
    with pytest.raises(DataError, match="longer than"):
        site_profile(long, label="y")


GOOD = {"version": 2, "min_category_rows": 5, "n_rows": 10, "label": "y", "id_column": None, "classes": ["a", "b"],
        "columns": [{"name": "x", "kind": "numeric"}, {"name": "c", "kind": "categorical", "values": ["u"]}]}


@pytest.mark.parametrize("change", [
    lambda p: "not a dict",
    lambda p: {**p, "extra": 1},
    lambda p: {k: v for k, v in p.items() if k != "n_rows"},
    lambda p: {**p, "n_rows": True},
    lambda p: {**p, "n_rows": float("nan")},
    lambda p: {**p, "n_rows": 0},
    lambda p: {**p, "min_category_rows": 1},  # below the job's k
    lambda p: {**p, "label": "y" * (MAX_NAME_CHARS + 1)},
    lambda p: {**p, "label": " y"},
    lambda p: {**p, "classes": []},
    lambda p: {**p, "classes": ["a", "a"]},
    lambda p: {**p, "classes": [str(i) for i in range(2000)]},
    lambda p: {**p, "classes": [["nested"]]},
    lambda p: {**p, "columns": {"x": "numeric"}},
    lambda p: {**p, "columns": [{"name": "x", "kind": "numeric", "values": ["1"]}]},
    lambda p: {**p, "columns": [{"name": "x", "kind": "weird"}]},
    lambda p: {**p, "columns": [{"name": "x", "kind": "numeric"}] * 2},
    lambda p: {**p, "columns": [{"name": "y", "kind": "numeric"}]},
    lambda p: {**p, "columns": [{"name": "c", "kind": "categorical", "values": ["v"] * 3}]},
    lambda p: {**p, "columns": [{"name": "c", "kind": "categorical", "values": [str(i) for i in range(MAX_CATEGORIES + 1)]}]},
    lambda p: {**p, "columns": [{"name": "c", "kind": "categorical", "values": [1, 2]}]},
    lambda p: {**p, "columns": [{"name": "c", "kind": "ordinal", "undeclared": False}]},  # not declared ordinal
    lambda p: {**p, "columns": [{"name": "s", "kind": "ordinal", "undeclared": 3}]},  # a count, not a flag
    lambda p: {**p, "columns": [{"name": "s", "kind": "ordinal"}]},
    lambda p: {**p, "columns": [{"name": "s", "kind": "ordinal", "undeclared": False, "values": ["S"]}]},
    lambda p: {**p, "columns": [{"name": f"c{i}", "kind": "numeric"} for i in range(6000)]},
    lambda p: {**p, "columns": [{"name": "c", "kind": "categorical", "values": ["u"], "undeclared": True}]},
    lambda p: {**p, "k" * 100_000: 1},  # the message counts unknown keys, never quotes them
    lambda p: {**p, "version": np.array([1, 1])},  # FLARE decodes numpy arrays: no "ambiguous truth value"
    lambda p: {**p, "columns": [{"name": "x", "kind": np.array(["numeric", "numeric"])}]},
])
def test_a_hostile_reply_is_refused_naming_the_site_and_field(change):
    declared = {"s": ("S", "M", "L")}
    check_profile(GOOD, "site-9", min_category_rows=5, declared_ordinal=declared)  # the unchanged reply passes
    with pytest.raises(DataError) as err:
        check_profile(change(dict(GOOD)), "site-9", min_category_rows=5, declared_ordinal=declared)
    assert str(err.value).startswith("site-9: invalid schema-discovery reply: ")
    assert len(str(err.value)) < 300


def test_an_ordinal_column_reports_one_flag_checked_by_the_server():
    p = {**GOOD, "columns": [{"name": "s", "kind": "ordinal", "undeclared": True}]}
    assert check_profile(p, "site-1", declared_ordinal={"s": ("S", "M", "L")})["columns"] == p["columns"]
    for bad in (1, 0, "yes", None):  # an integer here could carry a count
        p["columns"][0]["undeclared"] = bad
        with pytest.raises(DataError, match=r"columns\[0\]\.undeclared: expected true or false"):
            check_profile(p, "site-1", declared_ordinal={"s": ("S", "M", "L")})


def single_row_site(last_zip: str, last_income: str, n=200, seed=4) -> pd.DataFrame:
    """n rows: zip codes (and cities) each held by many rows, incomes each held by few, and one last row (the one
    to hide; its city is its zip code too)."""
    rng = np.random.default_rng(seed)
    zips = [*rng.choice(["Z10001", "Z10002", "Z10003"], n - 1), last_zip]
    return frame({"zip": zips, "income": [*rng.integers(1_000, 90_000, n - 1), last_income], "city": zips,
                  "y": ["p", "q"] * (n // 2)})


def numbers_in(value) -> list:
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers_in(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers_in(v)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


@pytest.mark.parametrize("zip_levels", [
    ["Z90210"],  # the finding: 199 of 200 rows outside it, so one row held it
    ["Z10001", "Z10002", "Z10003", "Z90210"],  # every common value and the guess
    ["Z10001", "Z10002", "Z10003"],
    ["Z10001", "Z90210"],
])
def test_a_declared_ordinal_level_reveals_nothing_about_a_single_row(zip_levels):
    """A site where one row holds Z90210 (and income 987654) answers every declaration exactly as a site where
    that row holds another value: no field of the reply and no word of the merge's message tells them apart."""
    declared = {"zip": zip_levels, "income": ["987654"]}
    outcomes = []
    for last in (("Z90210", "987654"), ("Z55555", "41234"), ("Z10002", "1000")):
        sites = {"site-1": single_row_site(*last), "site-2": single_row_site("Z10001", "1000", seed=5)}
        profiles = profiles_of(sites, ordinal=declared, categorical_allowed=["income"])
        wire = json.dumps(profiles, sort_keys=True)
        try:
            merged = merge_profiles(profiles, ordinal=declared, site_order=list(sites)).to_dict()
        except SchemaConflict as exc:
            merged = str(exc)
        outcomes.append((wire, json.dumps(merged, sort_keys=True)))
        # the only numbers a site sends are the format's version, its k and its row count
        assert sorted(numbers_in(profiles["site-1"])) == [2, 5, 200]
        assert profiles["site-1"]["columns"][2] == {"name": "city", "kind": "categorical",
                                                    "values": ["Z10001", "Z10002", "Z10003"]}
    assert outcomes[0] == outcomes[1] == outcomes[2]


@pytest.mark.parametrize("declare", [{"categorical": ["income"]}, {"ordinal": {"income": ["987654"]}},
                                     {"categorical": ["typo"]}])
def test_a_numeric_column_is_read_as_categories_only_where_the_site_allows_it(declare):
    column = next(iter(declare.get("categorical") or declare.get("ordinal")))
    f = single_row_site("Z90210", "987654")
    if column == "typo":
        f["typo"] = [str(i % 7) for i in range(199)] + ["12O"]  # mostly numbers: the site reads it as numeric
    with pytest.raises(DataError) as err:
        site_profile(f, label="y", file="/secret/train.csv", site="site-2", **declare)
    red = err.value.redacted()
    assert red.startswith(f"site-2: train.csv, column '{column}': the job declares it ")
    assert "categorical_allowed" in red and "987654" not in red and "12O" not in red and "/secret" not in red
    # the site's binding allows it: the column is reported as the job declared it
    kind = site_profile(f, label="y", categorical_allowed=[column], **declare)["columns"]
    assert {c["name"]: c["kind"] for c in kind}[column] == ("ordinal" if "ordinal" in declare else "categorical")
    # a column the site reads as categories needs no permission
    f = f.drop(columns=["typo"], errors="ignore")
    assert site_profile(f, label="y", categorical=["zip"])["columns"][0]["kind"] == "categorical"
    assert site_profile(f, label="y", ordinal={"zip": ["Z10001"]})["columns"][0]["kind"] == "ordinal"


def test_merged_schema_round_trips_as_json():
    schema = merge(three_sites(pooled()))
    assert Schema.from_dict(json.loads(json.dumps(schema.to_dict()))) == schema
