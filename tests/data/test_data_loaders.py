"""Embedded dataset loaders (exact counts of each data/<name>/SOURCE.md), CSV type inference, encodings."""

from functools import lru_cache

import numpy as np
import pandas as pd
import pytest

from treeflare.data import DATASETS, Table, load_csv, load_dataset

ADULT_NUMERIC = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
ADULT_CATEGORICAL = ["workclass", "education", "marital-status", "occupation", "relationship", "race", "sex",
                     "native-country"]


@lru_cache(maxsize=None)
def load(name, part="train") -> Table:
    return load_dataset(name, part)


# name, part, rows, label, class counts, numeric features, categorical features (+ ordinal: ORDINAL_COUNT)
ORDINAL_COUNT = {"nursery": 7, "car": 6}
EXPECTED = [
    ("nursery", "train", 12960, "class",
     {"not_recom": 4320, "priority": 4266, "recommend": 2, "spec_prior": 4044, "very_recom": 328}, 0, 1),
    ("car", "train", 1728, "class", {"unacc": 1210, "acc": 384, "good": 69, "vgood": 65}, 0, 0),
    ("adult", "train", 32561, "income", {"<=50K": 24720, ">50K": 7841}, 6, 8),
    ("adult", "test", 16281, "income", {"<=50K": 12435, ">50K": 3846}, 6, 8),
    ("default_credit_card", "train", 30000, "default", {"0": 23364, "1": 6636}, 23, 0),
    ("higgs_subset", "train", 7000, "signal", {"1": 3716, "0": 3284}, 28, 0),
    ("higgs_subset", "test", 500, "signal", {"1": 272, "0": 228}, 28, 0),
]


def test_every_embedded_dataset_is_covered():
    assert sorted({e[0] for e in EXPECTED}) == sorted(DATASETS)


@pytest.mark.parametrize("name,part,rows,label,counts,n_num,n_cat", EXPECTED,
                         ids=[f"{e[0]}-{e[1]}" for e in EXPECTED])
def test_loader_counts(name, part, rows, label, counts, n_num, n_cat):
    t = load(name, part)
    assert len(t) == rows
    assert len(t.y) == rows
    assert t.schema.label == label
    assert t.class_counts() == counts
    assert sorted(t.schema.classes) == sorted(counts)
    assert t.n_features == n_num + n_cat + ORDINAL_COUNT.get(name, 0)
    assert len(t.schema.numeric) == n_num
    assert len(t.schema.categorical) == n_cat
    assert len(t.schema.ordinal) == ORDINAL_COUNT.get(name, 0)
    assert list(t.frame.columns) == t.schema.feature_names
    assert label not in t.frame.columns
    for f in t.schema.numeric:
        assert t.frame[f].dtype == np.float64, f
    # y_codes index schema.classes, consistently with the class names
    codes = t.y_codes()
    assert np.array_equal(np.asarray(t.schema.classes, dtype=object)[codes], t.y)


NURSERY_VALUES = {
    "parents": {"usual", "pretentious", "great_pret"},
    "has_nurs": {"proper", "less_proper", "improper", "critical", "very_crit"},
    "form": {"complete", "completed", "incomplete", "foster"},
    "children": {"1", "2", "3", "more"},
    "housing": {"convenient", "less_conv", "critical"},
    "finance": {"convenient", "inconv"},
    "social": {"nonprob", "slightly_prob", "problematic"},
    "health": {"recommended", "priority", "not_recom"},
}
CAR_VALUES = {
    "buying": {"vhigh", "high", "med", "low"},
    "maint": {"vhigh", "high", "med", "low"},
    "doors": {"2", "3", "4", "5more"},
    "persons": {"2", "4", "more"},
    "lug_boot": {"small", "med", "big"},
    "safety": {"low", "med", "high"},
}


@pytest.mark.parametrize("name,values", [("nursery", NURSERY_VALUES), ("car", CAR_VALUES)])
def test_categorical_datasets_columns_and_categories(name, values):
    t = load(name)
    assert t.schema.feature_names == list(values)
    for f in t.schema.features:
        assert f.kind == ("categorical" if f.name == "form" else "ordinal")
        assert set(f.categories) == values[f.name]
        assert set(t.frame[f.name]) == values[f.name]  # no missing values, nothing unexpected
    assert t.schema.id_column is None


def test_ordinal_levels_of_the_embedded_datasets():
    """Car's graded scales, lowest first; nursery's UCI value lists in their order (form is not ordered)."""
    car = {f.name: f.categories for f in load("car").schema.features}
    assert car == {"buying": ("low", "med", "high", "vhigh"), "maint": ("low", "med", "high", "vhigh"),
                   "doors": ("2", "3", "4", "5more"), "persons": ("2", "4", "more"),
                   "lug_boot": ("small", "med", "big"), "safety": ("low", "med", "high")}
    nursery = load("nursery").schema
    assert nursery.ordinal == ["parents", "has_nurs", "children", "housing", "finance", "social", "health"]
    assert nursery.feature("has_nurs").categories == ("proper", "less_proper", "improper", "critical", "very_crit")
    assert nursery.feature("form").kind == "categorical"
    assert nursery.feature("form").categories == ("complete", "completed", "foster", "incomplete")


def test_car_is_the_full_factorial_design():
    # 4*4*4*3*3*3 = 1728: every combination once, so the rows are unique.
    t = load("car")
    assert not t.frame.duplicated().any()


@pytest.mark.parametrize("part,n_missing", [("train", 4262), ("test", 2203)])
def test_adult_kinds_and_missing_values(part, n_missing):
    t = load("adult", part)
    assert t.schema.numeric == ADULT_NUMERIC
    assert t.schema.categorical == ADULT_CATEGORICAL
    missing = t.frame.isna().sum()
    assert missing.sum() == n_missing
    assert set(missing[missing > 0].index) == {"workclass", "occupation", "native-country"}
    assert not t.frame[ADULT_NUMERIC].isna().any().any()
    for f in t.schema.categorical:
        cats = t.schema.feature(f).categories
        assert "?" not in cats and all(c == c.strip() and c for c in cats)
    X, names, kinds = t.codes()
    assert int(np.isnan(X).sum()) == n_missing
    # labels: the test file's trailing dot is stripped
    assert set(t.y) == {"<=50K", ">50K"}


def test_adult_train_and_test_share_one_encoding():
    train, test = load("adult"), load("adult", "test")
    assert train.schema == test.schema
    assert train.frame.iloc[0]["age"] == 39.0 and train.frame.iloc[0]["workclass"] == "State-gov"


def test_credit_card_names_ids_and_first_row():
    t = load("default_credit_card")
    assert t.schema.id_column == "ID"
    assert "ID" not in t.frame.columns
    assert t.schema.feature_names[:6] == ["LIMIT_BAL", "SEX", "EDUCATION", "MARRIAGE", "AGE", "PAY_0"]
    assert t.schema.feature_names[-1] == "PAY_AMT6"
    assert len(set(t.ids)) == 30000 and t.ids[0] == "1"
    first = [20000, 2, 2, 1, 24, 2, 2, -1, -1, -2, -2, 3913, 3102, 689, 0, 0, 0, 0, 689, 0, 0, 0, 0]
    assert t.frame.iloc[0].tolist() == first
    assert t.y[0] == "1"


def test_higgs_names_and_classes():
    t = load("higgs_subset")
    assert t.schema.classes == ("0", "1")
    assert t.schema.feature_names[0] == "lepton_pt" and t.schema.feature_names[-1] == "m_wwbb"
    assert t.frame.iloc[0]["lepton_pt"] == pytest.approx(0.869)
    assert load("higgs_subset", "test").schema == t.schema


# -- encodings --------------------------------------------------------------------------------------
def test_codes_index_the_schema_categories():
    t = load("car")
    X, names, kinds = t.codes()
    assert X.shape == (1728, 6)
    assert names == t.schema.feature_names and kinds == ["ordinal"] * 6
    assert not np.isnan(X).any()
    for j, f in enumerate(t.schema.features):
        decoded = np.asarray(f.categories, dtype=object)[X[:, j].astype(int)]
        assert np.array_equal(decoded, t.frame[f.name].to_numpy(dtype=object))


def test_onehot_shape_names_and_rows():
    t = load("nursery")
    X, names = t.onehot()
    assert X.shape == (12960, 7 + 4)  # seven ordinal columns as they are, four for the categorical form
    assert names[:6] == ["parents", "has_nurs", "form=complete", "form=completed", "form=foster", "form=incomplete"]
    assert names == t.schema.onehot_names()
    form = X[:, 2:6]
    assert set(np.unique(form)) == {0.0, 1.0} and np.all(form.sum(axis=1) == 1)  # one hot
    j = names.index("form=foster")
    assert X[:, j].sum() == (t.frame["form"] == "foster").sum()
    codes = t.codes()[0]
    assert np.array_equal(X[:, 0], codes[:, 0]) and np.array_equal(X[:, 6:], codes[:, 3:])  # ordinal: its codes


def test_onehot_mixed_numeric_and_missing():
    t = load("adult").subset(np.arange(2000))
    X, names = t.onehot()
    n_cols = 6 + sum(len(t.schema.feature(f).categories) for f in ADULT_CATEGORICAL)
    assert X.shape == (2000, n_cols)
    assert names[0] == "age" and np.array_equal(X[:, 0], t.frame["age"].to_numpy())
    block = [i for i, n in enumerate(names) if n.startswith("workclass=")]
    row_sums = X[:, block].sum(axis=1)
    missing = t.frame["workclass"].isna().to_numpy()
    assert missing.any()
    assert np.all(row_sums[missing] == 0) and np.all(row_sums[~missing] == 1)


def test_unseen_category_is_nan_code_and_all_zero_onehot():
    nursery = load("nursery")
    frame = nursery.frame.iloc[:3].copy().reset_index(drop=True)
    frame.loc[1, "form"] = "ultra"  # not in the schema's categories
    t = Table(frame, nursery.y[:3], nursery.schema)
    X, _, _ = t.codes()
    assert np.isnan(X[1, 2]) and not np.isnan(X[0, 2]) and not np.isnan(np.delete(X[1], 2)).any()
    H, names = t.onehot()
    form = [i for i, n in enumerate(names) if n.startswith("form=")]
    assert H[1, form].sum() == 0 and H[0, form].sum() == 1


# -- your own CSV -----------------------------------------------------------------------------------
MIXED = """id,age,city,zip,score,y
a1,30,Paris,75001,1.5,yes
a2,41,Lyon,69001,,no
a3, 25 ,?,13001,2.0,yes
a4,NA,Paris,75002,3.25,no
a5,52,Nice,06000,0,yes
"""


def test_csv_type_inference_missing_values_and_id(make_csv):
    t = load_csv(make_csv(MIXED), label="y", id_column="id")
    s = t.schema
    assert s.feature_names == ["age", "city", "zip", "score"]  # id and label are not features
    assert s.kinds == ["numeric", "categorical", "numeric", "numeric"]
    assert s.feature("city").categories == ("Lyon", "Nice", "Paris")  # '?' is missing, not a category
    assert s.classes == ("no", "yes")
    assert t.ids.tolist() == ["a1", "a2", "a3", "a4", "a5"]
    assert t.frame["age"].tolist()[:3] == [30.0, 41.0, 25.0] and np.isnan(t.frame["age"][3])
    assert np.isnan(t.frame["score"][1])  # an empty numeric cell is missing (NaN), not an error
    assert pd.isna(t.frame["city"][2])
    assert t.name == "data"


def test_csv_forced_categorical(make_csv):
    t = load_csv(make_csv(MIXED), label="y", categorical=["zip"], id_column="id")
    assert t.schema.feature("zip").kind == "categorical"
    assert "06000" in t.schema.feature("zip").categories  # kept as text, leading zero intact
    assert t.schema.feature("age").kind == "numeric"


def test_csv_numeric_labels_normalised(make_csv):
    t = load_csv(make_csv("x,y\n1,1\n2,0.0\n3,1.0\n4,0\n"), label="y")
    assert t.schema.classes == ("0", "1")
    assert t.y.tolist() == ["1", "0", "1", "0"]


def test_csv_with_given_schema_reuses_its_encoding(make_csv):
    first = load_csv(make_csv("c,y\nb,0\na,1\n", "a.csv"), label="y")
    second = load_csv(make_csv("c,y\nz,1\nb,0\n", "b.csv"), label="y", schema=first.schema)
    assert second.schema.feature("c").categories == ("a", "b")
    X, _, _ = second.codes()
    assert np.isnan(X[0, 0]) and X[1, 0] == 1.0
