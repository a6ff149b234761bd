"""Shared test fixtures (kept small and generic), and how the suite is spread over pytest-xdist workers."""

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# The suite is grouped by what it tests: package/ (the command, the install, layering, docs), trees/, data/, crypto/,
# icdta4fl/, xgb/, vertical/ (with PSI), models/ (prediction and export), deploy/ (POC, provisioned systems, netlab).
# The helpers live here (flare_helpers, data_helpers, ...), and some test modules share fixtures across folders
# (test_predict's models, test_secagg's kits): every folder is importable, whichever file runs alone.
for _folder in sorted(p for p in TESTS.iterdir() if p.is_dir() and not (p / "__init__.py").exists()
                      and any(p.glob("test_*.py"))):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

# The whole suite (the README's `python -m pytest -q`, which pyproject's addopts turn into `-n auto --dist loadgroup`)
# runs on this many worker processes: much of its time is FLARE runs starting, polling and stopping, which overlap well
# on two cores (a clean-clone run on a busy 2-core machine once took 15:37 in one process, 11:00 on two workers; the
# suite grouped by folder took 8:29 on two workers of an idle machine, 2026-12-05: README, Development).
SUITE_WORKERS = 2
LOCK_GROUP = "flare_lock"


def pytest_xdist_auto_num_workers(config):
    """Workers for ``-n auto``: SUITE_WORKERS for a run over folders (the whole suite), none for a run of named files
    or tests (one process, as quick to start as before, and ``-s``/``--pdb`` behave as usual). ``-n N`` on the
    command line, or PYTEST_XDIST_AUTO_NUM_WORKERS, still decides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    named = [a.split("::")[0] for a in config.args]
    if config.args_source == pytest.Config.ArgsSource.ARGS and not any(Path(a).is_dir() for a in named):
        return 0
    return SUITE_WORKERS


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """With ``--dist loadgroup``: the tests of a module that share a module fixture (often one FLARE run) go to one
    worker, so that it is built once, and every test marked ``flare_lock`` (it runs POC or provisioned systems, or a
    simulator run that must not overlap them, under the machine-wide FLARE lock; a module that imports ``flare_lock``
    without the mark is refused) goes to one and the same worker, first: those runs cannot overlap anyway, so a second worker never sits waiting on the lock, and the longest
    chain starts at once. Simulator runs without the lock pick their own ports and run beside anything."""
    if not getattr(config.option, "loadgroup", False):  # what xdist sets on its workers for --dist loadgroup
        return
    rank = {}
    for item in items:
        locked = item.get_closest_marker("flare_lock") is not None
        module = getattr(item, "module", None)
        if not locked and getattr(module, "flare_lock", None) is not None:
            raise pytest.UsageError(f"{item.nodeid.split('::')[0]} takes the FLARE lock (it imports flare_lock): mark it "
                                    "`pytestmark = [..., pytest.mark.flare_lock]` so that its runs go to the lock's "
                                    "worker, in order")
        if locked:
            item.add_marker(pytest.mark.xdist_group(LOCK_GROUP))
        elif item.get_closest_marker("xdist_group") is None and _uses_shared_fixture(item):
            # (a module that names its own group, e.g. two files sharing a cache of models, keeps it)
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        # any other test is a group of its own, free to run beside the rest
        rank[id(item)] = 0 if locked else 1 if item.get_closest_marker("flare") else 2
    # the scheduler hands out groups in collection order (--no-loadscope-reorder): the locked chain, then the other
    # FLARE modules (each a few simulator runs), then the fast in-process tests
    items.sort(key=lambda item: rank[id(item)])


def _uses_shared_fixture(item) -> bool:
    """Whether the test uses a module-, class- or package-scoped fixture (built once for all the tests that share it,
    on one worker); session fixtures are built per worker anyway."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(d.scope in ("module", "class", "package") for ds in defs.values() for d in ds)


@pytest.fixture
def make_csv(tmp_path):
    """``make_csv(text, name="data.csv") -> Path``: write a small CSV file under the test's tmp_path."""

    def _make(text: str, name: str = "data.csv") -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    return _make
