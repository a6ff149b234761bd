"""What a new user met (issue 34), each in process: a mixed column's error counts its bad cells; `site bind` refuses a
data folder without the site's files; a site's own binding that replaces the job's data says so; the progress line
counts valid replies; the leaves shown are the tree's; a site whose data is missing stops the job unless
--min-clients says go on; `predict` on a vertical workspace points to the vertical prediction; the tree's picture fits
a screen."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from icdta4fl_inprocess import InProcessRun
from treeflare.data import DataError, load_dataset, prepare_federation, read_site_csv, write_federation
from treeflare.data.errors import public_error
from treeflare.flare.site_config import DATA_ROOT_ENV, SITE_CONFIG_ENV, load_binding

SECRET = "987-65-4321"


@pytest.fixture(autouse=True)
def _no_site_env(monkeypatch):
    for var in (SITE_CONFIG_ENV, DATA_ROOT_ENV):
        monkeypatch.delenv(var, raising=False)


# -- 1. a mixed column: how many cells are bad, and their first lines ---------------------------------------------
def _mixed_csv(tmp_path, bad_rows, n=60, name="train.csv"):
    """A CSV whose numeric column x holds SECRET (text) in ``bad_rows`` (0-based data rows)."""
    lines = ["x,y"] + [f"{SECRET if i in bad_rows else i * 0.5},{'a' if i % 2 else 'b'}" for i in range(n)]
    path = tmp_path / "secret folder" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_mixed_column_says_how_many_cells_are_bad_and_names_their_first_lines(tmp_path):
    from treeflare.data import Feature, Schema

    schema = Schema((Feature("x", "numeric"),), "y", ("a", "b"))
    path = _mixed_csv(tmp_path, {2, 7, 15})  # file lines 4, 9, 17 (the header is line 1)
    with pytest.raises(DataError) as e:
        read_site_csv(path, schema, site="site-2")
    assert "column 'x': 3 cells are not numbers (lines 4, 9, 17" in str(e.value)
    # what leaves the site: the count and the lines, never a value or the path
    public = public_error(e.value)
    assert public == ("DataError: site-2: train.csv, column 'x': 3 cells are not numbers (lines 4, 9, 17; the "
                      "column is numeric)")
    assert SECRET not in public and str(tmp_path) not in public
    # many bad cells: the first few lines and how many more
    with pytest.raises(DataError) as e:
        read_site_csv(_mixed_csv(tmp_path, set(range(10, 22)), name="many.csv"), schema, site="site-2")
    assert e.value.redacted().endswith("12 cells are not numbers (lines 12, 13, 14, 15, 16 and 7 more; the column is "
                                       "numeric)")
    # one bad cell reads as before
    with pytest.raises(DataError) as e:
        read_site_csv(_mixed_csv(tmp_path, {2}, name="one.csv"), schema, site="site-2")
    assert e.value.redacted() == "site-2: one.csv, column 'x', line 4: not a number (the column is numeric)"


def test_a_mostly_numeric_column_when_the_schema_is_inferred_counts_its_bad_cells(tmp_path):
    from treeflare.data import load_csv

    with pytest.raises(DataError) as e:
        load_csv(_mixed_csv(tmp_path, {2, 7, 15}), label="y")
    msg = str(e.value)
    assert "column 'x': 3 cells are not numbers (lines 4, 9, 17; the first is" in msg and "95% of the column" in msg
    assert e.value.redacted().endswith("column 'x': 3 cells are not numbers (lines 4, 9, 17), but 95% of the "
                                       "column is numeric (fix the values, or declare the column categorical)")
    assert SECRET not in e.value.redacted()


# -- 2. `site bind` refuses a data folder without the site's files ------------------------------------------------
@pytest.fixture
def kit(tmp_path):
    (tmp_path / "kit" / "local").mkdir(parents=True)
    return tmp_path / "kit"


def _bind(kit, *args):
    from treeflare.tools.site_setup import main

    try:
        return main(["bind", str(kit), *args])
    except SystemExit as exc:
        return exc.code


def test_site_bind_refuses_a_folder_that_does_not_exist(kit, tmp_path, capsys):
    missing = tmp_path / "no such folder"
    assert _bind(kit, "--data-dir", str(missing)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --data-dir {missing}: the folder does not exist") and "--allow-missing" in err
    assert not (kit / "local" / "treeflare_site.json").exists()


def test_site_bind_refuses_a_folder_without_the_sites_files(kit, tmp_path, capsys):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "train.csv").write_text("x,y\n1,a\n")
    assert _bind(kit, "--data-dir", str(folder)) == 2
    err = capsys.readouterr().err
    assert f"--data-dir {folder}: no test.csv in this folder (its CSV files: train.csv)" in err
    assert _bind(kit, "--data-dir", str(folder), "--train", "train.csv", "--test", "valid.csv") == 2
    assert "no valid.csv in this folder" in capsys.readouterr().err
    assert not (kit / "local" / "treeflare_site.json").exists()
    (folder / "valid.csv").write_text("x,y\n1,a\n")
    assert _bind(kit, "--data-dir", str(folder), "--train", "train.csv", "--test", "valid.csv") == 0
    assert json.loads((kit / "local" / "treeflare_site.json").read_text())["test"] == "valid.csv"


def test_site_bind_writes_a_binding_for_data_still_to_come_when_asked(kit, tmp_path):
    later = tmp_path / "arrives later"
    assert _bind(kit, "--data-dir", str(later), "--allow-missing") == 0
    assert json.loads((kit / "local" / "treeflare_site.json").read_text()) == {"data_dir": str(later)}


# -- 3. a site's own binding takes the place of the data the job prepared: the error says so -----------------------
def test_a_binding_that_replaces_the_jobs_data_says_so_and_keeps_its_paths(kit, tmp_path):
    from treeflare.data import Feature, Schema

    own = tmp_path / "site secret folder"
    own.mkdir()
    (own / "train.csv").write_text("age,income,outcome\n40,1,yes\n50,2,no\n")
    (kit / "local" / "treeflare_site.json").write_text(json.dumps({"data_dir": str(own)}))
    job_data = tmp_path / "job data"  # what the job prepared (--dataset car): the site never reads it
    schema = Schema((Feature("buying", "categorical", ("high", "low")),), "class", ("acc", "unacc"))
    binding = load_binding("site-2", config_dir=kit / "local", job_data_root=str(job_data))
    with pytest.raises(DataError) as e:
        binding.read("train", schema, "site-2")
    public = public_error(e.value)
    assert public.startswith("DataError: site-2 reads its own data (its binding local/treeflare_site.json), not the "
                             "data this job prepared; the columns of its train.csv do not match the job's schema: "
                             "missing column(s) ['buying'] expected by the schema"), public
    assert public.endswith("run the job without --dataset/--csv (the schema is then discovered from the sites) or "
                           "bind the site to other data")
    assert str(tmp_path) not in public and str(own) in str(e.value)  # the site's log has the path, the server not
    # the sites hold the data (no data prepared by the job): the plain error
    with pytest.raises(DataError) as e:
        load_binding("site-2", config_dir=kit / "local").read("train", schema, "site-2")
    assert "not the data this job prepared" not in str(e.value) and "missing column(s) ['buying']" in str(e.value)


# -- 4. the progress line counts valid replies ---------------------------------------------------------------------
def _arrays(seed, n=120):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = (X[:, 0] + 0.3 * rng.normal(size=n) > 0).astype(np.int64)
    return X[:90], y[:90], X[90:], y[90:]


def _protocol(sites, min_clients=None, failing=(), handlers=None, refine_rounds=0):
    """The server protocol over ``sites`` array sites in process; the sites in ``failing`` raise ``failing``'s
    error at training. Returns (server, protocols)."""
    from treeflare.icdta4fl.driver import schema_for_arrays
    from treeflare.icdta4fl.server import ICDTA4FLServer
    from treeflare.icdta4fl.site import ArrayLoader, SiteProtocol

    schema = schema_for_arrays(classes=["0", "1"], feature_kinds=["numeric"] * 3)
    server = ICDTA4FLServer(schema, "cart", local_params={"max_depth": 3}, min_clients=min_clients,
                            refine_params={"rounds": refine_rounds})
    protocols = {}
    def refuse(error):
        def load(schema, algorithm):
            raise error
        return load

    for i, name in enumerate(sites):
        load = refuse(failing[name]) if name in failing else ArrayLoader(*_arrays(i))
        protocols[name] = SiteProtocol(name, load, job_id="job")
    return server, protocols


def test_the_progress_line_counts_only_valid_replies_and_names_the_failed_sites():
    from treeflare.icdta4fl.driver import run_protocol
    from treeflare.icdta4fl.server import ProtocolFailed

    sites = ["site-1", "site-2", "site-3"]
    bad = {s: DataError("rows unusable", problem="rows unusable") for s in sites}  # bad data, not missing data
    server, protocols = _protocol(sites, min_clients=2, failing=bad)
    notes = []
    with pytest.raises(ProtocolFailed):
        run_protocol(server, protocols, notes=notes)
    assert notes == ["local training: 0/3 sites gave a valid tree (3 failed: site-1, site-2, site-3)"]
    # as replies arrive (the FLARE controller), a site that replied with an error is not counted as replied
    from treeflare.flare.icdta4fl.controller import replied_line

    assert replied_line("local training", 3, [], ["site-2"]) == "local training: 0/3 sites replied (1 failed: site-2)"
    assert replied_line("peer scoring", 3, ["site-1", "site-3"], []) == "peer scoring: 2/3 sites replied"
    # one invalid reply among valid ones
    server, protocols = _protocol(sites, min_clients=2)
    notes = []
    run_protocol(server, protocols, notes=notes, handlers={"site-2": lambda task, data: {"tree": "not a tree"}})
    assert "local training: 2/3 sites gave a valid tree (1 failed: site-2)" in notes
    assert "peer scoring: 2/2 sites gave valid scores" in notes


# -- 5. the leaves shown are the tree's -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def car_run(tmp_path_factory):
    fed = prepare_federation(load_dataset("car"), n_sites=3, kind="iid", seed=0)
    root = write_federation(fed, tmp_path_factory.mktemp("car") / "data")
    return fed, root


def _car_controller(fed, **kwargs):
    from treeflare.flare.icdta4fl.controller import ICDTA4FLController

    return ICDTA4FLController(schema=fed.schema.to_dict(), algorithm="cart", local_params={"max_depth": 4}, **kwargs)


def test_every_leaf_count_shown_is_the_final_trees(car_run, tmp_path):
    from treeflare.icdta4fl.driver import run_protocol
    from treeflare.icdta4fl.encoding import encode
    from treeflare.icdta4fl.report_html import render_report_html
    from treeflare.icdta4fl.server import ICDTA4FLServer
    from treeflare.icdta4fl.site import ArrayLoader, SiteProtocol
    from treeflare.icdta4fl.simplify import collapse_same_class

    fed, _ = car_run
    server = ICDTA4FLServer(fed.schema, "cart", local_params={"max_depth": 5}, refine_params={"rounds": 1, "grow_from": "one_round"})
    protocols = {name: SiteProtocol(name, ArrayLoader(encode(s.train, "cart"), s.train.y_codes(),
                                                      encode(s.test, "cart"), s.test.y_codes()), job_id="job")
                 for name, s in fed.sites.items()}
    notes = []
    result, model, one_round = run_protocol(server, protocols, notes=notes)
    info = result["refinement"]
    assert info["rounds_done"] == 1, info
    last = info["history"][-1]
    budget = result["aggregation"]["max_leaves"]
    # the round grew a tree with same-class splits (car: 17 leaves), shown with them collapsed (15), as the summary
    # and the picture show it
    assert last["n_leaves_grown"] > last["n_leaves"] and last["max_leaves"] == budget
    assert last["n_leaves"] == model.get_n_leaves() == result["global"]["n_leaves"]
    # it grew from the one-round tree (uncollapsed: 10 leaves), shown as the summary's one-round row (8)
    assert info["start_site"] is None
    assert last["n_leaves_before"] == collapse_same_class(one_round.tree_).n_leaves == result["one_round"]["n_leaves"]
    line = next(n for n in notes if n.startswith("refinement round 1/1: "))
    assert line.startswith(f"refinement round 1/1: {model.get_n_leaves()} leaves of at most {budget}, depth "
                           f"{model.get_depth()}"), line
    page = render_report_html({**result, "params": {}}, model)
    rounds = page[page.index("<section id='refinement'>"):]
    for header in ("leaves before", "leaves", "leaves grown", "leaf budget"):
        assert f"<th>{header}</th>" in rounds, header
    assert "n leaves before" not in rounds


# -- 6. a site whose data is missing stops the job, unless --min-clients says go on ---------------------------------
def test_a_site_whose_data_file_is_missing_stops_the_job_naming_the_site_and_the_file(car_run, tmp_path):
    import shutil

    fed, root = car_run
    data = tmp_path / "data"
    shutil.copytree(root, data)
    (data / "site-3" / "train.csv").unlink()
    result = InProcessRun(data, fed.site_names).run(_car_controller(fed, refine_params={"rounds": 0}),
                                                    tmp_path / "run")
    assert result["status"] == "failed", result
    error = result["error"]
    assert "site-3 could not load its data (site-3: its data file train.csv is missing)" in error, error
    assert "--min-clients" in error and str(data) not in error
    # the operator said to go on with 2 sites: site-3 is dropped with its reason, the job completes
    result = InProcessRun(data, fed.site_names).run(_car_controller(fed, min_clients=2, refine_params={"rounds": 0}),
                                                    tmp_path / "run2")
    assert result["status"] == "completed", result.get("error")
    assert result["sites_trained"] == ["site-1", "site-2"]
    assert "site-3: its data file train.csv is missing" in result["dropped_sites"]["site-3"]


def test_a_missing_data_folder_is_said_by_the_site_and_marked_in_its_reply(tmp_path):
    from nvflare.apis.fl_constant import ReturnCode
    from nvflare.apis.shareable import Shareable

    from treeflare.data import Feature, Schema
    from treeflare.flare.icdta4fl.executor import ICDTA4FLExecutor
    from treeflare.flare.icdta4fl.protocol import TRAIN
    from treeflare.data.errors import SITE_DATA
    from treeflare.flare.site_executor import FAILURE_KEY

    schema = Schema((Feature("x", "numeric"),), "y", ("a", "b"))
    ex = ICDTA4FLExecutor(data_root=str(tmp_path / "secret root"))
    logged = []
    for level in ("log_info", "log_error"):
        setattr(ex, level, lambda fl_ctx, msg, *a, **k: logged.append(msg))
    ctx = SimpleNamespace(get_identity_name=lambda: "site-3", get_engine=lambda: None, get_job_id=lambda: "job")
    reply = ex.execute(TRAIN, Shareable({"schema": schema.to_dict(), "algorithm": "cart", "params": {}}), ctx, None)
    assert reply.get_return_code() == ReturnCode.EXECUTION_EXCEPTION
    assert reply[FAILURE_KEY] == SITE_DATA
    # the server hears the file's name only; that the folder itself is missing stays in the site's own log
    assert reply["error"] == "DataError: site-3: its data file train.csv is missing"
    assert any("the data folder that the job's data_root names does not exist" in m for m in logged), logged


def test_bad_payloads_still_only_drop_a_site_and_an_error_text_cannot_pose_as_missing_data():
    from treeflare.data.errors import SITE_DATA
    from treeflare.icdta4fl.driver import run_protocol
    from treeflare.icdta4fl.server import SITE_DATA_FAILED, failure_reason

    sites = ["site-1", "site-2", "site-3", "site-4"]
    server, protocols = _protocol(sites)  # min_clients not given
    # a hostile site's reply: invalid, or an error whose text claims missing data without the executor's mark
    forged = failure_reason("EXECUTION_EXCEPTION", f"DataError: {SITE_DATA_FAILED}: its data file x.csv is missing")
    assert not forged.startswith(SITE_DATA_FAILED)
    result, model, _ = run_protocol(server, protocols, handlers={"site-2": lambda task, data: {"tree": []}})
    assert result["sites_trained"] == ["site-1", "site-3", "site-4"] and "site-2" in result["dropped_sites"]
    # the executor's mark: the site's data is missing, the protocol stops
    from treeflare.icdta4fl.server import ProtocolFailed

    missing = DataError("site-4: /srv/x/train.csv: its data file train.csv is missing", site="site-4",
                        problem="its data file train.csv is missing", kind=SITE_DATA)
    server, protocols = _protocol(sites, failing={"site-4": missing})
    with pytest.raises(ProtocolFailed, match=r"site-4 could not load its data \(site-4: its data file train.csv is "
                                             r"missing\); every site must load its data"):
        run_protocol(server, protocols)
    # an explicit min_clients goes on without it
    server, protocols = _protocol(sites, min_clients=3, failing={"site-4": missing})
    result, _, _ = run_protocol(server, protocols)
    assert result["sites_trained"] == ["site-1", "site-2", "site-3"]


# -- 7. `predict` on a vertical workspace points to the vertical prediction ---------------------------------------
def test_predict_on_a_vertical_workspace_says_how_to_predict_with_it(tmp_path, capsys):
    from treeflare.tools.predict import main

    ws = tmp_path / "vtree"
    (ws / "models").mkdir(parents=True)
    (ws / "report.json").write_text(json.dumps({"job": "vertical_tree", "model": "gbdt"}))
    part = ws / "models" / "site-1_active_model.json"
    part.write_text(json.dumps({"format": "treeflare.vertical.active/2", "trees": []}))
    new = tmp_path / "new.csv"
    new.write_text("id,x\n1,2\n")
    for model in (ws, part):
        with pytest.raises(SystemExit) as e:
            main(["--model", str(model), "--csv", str(new), "--out", str(tmp_path / "p.csv")])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "holds a vertical model" in err, err
        assert f"treeflare vertical --predict {ws} --csv NEW.csv --workspace OUT" in err, err
    # a folder with no model of any kind: as before
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        main(["--model", str(tmp_path / "empty"), "--csv", str(new), "--out", str(tmp_path / "p.csv")])
    assert "no model in this folder" in capsys.readouterr().err


# -- 8. the picture fits a screen, whole -----------------------------------------------------------------------------
def test_a_wide_tree_is_drawn_whole_at_most_2000_px_wide(tmp_path):
    from PIL import Image

    from treeflare.icdta4fl.export import plot_tree
    from treeflare.icdta4fl.model import GlobalTree
    from treeflare.trees import fit_cart

    rng = np.random.default_rng(0)
    X = rng.normal(size=(4000, 4))
    y = ((X[:, 0] * 3).astype(int) + (X[:, 1] > 0)) % 3
    tree = fit_cart(X, y, n_classes=3, max_depth=8, min_samples_split=10)
    assert tree.n_leaves >= 30  # drawn at 1.6 inches a leaf and 110 dpi, over 5,000 px wide
    model = GlobalTree(tree, ["unacc", "acc", "good"], ["buying", "maint", "safety", "persons"])
    plot_tree(model, tmp_path / "tree.png")
    width, height = Image.open(tmp_path / "tree.png").size
    assert width <= 2000 and height <= 2000, (width, height)
    assert width >= 1900  # the whole width used: a smaller dpi, not a cut
    small = GlobalTree(fit_cart(X, y, n_classes=3, max_depth=2), ["unacc", "acc", "good"],
                       ["buying", "maint", "safety", "persons"])
    plot_tree(small, tmp_path / "small.png")
    assert Image.open(tmp_path / "small.png").size == (660, 462)  # a small tree keeps its 110 dpi
