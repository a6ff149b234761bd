"""Partitioners (iid, quantity skew, label skew, vertical), the global holdout and the on-disk federation."""

import json

import numpy as np
import pandas as pd
import pytest

from treeflare.data import (DataError, Feature, Schema, Table, iid, label_skew, load_dataset, prepare_federation,
                            quantity_skew, read_partition, read_site, stratified_split, vertical_columns,
                            write_federation)
from treeflare.data.partition import min_site_rows

SEEDS = range(12)


def labels(n=3000, weights=(0.5, 0.3, 0.15, 0.05), seed=123):
    return np.random.default_rng(seed).choice(len(weights), size=n, p=weights)


def assert_disjoint_cover(shards, n):
    allrows = np.concatenate(shards)
    assert len(allrows) == n, "shards overlap or miss rows"
    assert np.array_equal(np.sort(allrows), np.arange(n))


def skew(shards, y):
    """Mean total-variation distance between each site's class mix and the global mix."""
    k = int(y.max()) + 1
    glob = np.bincount(y, minlength=k) / len(y)
    tv = [0.5 * np.abs(np.bincount(y[s], minlength=k) / len(s) - glob).sum() for s in shards]
    return float(np.mean(tv))


def size_cv(shards_or_sizes):
    sizes = np.array([x if np.isscalar(x) else len(x) for x in shards_or_sizes], float)
    return sizes.std() / sizes.mean()


# -- horizontal partitioners ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["iid", "quantity", "label"])
def test_disjoint_covering_reproducible(kind):
    y = labels()
    run = {
        "iid": lambda seed: iid(len(y), 7, seed),
        "quantity": lambda seed: quantity_skew(len(y), 7, 0.5, seed),
        "label": lambda seed: label_skew(y, 7, 0.5, seed),
    }[kind]
    a, b, c = run(1), run(1), run(2)
    assert len(a) == 7
    assert_disjoint_cover(a, len(y))
    assert_disjoint_cover(c, len(y))
    assert all(np.array_equal(x, z) for x, z in zip(a, b)), "same seed must give the same shards"
    assert not all(np.array_equal(x, z) for x, z in zip(a, c)), "another seed must give other shards"
    assert all(np.all(np.diff(s) > 0) for s in a)  # sorted row indices


@pytest.mark.parametrize("n,k", [(100, 3), (1001, 10), (7, 7)])
def test_iid_sizes_equal_within_one(n, k):
    sizes = [len(s) for s in iid(n, k, seed=5)]
    assert sum(sizes) == n and max(sizes) - min(sizes) <= 1


def test_iid_class_mix_is_close_to_global():
    y = labels()
    assert skew(iid(len(y), 5, 0), y) < 0.05


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("alpha", [0.1, 1.0, 10.0])
def test_quantity_sizes_follow_the_dirichlet_draw(seed, alpha):
    n, k = 5000, 6
    sizes = np.array([len(s) for s in quantity_skew(n, k, alpha, seed)])
    # The shares are the first draw of the seeded generator; each site also gets a floor of rows.
    shares = np.random.default_rng(seed).dirichlet(np.full(k, alpha))
    floor = min_site_rows(n, k)
    expected = floor + shares * (n - floor * k)
    assert sizes.sum() == n
    assert np.all(np.abs(sizes - expected) <= 1), (sizes, expected)
    assert sizes.min() >= floor


def test_quantity_skew_grows_as_alpha_shrinks():
    n, k = 4000, 8
    cv = {a: np.mean([size_cv(quantity_skew(n, k, a, s)) for s in SEEDS]) for a in (0.1, 1.0, 100.0)}
    assert cv[0.1] > cv[1.0] > cv[100.0]
    assert cv[100.0] < 0.15 and cv[0.1] > 1.0


def test_quantity_skew_keeps_labels_iid():
    y = labels()
    assert np.mean([skew(quantity_skew(len(y), 5, 0.5, s), y) for s in SEEDS]) < 0.1


def test_label_skew_is_more_skewed_than_iid_and_grows_as_alpha_shrinks():
    y = labels()
    k = 5
    s_iid = np.mean([skew(iid(len(y), k, s), y) for s in SEEDS])
    s_lab = {a: np.mean([skew(label_skew(y, k, a, s), y) for s in SEEDS]) for a in (0.1, 1.0, 100.0)}
    assert s_lab[0.1] > s_lab[1.0] > s_lab[100.0]
    assert s_lab[0.1] > 5 * s_iid and s_lab[0.1] > 0.3


@pytest.mark.parametrize("alpha", [0.1, 0.3])
def test_label_skew_gives_every_site_a_minimum(alpha):
    y = labels(n=600)
    floor = min_site_rows(600, 6)
    assert floor == 20
    smallest = []
    for seed in range(8):
        shards = label_skew(y, 6, alpha, seed)
        assert_disjoint_cover(shards, 600)
        smallest.append(min(len(s) for s in shards))
    assert min(smallest) >= floor
    assert min(smallest) < 40  # the floor is what binds here (a draw was redrawn or close to it)


def test_label_skew_that_cannot_fill_every_site_fails_clearly():
    y = np.array([0] * 20 + [1] * 20)
    with pytest.raises(DataError, match=r"10 sites .*--alpha"):
        label_skew(y, 10, 0.01, seed=0)


def test_min_site_rows():
    assert min_site_rows(10000, 5) == 20
    assert min_site_rows(100, 5) == 10
    assert min_site_rows(3, 3) == 2


# -- holdout ----------------------------------------------------------------------------------------
def test_stratified_split():
    y = np.array([0] * 500 + [1] * 100 + [2] * 10 + [3])
    train, test = stratified_split(y, 0.2, seed=4)
    assert_disjoint_cover([train, test], len(y))
    assert np.bincount(y[test], minlength=4).tolist() == [100, 20, 2, 0]  # a single-row class stays in train
    again = stratified_split(y, 0.2, seed=4)
    assert np.array_equal(again[1], test)
    assert not np.array_equal(stratified_split(y, 0.2, seed=5)[1], test)


@pytest.fixture(scope="module")
def car():
    return load_dataset("car")


def row_keys(table):
    # Car is a full factorial design: the feature values identify a row.
    return set(map(tuple, table.frame.to_numpy(dtype=object)))


@pytest.mark.parametrize("kind,alpha", [("iid", None), ("quantity", 0.5), ("label", 0.5)])
def test_federation_rows_disjoint_and_covering(car, kind, alpha):
    fed = prepare_federation(car, 4, kind, alpha, seed=0)
    parts = [fed.server_test] + [t for s in fed.sites.values() for t in (s.train, s.test)]
    keys = [row_keys(t) for t in parts]
    assert sum(len(k) for k in keys) == len(car)
    assert set().union(*keys) == row_keys(car)
    # labels travel with their rows
    lookup = dict(zip(map(tuple, car.frame.to_numpy(dtype=object)), car.y))
    for t in parts:
        assert [lookup[r] for r in map(tuple, t.frame.to_numpy(dtype=object))] == t.y.tolist()


def test_federation_uses_the_requested_partition(car):
    def site_mix_skew(fed):
        glob = np.array(list(car.class_counts().values()), float)
        glob /= glob.sum()
        tv = []
        for s in fed.summary["sites"].values():
            c = np.array([s["class_counts"][k] + s["test_class_counts"][k] for k in car.class_counts()], float)
            tv.append(0.5 * np.abs(c / c.sum() - glob).sum())
        return np.mean(tv)

    def sizes(fed):
        return [s["n_train"] + s["n_test"] for s in fed.summary["sites"].values()]

    seeds = range(4)
    iid_fed = [prepare_federation(car, 4, "iid", None, seed=s) for s in seeds]
    lab_fed = [prepare_federation(car, 4, "label", 0.2, seed=s) for s in seeds]
    qty_fed = [prepare_federation(car, 4, "quantity", 0.2, seed=s) for s in seeds]
    assert all(max(sizes(f)) - min(sizes(f)) <= 2 for f in iid_fed)
    assert np.mean([site_mix_skew(f) for f in lab_fed]) > 4 * np.mean([site_mix_skew(f) for f in iid_fed])
    assert np.mean([site_mix_skew(f) for f in qty_fed]) < 0.1
    assert np.mean([size_cv(sizes(f)) for f in qty_fed]) > 0.5


def test_global_holdout_is_stratified_and_taken_before_partitioning(car):
    a = prepare_federation(car, 4, "iid", None, seed=3)
    b = prepare_federation(car, 6, "label", 0.3, seed=3)
    c = prepare_federation(car, 4, "iid", None, seed=4)
    counts = car.class_counts()
    assert a.server_test.class_counts() == {k: round(0.2 * v) for k, v in counts.items()}
    assert row_keys(a.server_test) == row_keys(b.server_test)  # independent of the partition
    assert row_keys(a.server_test) != row_keys(c.server_test)  # but not of the seed
    for s in a.sites.values():  # each site's local 80/20 split
        n = len(s.train) + len(s.test)
        assert abs(len(s.test) - 0.2 * n) <= 3


def test_summary_sizes_and_counts(car):
    fed = prepare_federation(car, 5, "quantity", 0.5, seed=1)
    s = fed.summary
    assert s["n_sites"] == 5 and list(s["sites"]) == [f"site-{i}" for i in range(1, 6)]
    assert s["partition"] == {"kind": "quantity", "alpha": 0.5, "seed": 1, "test_size": 0.2,
                              "local_test_size": 0.2}
    total = s["server"]["n_test"] + sum(v["n_train"] + v["n_test"] for v in s["sites"].values())
    assert total == len(car)
    for cls, n in car.class_counts().items():
        got = s["server"]["class_counts"][cls] + sum(
            v["class_counts"][cls] + v["test_class_counts"][cls] for v in s["sites"].values())
        assert got == n
    assert Schema.from_dict(s["schema"]) == car.schema


def test_write_and_read_back(car, tmp_path):
    fed = prepare_federation(car, 3, "label", 1.0, seed=2)
    out = write_federation(fed, tmp_path / "fed")
    assert sorted(p.name for p in out.iterdir()) == [".treeflare-federation.json", "partition.json", "server", "site-1", "site-2",
                                                      "site-3"]
    assert json.loads((out / "partition.json").read_text()) == json.loads(json.dumps(fed.summary))
    assert read_partition(out)["n_sites"] == 3
    header = (out / "site-2" / "train.csv").read_text().splitlines()[0]
    assert header == ",".join(car.schema.feature_names + ["class"])
    for name, site in fed.sites.items():
        back = read_site(out, name)
        pd.testing.assert_frame_equal(back.train.frame, site.train.frame)
        assert back.train.y.tolist() == site.train.y.tolist()
        assert back.test.y.tolist() == site.test.y.tolist()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary leftovers
    (tmp_path / "plain").mkdir()  # the folder gets the umask's permissions, like any mkdir (not 0700)
    assert out.stat().st_mode == (tmp_path / "plain").stat().st_mode


def test_written_numeric_and_missing_values_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    n = 120
    frame = pd.DataFrame({"x": rng.normal(size=n), "c": rng.choice(["a", "b", None], size=n)})
    frame.loc[::7, "x"] = np.nan
    schema = Schema((Feature("x", "numeric"), Feature("c", "categorical", ("a", "b"))), "y", ("n", "p"))
    t = Table(frame, rng.choice(["n", "p"], size=n).astype(object), schema, name="toy")
    fed = prepare_federation(t, 2, "iid", None, seed=0)
    out = write_federation(fed, tmp_path / "fed")
    for name, site in fed.sites.items():
        back = read_site(out, name).train
        np.testing.assert_array_equal(back.frame["x"].to_numpy(), site.train.frame["x"].to_numpy())
        assert back.frame["c"].isna().tolist() == site.train.frame["c"].isna().tolist()
        assert np.isnan(back.codes()[0]).sum() == np.isnan(site.train.codes()[0]).sum() > 0


# -- vertical ---------------------------------------------------------------------------------------
def id_table(n=200, seed=0):
    rng = np.random.default_rng(seed)
    feats = [Feature(f"n{i}", "numeric") for i in range(5)] + [Feature("c", "categorical", ("u", "v"))]
    frame = pd.DataFrame({f"n{i}": rng.normal(size=n) for i in range(5)})
    frame["c"] = rng.choice(["u", "v"], size=n)
    schema = Schema(tuple(feats), "y", ("0", "1"), id_column="uid")
    ids = np.array([f"id{i:04d}" for i in rng.permutation(n)], dtype=object)
    return Table(frame, rng.choice(["0", "1"], size=n).astype(object), schema, ids, "toy")


def test_vertical_columns_split():
    cols = [f"f{i}" for i in range(7)]
    groups = vertical_columns(cols, 2)
    assert groups == [["f0", "f1", "f2"], ["f3", "f4"], ["f5", "f6"]]
    assert vertical_columns(cols, 6) == [[c] for c in cols]


@pytest.mark.parametrize("n_passive", [1, 2])
def test_vertical_federation(tmp_path, n_passive):
    t = id_table()
    fed = prepare_federation(t, n_sites=0, vertical=True, n_passive=n_passive, seed=1)
    assert fed.site_names == [f"site-{i}" for i in range(1, n_passive + 2)]
    cols = [s.train.schema.feature_names for s in fed.sites.values()]
    assert sum(cols, []) == t.schema.feature_names  # disjoint, covering, in order
    active, *passive = fed.sites.values()
    assert active.train.y is not None and active.train.schema.classes == ("0", "1")
    assert all(p.train.y is None and p.test.y is None and p.train.schema.classes == () for p in passive)
    for s in fed.sites.values():  # every party holds the same rows, in the same order
        assert s.train.ids.tolist() == active.train.ids.tolist()
        assert s.test.ids.tolist() == fed.server_test.ids.tolist()
    assert len(active.train) + len(fed.server_test) == len(t)
    assert not set(active.train.ids) & set(fed.server_test.ids)
    # rows stay aligned with the original table through the id
    by_id = dict(zip(t.ids, t.frame["n0"]))
    assert [by_id[i] for i in active.train.ids] == active.train.frame["n0"].tolist()

    out = write_federation(fed, tmp_path / "vfl")
    assert (out / "server" / "test.csv").read_text().splitlines()[0] == "uid,y"
    head = (out / "site-2" / "train.csv").read_text().splitlines()[0].split(",")
    assert head[0] == "uid" and "y" not in head and head[1:] == cols[1]
    assert json.loads((out / "partition.json").read_text())["partition"]["n_passive"] == n_passive
    back = read_site(out, "site-2")
    assert back.train.y is None and back.train.ids.tolist() == active.train.ids.tolist()
    back1 = read_site(out, "site-1")
    assert back1.train.y.tolist() == active.train.y.tolist()


# -- every site gets training and test rows, however many sites ---------------------------------------
@pytest.mark.parametrize("kind, alpha", [("iid", None), ("quantity", 0.5), ("label", 5.0)])
def test_site_count_that_starves_a_site_is_refused(car, kind, alpha):
    with pytest.raises(DataError, match=r"--sites 1000: the 1382 rows .* fewer than 2 rows .* at most 691 sites"):
        prepare_federation(car, 1000, kind, alpha, seed=0)


@pytest.mark.parametrize("kind, alpha", [("iid", None), ("quantity", 0.5)])
def test_the_largest_allowed_site_count_gives_every_site_train_and_test_rows(car, kind, alpha):
    fed = prepare_federation(car, 691, kind, alpha, seed=0)
    assert min(min(len(s.train), len(s.test)) for s in fed.sites.values()) >= 1
