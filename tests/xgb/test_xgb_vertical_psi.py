"""jobs/xgb_histogram --mode vertical with its PSI phase (issue 22).

In process (cheap): ``TreeflareXGBDataLoader`` keeps only the rows of the intersection the PSI phase left in the
site's run folder, sorted by id, and refuses clearly when there is none; both transports' jobs put the PSI
workflows before training's, and horizontal jobs have none. In the simulator (one run, direct, small data,
few rounds): 3 parties at 70% overlap, the PSI phase first, predictions identical to centralized XGBoost trained on
the intersection rows, and the report's ``psi`` block.
"""

from __future__ import annotations

import importlib

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("tensorboard")  # a hard import of nvflare.app_opt.xgboost
xgb = pytest.importorskip("xgboost")

from treeflare.data import DataError, load_dataset, prepare_federation, read_site, write_federation  # noqa: E402
from treeflare.data.intersection import psi_items, write_intersection  # noqa: E402
from treeflare.xgb.encoding import table_arrays  # noqa: E402

SITES = ["site-1", "site-2", "site-3"]


class _Workspace:
    def __init__(self, run_dir):
        self.run_dir = run_dir

    def get_run_dir(self, job_id):
        assert job_id == "job-1"
        return str(self.run_dir)

    def get_site_config_dir(self):
        raise RuntimeError("no kit here")  # as outside a startup kit: no site binding


def _fl_ctx(run_dir):
    engine = SimpleNamespace(get_workspace=lambda: _Workspace(run_dir))
    return SimpleNamespace(get_engine=lambda: engine, get_job_id=lambda: "job-1")


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """car, vertical over 3 parties, written as the job writes it."""
    root = tmp_path_factory.mktemp("fed") / "federation"
    fed = prepare_federation(load_dataset("car"), 3, vertical=True, n_passive=2)
    write_federation(fed, root)
    return root, fed


def _loader(root, fed, site, run_dir, *, psi=True):
    from nvflare.apis.event_type import EventType

    from treeflare.flare.xgb.data_loader import TreeflareXGBDataLoader

    loader = TreeflareXGBDataLoader(folder=str(root), schema=fed.schema.to_dict(), vertical=True, psi=psi)
    loader.initialize(client_id=site, rank=SITES.index(site), data_split_mode=xgb.core.DataSplitMode.COL)
    loader.handle_event(EventType.START_RUN, _fl_ctx(run_dir))
    return loader


def _kept(root, rng):
    """An intersection as PSI gives it: a random part of the ids every party holds, per kind."""
    sets = {kind: None for kind in ("train", "test")}
    for site in SITES:
        sd = read_site(root, site)
        for kind, table in (("train", sd.train), ("test", sd.test)):
            ids = {str(v) for v in table.ids}
            sets[kind] = ids if sets[kind] is None else sets[kind] & ids
    return {kind: sorted(rng.choice(sorted(ids), size=int(0.7 * len(ids)), replace=False))
            for kind, ids in sets.items()}


def test_loader_keeps_the_intersection_sorted_by_id(federation, tmp_path):
    from treeflare.flare.psi.protocol import intersection_dir

    root, fed = federation
    kept = _kept(root, np.random.default_rng(3))
    parts = {}
    for site in SITES:
        run_dir = tmp_path / site
        write_intersection(intersection_dir(run_dir), psi_items(kept), site=site)
        train, valid = _loader(root, fed, site, run_dir)._load()
        for arrays, kind in ((train, "train"), (valid, "test")):
            assert list(arrays.ids.astype(str)) == kept[kind]  # exactly the kept rows, in id order
        # the same rows and values as this party's own file, row for row
        own = read_site(root, site).train
        index = {str(v): i for i, v in enumerate(own.ids)}
        expected = table_arrays(own.subset(np.array([index[v] for v in kept["train"]])))
        np.testing.assert_array_equal(train.X, expected.X)
        assert (train.y is not None) == (site == "site-1")  # the label stays with the label owner
        if train.y is not None:
            np.testing.assert_array_equal(train.y, expected.y)
        parts[site] = train
    # every party derived the same order on its own: row i is one customer everywhere
    assert all(np.array_equal(p.ids.astype(str), parts["site-1"].ids.astype(str)) for p in parts.values())
    # without PSI (horizontal jobs, or a loader told not to) every row is kept
    full, _ = _loader(root, fed, "site-2", tmp_path / "site-2", psi=False)._load()
    assert len(full.ids) == len(read_site(root, "site-2").train.ids) > len(kept["train"])


def test_loader_without_intersection_or_with_foreign_ids_fails_naming_the_site(federation, tmp_path):
    from treeflare.flare.psi.protocol import intersection_dir

    root, fed = federation
    with pytest.raises(DataError, match="site-2: no intersection in its workspace; the PSI phase did not run"):
        _loader(root, fed, "site-2", tmp_path / "none")._load()
    kept = _kept(root, np.random.default_rng(4))
    secret = "not-a-customer-of-site-3"
    write_intersection(intersection_dir(tmp_path / "bad"), psi_items({**kept, "train": [*kept["train"], secret]}))
    with pytest.raises(DataError) as err:
        _loader(root, fed, "site-3", tmp_path / "bad")._load()
    assert "site-3" in str(err.value) and "not among its own rows" in str(err.value)
    assert secret not in str(err.value) and secret not in err.value.redacted()
    # an intersection with no validation rows: said plainly, before XGBoost sees an empty matrix
    write_intersection(intersection_dir(tmp_path / "novalid"), psi_items({"train": kept["train"]}))
    with pytest.raises(DataError, match="site-1: no test rows in the intersection"):
        _loader(root, fed, "site-1", tmp_path / "novalid")._load()


# ------------------------------------------------------------------------------------------------------ simulator
def _plain_intersection(root) -> dict:
    """What PSI must find, computed in the clear from the parties' files: the ids every party holds, per kind."""
    common = {}
    for site in SITES:
        sd = read_site(root, site)
        for kind, table in (("train", sd.train), ("test", sd.test)):
            ids = {str(v).strip() for v in table.ids}
            common[kind] = ids if kind not in common else common[kind] & ids
    return {kind: sorted(ids) for kind, ids in common.items()}


@pytest.mark.flare
def test_vertical_psi_at_70_percent_overlap_predicts_as_centralized_on_the_intersection(tmp_path):
    """3 parties (site-1 the label owner) holding 70% shared customers: the PSI phase runs first, every party
    trains on exactly the intersection (sorted by id), and the model predicts as centralized XGBoost trained on
    the intersection rows. (Also what the vertical test of tests/xgb/test_xgb_job.py checked at full overlap.)"""
    from flare_helpers import run_script

    from treeflare.xgb import global_test, score_booster, union_train
    from treeflare.xgb.encoding import dmatrix

    ws = tmp_path / "ws"
    proc = run_script("jobs/xgb_histogram/job.py",
                      ["--dataset", "car", "--mode", "vertical", "--overlap", "0.7", "--sites", "3", "--rounds", "3",
                       "--max-depth", "3", "--baselines", "centralized,native_distributed", "--xgb-port", "0", "--workspace", str(ws),
                       "--log-level", "WARNING"], tmp_path, timeout=300)
    assert (ws / "report.json").is_file(), f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    report = json.loads((ws / "report.json").read_text())
    root = ws / "federation"
    plain = _plain_intersection(root)
    rows = {s: {"train": len(read_site(root, s).train), "test": len(read_site(root, s).test)} for s in SITES}
    assert all(rows[s]["train"] > len(plain["train"]) for s in SITES)  # every party holds rows of its own

    # the PSI phase: what each party held and kept, its cost
    psi = report["psi"]
    assert psi["status"] == "completed" and sorted(psi["parties"]) == SITES
    for site, party in psi["parties"].items():
        assert party["rows_before"] == rows[site]
        assert party["rows_after"] == {k: len(v) for k, v in plain.items()}
        assert party["seconds"] > 0 and party["bytes_sent"] > 0 and party["bytes_received"] > 0
    assert report["timings_s"]["psi"] > 0 and report["params"]["partition"] == "vertical"
    assert report["params"]["overlap"] == 0.7 and report["params"]["psi_min_rows"] == 50

    # each party kept the intersection in its own run folder, and trained on exactly those rows
    run_dir = report["files"]["flare_run_dir"]
    from treeflare.data.intersection import read_intersection
    from treeflare.flare.psi.protocol import intersection_dir
    from treeflare.flare.runner import find_site_file

    for site in SITES:
        kept = find_site_file(run_dir, site, "psi/intersection.json")
        assert kept is not None, site
        assert read_intersection(intersection_dir(kept.parent.parent)) == plain
        assert report["transport"]["sites"][site]["n_train"] == len(plain["train"])

    # the model: identical predictions to centralized XGBoost on the intersection rows (an independent run here)
    train, test = union_train(root), global_test(root)
    assert list(train.ids.astype(str)) == plain["train"]
    params, n_classes = report["params"]["xgb_params"], report["params"]["n_classes"]
    central = xgb.train(params, dmatrix(train), report["params"]["rounds"])
    _, want = score_booster(central, test, n_classes)
    _, got = score_booster(xgb.Booster(model_file=str(ws / "model.json")), test, n_classes)
    assert np.abs(got - want).max() < 1e-6
    assert report["comparison"]["centralized"]["max_abs_pred_diff"] < 1e-6
    assert "native_distributed" in report["baselines_skipped"]  # XGBoost's own column split has no PSI step

    # the server never saw an id: none of the parties' training ids is in anything under the server's folder
    ids = {str(v) for s in SITES for v in read_site(root, s).train.ids}
    server_text = "\n".join(p.read_text(errors="replace") for p in Path(run_dir).rglob("*") if p.is_file()
                            and p.suffix in (".json", ".txt", ".log", ".jsonl", ""))
    assert not [i for i in ids if i in server_text]

    # as at full overlap: the label stays at site-1, the model is XGBoost's vertical one held whole by every party,
    # and it refuses rows without every party's columns (the server's test set holds ids and labels only)
    part = json.loads((root / "partition.json").read_text())
    assert "class" not in part["sites"]["site-2"]["columns"]
    assert report["transport"]["ranks"] == {"site-1": 0, "site-2": 1, "site-3": 2}
    assert report["transport"]["federated_server_stopped"] is True
    from treeflare.prediction import load_model, predict_csv

    model = load_model(ws)
    assert model.model.mode == "vertical" and model.model.ranks == {"site-1": 0, "site-2": 1, "site-3": 2}
    with pytest.raises(DataError, match="'doors' held by site-2 \\(rank 1\\)"):
        predict_csv(model, root / "server" / "test.csv", tmp_path / "p.csv")


@pytest.mark.parametrize("transport", ["direct", "flare"])
def test_job_runs_psi_first_with_both_transports_and_never_horizontally(federation, transport, tmp_path):
    """The job as both transports build it, exported as `nvflare job submit` gets it (no FLARE run): the PSI
    workflows come before training's controller, every site has the PSI executors beside its training executor in
    its own app (an all-clients app would drop the per-site ones), and the loader keeps the intersection;
    horizontal mode adds no PSI at all."""
    import json

    from treeflare.xgb import make_params

    job_py = importlib.import_module("treeflare.jobs.xgb_histogram")
    root, fed = federation
    params = make_params(4, max_depth=3, eta=0.3, nthread=1, seed=0)
    for mode in ("vertical", "horizontal"):
        args = job_py.build_parser().parse_args(["--dataset", "car", "--mode", mode, "--transport", transport,
                                                 "--psi-min-rows", "60", "--xgb-port", "0", "--workspace", "unused"])
        recipe = job_py.build_recipe(str(root), fed.schema, params, args, SITES)
        recipe.export(str(tmp_path / mode))
        out = tmp_path / mode / recipe.name
        deploy = json.loads((out / "meta.json").read_text())["deploy_map"]
        assert sorted(deploy) == sorted(["app_server", *(f"app_{s}" for s in SITES)])  # one app per site
        server = json.loads((out / "app_server" / "config" / "config_fed_server.json").read_text())
        workflows = [wf["id"] for wf in server["workflows"]]
        psi = ["treeflare_psi_check", "treeflare_psi_ecdh", "treeflare_psi_result"]  # --psi ecdh, the default
        assert workflows == ([*psi, "xgb_controller"] if mode == "vertical" else ["xgb_controller"])
        for site in SITES:
            app = json.loads((out / f"app_{site}" / "config" / "config_fed_client.json").read_text())
            tasks = {t for e in app["executors"] for t in e["tasks"]}
            assert ("treeflare_psi_check" in tasks) == (mode == "vertical") and ({"xgb_direct_train"} if transport == "direct"
                                                                  else {"config", "start"}) <= tasks
            loader = next(c for c in app["components"] if c["id"] == "dataloader")
            assert loader["args"].get("psi", False) is (mode == "vertical")
        if mode == "vertical":
            assert server["workflows"][0]["args"]["min_rows"] == 60
