"""One argument check (treeflare.cli.check_args), shared by the three job scripts and
prepare_data.py, refuses every bad numeric or choice argument before anything is written or FLARE starts; the
error names the argument."""

from __future__ import annotations

import argparse

import pytest

from flare_helpers import job_module
from treeflare.cli import ARG_RULES, check_args
from treeflare.data import DataError



@pytest.fixture(scope="module")
def jobs():
    mods = {}
    for name in ("icdta4fl", "vertical_tree", "xgb_histogram"):
        mods[name] = job_module(name)
    return mods


def refused(mod, argv, ws, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        mod.main([*argv, "--workspace", str(ws)])
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert "Traceback" not in err
    assert not (ws / "data").exists() and not (ws / "federation").exists() and not (ws / "flare").exists()
    return err


@pytest.mark.parametrize("argv, message", [
    (["--min-clients", "0"], "--min-clients must be an integer >= 1, got 0"),
    (["--min-clients", "50", "--sites", "5"], "--min-clients 50 is more than --sites 5"),
    (["--task-timeout", "-10"], "--task-timeout must be a positive number, got -10"),
    (["--task-timeout", "0"], "--task-timeout must be a positive number, got 0"),
    (["--max-leaves", "0"], "--max-leaves must be an integer >= 1, got 0"),
    (["--max-leaves", "-5"], "--max-leaves must be an integer >= 1, got -5"),
    (["--global-max-depth", "-1"], "--global-max-depth must be an integer >= 1, got -1"),
    (["--global-max-depth", "0"], "--global-max-depth must be an integer >= 1, got 0"),
    (["--criterion", "foo"], "--criterion must be one of gini, entropy, got 'foo'"),
    (["--percentile", "nan"], "--percentile must be in [0, 100], got nan"),
    (["--max-depth", "0"], "--max-depth must be an integer >= 1, got 0"),
    (["--sites", "0"], "--sites must be an integer >= 1, got 0"),
    (["--alpha", "-1", "--partition", "label"], "--alpha must be a positive number, got -1.0"),
    (["--alpha", "inf", "--partition", "quantity"], "--alpha must be a positive number, got inf"),
    (["--seed", "-1"], "--seed must be an integer in [0, 4294967295], got -1"),
    (["--timeout", "0", "--env", "poc"], "--timeout must be a positive number, got 0.0"),
])
def test_icdta4fl_arguments(jobs, argv, message, tmp_path, capsys):
    err = refused(jobs["icdta4fl"], ["--dataset", "car", *argv], tmp_path / "ws", capsys)
    assert f"error: {message}" in err, err


@pytest.mark.parametrize("argv, message", [
    (["--task-timeout", "-10"], "--task-timeout must be a positive number"),
    (["--bins", "1"], "--bins must be an integer in [2, 1024], got 1"),
    (["--learning-rate", "nan"], "--learning-rate must be a positive number, got nan"),
    (["--lambda", "-1"], "--lambda must be a number >= 0, got -1.0"),
    (["--min-child-weight", "-0.5"], "--min-child-weight must be a number >= 0"),
    (["--trees", "0", "--model", "gbdt"], "--trees must be an integer >= 1, got 0"),
    (["--workers", "-2"], "--workers must be an integer in [0, 256]"),
    (["--workers", "dask://10.0.0.5:8786", "--env", "poc"], "set $TREEFLARE_VERTICAL_WORKERS=dask://HOST:PORT"),
    (["--passive", "0"], "--passive must be an integer >= 1, got 0"),
    (["--precision", "4"], "--precision must be an integer in [8, 60], got 4"),
    (["--criterion", "foo"], "invalid choice"),  # argparse's own choices come first
])
def test_vertical_arguments(jobs, argv, message, tmp_path, capsys):
    err = refused(jobs["vertical_tree"], ["--dataset", "car", *argv], tmp_path / "ws", capsys)
    assert message in err, err


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "--rounds must be an integer >= 1, got 0"),
    (["--eta", "nan"], "--eta must be a positive number, got nan"),
    (["--nthread", "0"], "--nthread must be an integer >= 1, got 0"),
    (["--early-stopping-rounds", "-1"], "--early-stopping-rounds must be an integer >= 0, got -1"),
    (["--max-depth", "-3"], "--max-depth must be an integer >= 1, got -3"),
    (["--alpha", "0", "--partition", "label"], "--alpha must be a positive number, got 0.0"),
])
def test_xgb_arguments(jobs, argv, message, tmp_path, capsys):
    err = refused(jobs["xgb_histogram"], ["--dataset", "car", *argv], tmp_path / "ws", capsys)
    assert f"error: {message}" in err, err


def test_check_args_names_every_rule_and_skips_absent_ones():
    ns = argparse.Namespace(sites=3)
    assert check_args(ns) is ns  # only what a script has is checked
    absent = argparse.Namespace(max_leaves=None, global_max_depth=None, criterion=None)
    assert check_args(absent) is absent  # optional arguments left out are not checked
    for dest in ARG_RULES:
        with pytest.raises(DataError, match="--"):
            check_args(argparse.Namespace(**{dest: "nonsense"}))
    with pytest.raises(DataError, match="--sites must be an integer >= 1, got True"):
        check_args(argparse.Namespace(sites=True))


def test_good_arguments_pass(jobs):
    args = jobs["icdta4fl"].parse_args(["--dataset", "car", "--sites", "3", "--min-clients", "3", "--max-leaves",
                                        "1", "--global-max-depth", "1", "--criterion", "entropy", "--workspace", "w"])
    assert (args.min_clients, args.max_leaves) == (3, 1)


def test_vertical_gbdt_objective_that_does_not_fit_the_label_is_refused_before_flare(jobs, tmp_path, capsys):
    # car's label has 4 named classes: a squared-error regression cannot fit it (softmax can: the default)
    err = refused(jobs["vertical_tree"], ["--dataset", "car", "--model", "gbdt", "--objective", "squared_error"],
                  tmp_path / "ws", capsys)
    assert "--objective" in err or "squared" in err, err
