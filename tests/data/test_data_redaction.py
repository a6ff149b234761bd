"""A site's error reply names the file (base name), column, line and the kind of problem, never
the cell value or a local path; the full message stays in the site's own log. In process, for the three site
executors (ICDTA4FL, vertical, the XGBoost data loader). The simulator run is in test_hostile_sim.py."""

from __future__ import annotations

import json

import pytest

from data_helpers import set_cell
from treeflare.data import DataError, load_csv, prepare_federation, write_federation
from treeflare.data.errors import UNSPECIFIED, public_error

SECRET = "123-45-6789"


def _csv(n=90):
    lines = ["pid,x,z,y"]
    for i in range(n):
        lines.append(f"{i},{i * 0.5},{i % 3},{'pos' if i % 2 else 'neg'}")
    return "\n".join(lines) + "\n"


def plant_secret(root, site, line=4, column=1, name="train.csv"):
    """Put SECRET into a numeric cell of a site's file; returns the file."""
    return set_cell(root / site / name, line, column, SECRET)


@pytest.fixture
def fed(tmp_path, make_csv):
    table = load_csv(make_csv(_csv(), "private folder/people.csv"), label="y", id_column="pid")
    return write_federation(prepare_federation(table, 3, "iid", None, seed=0), tmp_path / "secret dir" / "fed")


@pytest.fixture
def vfed(tmp_path, make_csv):
    table = load_csv(make_csv(_csv(), "people.csv"), label="y", id_column="pid")
    return write_federation(prepare_federation(table, 2, seed=0, vertical=True, n_passive=1), tmp_path / "vfed")


def assert_clean(text: str, root):
    assert SECRET not in text, text
    assert str(root) not in text and str(root.parent) not in text, text


# -- the error type -------------------------------------------------------------------------------
def test_data_error_carries_where_and_a_redacted_form(fed):
    from treeflare.data import read_site

    path = plant_secret(fed, "site-2")
    with pytest.raises(DataError) as e:
        read_site(fed, "site-2")
    exc = e.value
    assert SECRET in str(exc) and str(path) in str(exc)  # the full message, for the site's own log
    assert (exc.file, exc.column, exc.line, exc.site) == (str(path), "x", 4, "site-2")
    assert exc.location == {"file": "train.csv", "column": "x", "line": 4, "site": "site-2"}
    assert exc.redacted() == "site-2: train.csv, column 'x', line 4: not a number (the column is numeric)"
    assert_clean(public_error(exc), fed)


def test_redacted_without_details_says_nothing_of_the_data():
    exc = DataError(f"/home/me/data.csv: cell {SECRET!r} is odd")
    assert exc.redacted() == UNSPECIFIED
    assert public_error(exc) == f"DataError: {UNSPECIFIED}"


def test_public_error_of_other_exceptions():
    # a library's message may quote a cell: only the type leaves the site
    assert SECRET not in public_error(ValueError(f"could not convert string to float: '{SECRET}'"))
    assert public_error(KeyError("x")).startswith("KeyError")

    class ProtocolError(Exception):
        pass
    text = public_error(ProtocolError("bad key read from /srv/site 1/keys/pub.json"), passthrough=(ProtocolError,))
    assert text.startswith("ProtocolError: bad key") and "/srv/" not in text and "pub.json" in text
    assert len(public_error(ProtocolError("x" * 10_000), passthrough=(ProtocolError,))) <= 2000


@pytest.mark.parametrize("edit, problem", [
    (lambda lines: lines[:1] + [lines[1].rsplit(",", 1)[0] + f",{SECRET}"] + lines[2:], "unknown class"),
    (lambda lines: [lines[0].replace("x", "q")] + lines[1:], "missing column(s) ['x']"),
    (lambda lines: lines[:2] + [lines[1]] + lines[3:], "duplicate id"),
])
def test_other_site_file_problems_are_redacted(fed, edit, problem):
    from treeflare.data import read_site

    path = fed / "site-1" / "train.csv"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(edit(lines)) + "\n")
    with pytest.raises(DataError) as e:
        read_site(fed, "site-1")
    red = e.value.redacted()
    assert problem in red and red.startswith("site-1: train.csv"), red
    assert_clean(red, fed)


# -- the three executors --------------------------------------------------------------------------
class _Ctx:
    def __init__(self, site):
        self.site = site

    def get_identity_name(self):
        return self.site

    def get_engine(self):  # no site kit: the binding falls back to the job's data_root
        raise RuntimeError("no engine in this test")

    def get_job_id(self):
        return "job"


def _capture_logs(executor):
    logged = []
    executor.log_error = lambda ctx, msg, *a, **k: logged.append(msg)
    executor.log_debug = lambda ctx, msg, *a, **k: None
    executor.log_info = lambda ctx, msg, *a, **k: None
    return logged


def test_icdta4fl_executor_replies_redacted(fed, monkeypatch):
    from nvflare.apis.fl_constant import ReturnCode
    from nvflare.apis.shareable import Shareable

    from treeflare.data import read_partition
    from treeflare.flare.icdta4fl.executor import ICDTA4FLExecutor
    from treeflare.flare.icdta4fl.protocol import TRAIN

    for var in ("TREEFLARE_SITE_CONFIG", "TREEFLARE_DATA_ROOT"):
        monkeypatch.delenv(var, raising=False)
    plant_secret(fed, "site-3", line=6)
    ex = ICDTA4FLExecutor(data_root=str(fed))
    logged = _capture_logs(ex)
    task = Shareable({"schema": read_partition(fed)["schema"], "algorithm": "cart", "params": {"max_depth": 2}})
    reply = ex.execute(TRAIN, task, _Ctx("site-3"), None)
    assert reply.get_return_code() == ReturnCode.EXECUTION_EXCEPTION
    assert reply["error"] == "DataError: site-3: train.csv, column 'x', line 6: not a number (the column is numeric)"
    assert_clean(json.dumps(dict(reply)), fed)
    assert any(SECRET in m for m in logged)  # the whole story is in the site's own log
    ok = ICDTA4FLExecutor(data_root=str(fed))  # each site runs its own executor
    _capture_logs(ok)
    assert ok.execute(TRAIN, task, _Ctx("site-1"), None).get_return_code() == ReturnCode.OK


def test_vertical_executor_replies_redacted(vfed, monkeypatch):
    from nvflare.apis.fl_constant import ReturnCode
    from nvflare.apis.shareable import Shareable

    from treeflare.flare.vertical.executor import VerticalExecutor
    from treeflare.flare.vertical.protocol import MSG

    monkeypatch.delenv("TREEFLARE_DATA_ROOT", raising=False)
    plant_secret(vfed, "site-2", line=3, column=1)  # site-2 (passive) holds pid, z: z is numeric
    ex = VerticalExecutor(data_root=str(vfed))
    logged = _capture_logs(ex)
    reply = ex.execute(MSG, Shareable({"msg": {"type": "setup"}}), _Ctx("site-2"), None)
    assert reply.get_return_code() == ReturnCode.EXECUTION_EXCEPTION
    assert reply["error"].startswith("DataError: site-2: train.csv, column 'z', line 3: not a number"), reply["error"]
    assert_clean(json.dumps({k: str(v) for k, v in dict(reply).items()}), vfed)
    assert any(SECRET in m for m in logged)


def test_vertical_executor_library_errors_leave_only_their_type(vfed, monkeypatch):
    from nvflare.apis.shareable import Shareable

    from treeflare.flare.vertical import executor as vertical_executor
    from treeflare.flare.vertical.protocol import MSG

    def boom(*a, **k):
        raise ValueError(f"could not convert string to float: '{SECRET}' in {vfed}/site-2/train.csv")

    monkeypatch.setattr(vertical_executor, "_site_tables", boom)
    ex = vertical_executor.VerticalExecutor(data_root=str(vfed))
    _capture_logs(ex)
    reply = ex.execute(MSG, Shareable({"msg": {"type": "setup"}}), _Ctx("site-2"), None)
    assert reply["error"].startswith("ValueError") and SECRET not in reply["error"] and str(vfed) not in reply["error"]


def test_xgb_loader_raises_redacted(fed, caplog):
    pytest.importorskip("xgboost")
    from treeflare.data import read_partition
    from treeflare.flare.xgb.data_loader import TreeflareXGBDataLoader

    plant_secret(fed, "site-1", line=5)
    loader = TreeflareXGBDataLoader(folder=str(fed), schema=read_partition(fed)["schema"])
    loader.initialize("site-1", 0)
    with caplog.at_level("ERROR"), pytest.raises(DataError) as e:
        loader.load_data()
    assert str(e.value) == "site-1: train.csv, column 'x', line 5: not a number (the column is numeric)"
    assert e.value.__cause__ is None and e.value.__suppress_context__
    assert_clean(str(e.value), fed)
    assert SECRET in caplog.text  # the site's own log keeps the whole message
