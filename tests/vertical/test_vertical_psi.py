"""The vertical tree job after a private set intersection (issue 22): 3 parties at 70% overlap, each holding rows
the others lack, in its own order. Every party keeps the intersection (as the PSI phase leaves it in its run
folder), restricts its rows to it sorted by id, and the model it trains is bit-identical to the plaintext oracle
on the intersection rows; prediction of new rows at partial overlap scores the rows all parties hold, equal to the
oracle's, and tells the active party how many of its own it could not score. In process (real Paillier, small
test key), then once in the FLARE simulator with the tree model (the GBDT run and the prediction job at partial
overlap are in ``tests/vertical/test_vertical_job.py``)."""
from __future__ import annotations

import importlib

import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from treeflare.data import DataError, join_parties, load_csv, prepare_federation
from treeflare.data.csv_io import party_rows_table, read_raw
from treeflare.data.intersection import psi_items, write_intersection
from treeflare.flare.psi.protocol import intersection_dir
from treeflare.flare.vertical.executor import kept_rows, labels_for
from treeflare.vertical import (ActiveParty, PassiveParty, PassivePolicy, ProtocolError, VerticalData, VerticalParams,
                                close_parties, compare_runs, run_oracle, run_protocol)
from treeflare.vertical.model_parts import prediction_site_files
from treeflare.vertical.prediction import ActivePredictor, PassivePredictor, run_prediction

from flare_helpers import run_script

SITES = ["site-1", "site-2", "site-3"]
OVERLAP = 0.7


def _csv(path, n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    z = X[:, 0] + X[:, 3] - X[:, 4] + 0.3 * rng.normal(size=n)
    lines = ["uid,f0,f1,f2,f3,f4,target"]
    lines += [f"u{i}," + ",".join(f"{v:.5f}" for v in X[i]) + f",{'yes' if z[i] > 0 else 'no'}" for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _psi(items_by_site: dict, run_root) -> None:
    """What the PSI phase leaves at each party: the items every party holds, in its own run folder."""
    common = set.intersection(*(set(items) for items in items_by_site.values()))
    for site, items in items_by_site.items():
        write_intersection(intersection_dir(run_root / site), [i for i in items if i in common], site=site)


def _params(model):
    return VerticalParams(model=model, key_bits=512, allow_insecure_key=True, workers=1, max_depth=3, bins=8,
                          min_rows_node=5, n_trees=1 if model == "tree" else 2)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("psi")
    csv = _csv(tmp / "small.csv")
    table = load_csv(csv, label="target", id_column="uid")
    fed = prepare_federation(table, n_sites=3, seed=0, vertical=True, n_passive=2, overlap=OVERLAP)
    _psi({s: psi_items({k: getattr(fed.sites[s], k).ids for k in ("train", "test")}) for s in SITES}, tmp / "run")
    kept = {s: tuple(kept_rows(getattr(fed.sites[s], k), tmp / "run" / s, s, k)[0] for k in ("train", "test"))
            for s in SITES}
    return tmp, csv, table, fed, kept


def test_each_party_keeps_the_shared_rows_sorted_by_id(world):
    _tmp, _csv_path, _table, fed, kept = world
    trains = {s: [str(v) for v in fed.sites[s].train.ids] for s in SITES}
    shared = set.intersection(*map(set, trains.values()))
    for s in SITES:                          # each party holds rows of its own, in its own order
        assert len(shared) < len(trains[s]) and abs(len(shared) / len(trains[s]) - OVERLAP) < 0.02
    assert len({tuple(t) for t in trains.values()}) == 3
    for s in SITES:
        train, test = kept[s]
        assert list(train.ids) == sorted(shared)          # the same customers, in the same order, everywhere
        assert sorted(test.ids) == list(test.ids) == sorted(map(str, fed.server_test.ids))
    # a hand-damaged intersection naming an id the party does not hold is refused, naming no id
    tmp = world[0]
    write_intersection(intersection_dir(tmp / "bad"), ["train:nobody-here"], site="site-2")
    with pytest.raises(DataError, match="site-2: 1 id.* not among its own rows") as e:
        kept_rows(fed.sites["site-2"].train, tmp / "bad", "site-2", "train")
    assert "nobody" not in str(e.value)


def _parties(kept, P, tables=None):
    tables = tables or kept
    train, test = tables["site-1"]
    y, _yt, n_classes = labels_for(P, train, test)
    active = ActiveParty("site-1", train.codes()[0], y, test.codes()[0], train.codes()[1], n_classes, SITES[1:], P,
                         ids_train=list(train.ids), ids_test=list(test.ids))
    passives = {s: PassiveParty(s, tables[s][0].codes()[0], tables[s][1].codes()[0], tables[s][0].codes()[1],
                                ids_train=list(tables[s][0].ids), ids_test=list(tables[s][1].ids), workers=1,
                                policy=PassivePolicy(min_key_bits=512, min_rows_node=P.min_rows_node))
                for s in SITES[1:]}
    return active, passives


def _oracle_data(fed, P, test_tables=None) -> VerticalData:
    """The oracle's input, built independently of the parties: their tables joined on the ids all hold (P1's
    ``join_parties``). ``test_tables``: the rows to predict instead of the test rows (new rows have no label)."""
    train = join_parties([fed.sites[s].train for s in SITES])
    test = join_parties(test_tables or [fed.sites[s].test for s in SITES])
    y = labels_for(P, train, train)[0]
    blocks = [fed.sites[s].train.schema.feature_names for s in SITES]

    def cols(t, names):
        return t.columns(names, keep_label=False).codes()[0]

    return VerticalData(X_active=cols(train, blocks[0]), y=y, X_passive=[cols(train, b) for b in blocks[1:]],
                        X_active_test=cols(test, blocks[0]), y_test=None,
                        X_passive_test=[cols(test, b) for b in blocks[1:]], names_active=blocks[0],
                        names_passive=blocks[1:], n_classes=len(fed.schema.classes), ids_train=list(train.ids),
                        ids_test=list(test.ids))


@pytest.mark.parametrize("model", ["tree", "gbdt"])
def test_model_after_psi_is_bit_identical_to_the_oracle_on_the_intersection(world, model):
    _tmp, _csv_path, _table, fed, kept = world
    P = _params(model)
    active, passives = _parties(kept, P)
    try:
        run_protocol(active, passives)
    finally:
        close_parties(active, passives)
    oracle = run_oracle(_oracle_data(fed, P), P)
    cmp = compare_runs((active, passives), oracle)
    assert cmp == {"identical": True, "same_tree": True, "same_predictions": True}
    assert active.n == len(kept["site-1"][0]) < len(fed.sites["site-1"].train)
    assert {nd["owner"] for t in active.trees for nd in t["nodes"] if not nd["leaf"]} - {"site-1"}  # passive splits


def test_parties_on_their_own_rows_without_psi_refuse(world):
    """Without the restriction the parties' rows differ: the setup's row counts or encrypted alignment values stop
    the run before any answer."""
    _tmp, _csv_path, _table, fed, _kept = world
    P = _params("tree")
    active, passives = _parties(None, P, tables={s: (fed.sites[s].train, fed.sites[s].test) for s in SITES})
    try:
        with pytest.raises(ProtocolError, match="site-[23]: .*(row counts differ|different sample ids)"):
            run_protocol(active, passives)
    finally:
        close_parties(active, passives)


def test_prediction_at_partial_overlap_scores_the_intersection_like_the_oracle(world):
    tmp, csv, _table, fed, kept = world
    P = _params("gbdt")
    active, passives = _parties(kept, P)
    try:
        run_protocol(active, passives)
    finally:
        close_parties(active, passives)
    parts = {"site-1": {**active.model(), "schema": kept["site-1"][0].schema.to_dict()},
             **{s: {**passives[s].model(), "schema": kept[s][0].schema.to_dict()} for s in SITES[1:]}}
    # the new rows: every row of the CSV, dealt to the parties at 70% overlap as the job's --csv split does
    files = prediction_site_files(read_raw(csv), parts, SITES, overlap=OVERLAP, seed=3)
    rows = {s: party_rows_table(read_raw("predict.csv", opener=lambda s=s: io.StringIO(files[f"{s}/predict.csv"])),
                                kept[s][0].schema, site=s, name=s) for s in SITES}
    _psi({s: psi_items({"predict": rows[s].ids}) for s in SITES}, tmp / "predict")
    scored = {s: kept_rows(rows[s], tmp / "predict" / s, s, "predict") for s in SITES}
    shared = set.intersection(*(set(map(str, rows[s].ids)) for s in SITES))
    assert scored["site-1"][1] == len(rows["site-1"]) - len(shared) > 0          # the active party's unscored rows
    ap = ActivePredictor("site-1", json.loads(json.dumps(parts["site-1"])), scored["site-1"][0].codes()[0],
                         list(scored["site-1"][0].ids))
    pps = {s: PassivePredictor(s, json.loads(json.dumps(parts[s])), scored[s][0].codes()[0], list(scored[s][0].ids))
           for s in SITES[1:]}
    run_prediction(ap, pps)
    assert ap.row_ids == sorted(shared)
    # the oracle: the same training, then its own prediction of the joined new rows the parties share
    oracle, _ = run_oracle(_oracle_data(fed, P, [rows[s] for s in SITES]), P)
    assert np.array_equal(ap.pred, oracle.test_pred) and np.array_equal(ap.score, oracle.test_score)


def test_psi_min_rows_is_checked_before_anything_is_written(tmp_path, capsys):
    job = importlib.import_module("treeflare.jobs.vertical_tree")
    with pytest.raises(SystemExit) as e:
        job.main(["--dataset", "car", "--psi-min-rows", "0", "--workspace", str(tmp_path / "ws")])
    assert e.value.code == 2 and "--psi-min-rows must be an integer >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "ws").exists()


def _site_ids(folder, name):
    return [line.split(",", 1)[0] for line in (folder / name).read_text().splitlines()[1:]]


@pytest.mark.flare
def test_simulator_tree_at_70_percent_overlap_trains_on_the_intersection(tmp_path):
    """3 parties at 70% overlap in the FLARE simulator: the PSI phase runs first, each party keeps the shared ids
    in its own run folder, the tree equals the plaintext oracle on those rows, and no id reaches the server."""
    csv = _csv(tmp_path / "small.csv")
    ws = tmp_path / "ws"
    proc = run_script("jobs/vertical_tree/job.py",
                      ["--model", "tree", "--csv", str(csv), "--label", "target", "--id", "uid", "--passive", "2",
                       "--max-depth", "2", "--bins", "8", "--key-bits", "512", "--allow-insecure-key", "--workers",
                       "1", "--min-rows-node", "5", "--overlap", str(OVERLAP), "--workspace", str(ws)], tmp_path,
                      timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((ws / "report.json").read_text())
    assert r["identical_to_oracle"] is True and r["oracle"]["same_tree"] is True
    assert r["id_column"] == "uid"      # what a prediction run on real sites gives its PSI phase to read
    own = {s: {k: _site_ids(ws / "data" / s, f"{k}.csv") for k in ("train", "test")} for s in SITES}
    shared = {k: set.intersection(*(set(own[s][k]) for s in SITES)) for k in ("train", "test")}
    assert 0 < len(shared["train"]) < min(len(own[s]["train"]) for s in SITES)
    assert r["n_train"] == len(shared["train"]) and r["n_test"] == len(shared["test"])
    psi = r["psi"]
    assert psi["status"] == "completed" and psi["intersection_size"] == len(shared["train"]) + len(shared["test"])
    for s in SITES:
        p = psi["parties"][s]
        assert p["rows_before"] == {k: len(own[s][k]) for k in ("train", "test")}
        assert p["rows_after"] == {k: len(shared[k]) for k in ("train", "test")}
        assert p["seconds"] > 0 and p["bytes_sent"] > 0 and p["bytes_received"] > 0
        kept = json.loads(next((ws / "flare").glob(f"*/{s}/simulate_job/psi/intersection.json")).read_text())
        assert {k: set(v) for k, v in kept["ids"].items()} == shared        # each party keeps the intersection
    assert "private set intersection" in proc.stdout and "rows before (train / test)" in proc.stdout
    outputs = {line.rsplit(None, 1)[0].strip(): line.split()[-1]         # the summary's outputs: list
               for line in proc.stdout[proc.stdout.index("\noutputs:\n"):].splitlines()[2:] if line.strip()}
    assert all(Path(outputs[f"{s}'s intersection"]).is_file() for s in SITES), outputs
    # the server's folder holds no id of any party (its result files and its log)
    ids = set().union(*(set(own[s]["train"]) | set(own[s]["test"]) for s in SITES))
    server = next((ws / "flare").glob("*/server"))
    assert ids and all(re.fullmatch(r"\w+", i) for i in ids)  # so every id is a whole word of any text holding it
    for path in server.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".txt", ".log"):
            words = set(re.findall(r"\w+", path.read_text(errors="replace")))
            assert not words & ids, path
