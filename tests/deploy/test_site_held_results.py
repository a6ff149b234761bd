"""What the ICDTA4FL and XGBoost jobs show and record when the sites hold the data (no global test set): each
site's validation metrics under a heading that says so, every output named, no partition settings that did not
apply. In process, from a server result / report built here: no FLARE run."""

from __future__ import annotations

import importlib

import argparse
import json

import pytest



pytest.importorskip("tensorboard")  # the XGBoost job reads tb_events/ with it (a pinned requirement)


@pytest.fixture(scope="module")
def icdta4fl_job():
    return importlib.import_module("treeflare.jobs.icdta4fl")


@pytest.fixture(scope="module")
def xgb_job():
    return importlib.import_module("treeflare.jobs.xgb_histogram")


def _icdta4fl_server_result() -> dict:
    """A completed ICDTA4FL server result as the controller writes it without a server test set."""
    site = lambda n, acc, f1: {"n_train": 4 * n, "n_test": n, "local": {"accuracy": 0.8, "macro_f1": 0.7},  # noqa: E731
                               "tree": {"n_leaves": 9, "depth": 4}, "global": {"accuracy": acc, "macro_f1": f1}}
    return {"job": "icdta4fl", "status": "completed", "n_sites": 3, "selected_sites": ["site-1", "site-3"],
            "thresholds": {"accuracy": 0.8, "macro_f1": 0.7}, "dropped_sites": {}, "aggregation": {"n_rules": 12},
            "sites": {"site-1": site(100, 0.90, 0.80), "site-2": site(50, 0.84, 0.70), "site-3": site(80, 0.87, 0.75)},
            "one_round": {"n_leaves": 12, "depth": 5, "accuracy": None, "macro_f1": None},
            "global": {"n_leaves": 15, "depth": 6, "n_rules": None},
            "refinement": {"rounds_done": 1, "status": "completed", "start": "one-round tree (it validates best)",
                           "epsilon": None, "validation": {"one_round": {"accuracy": 0.82, "macro_f1": 0.66}},
                           "history": [{"round": 1, "sites": 3}]},
            "timings_s": {"local_training": 1.0}}


def _icdta4fl_args(**kw):
    defaults = dict(algorithm="cart", max_depth=4, criterion=None, statistic="percentile", percentile=75.0,
                    max_leaves=None, global_max_depth=None, refine_rounds=1, refine_from="one_round", refine_epsilon=None,
                    refine_objective="accuracy", env="poc")
    return argparse.Namespace(**{**defaults, **kw})


SITE_HELD_SUMMARY = {"dataset": "the sites' own data", "partition": {"kind": "site-held"},
                     "schema_source": {"schema": "discovered", "schema_file": "ws/schema.json"}}


def test_icdta4fl_without_a_global_test_set_shows_each_sites_validation_scores(icdta4fl_job, tmp_path, capsys):
    report = icdta4fl_job.build_report(_icdta4fl_args(), _icdta4fl_server_result(), SITE_HELD_SUMMARY, None, {})
    # report.json: the sites' own data was split by no one here; each site's score of the final tree, documented
    assert report["partition"] == {"kind": "site-held"}
    v = json.loads(json.dumps(report))["validation"]
    assert v["rows"] == "each site's validation rows (its test.csv)"
    assert v["final_tree"]["sites"]["site-2"] == {"accuracy": 0.84, "macro_f1": 0.70, "n_test": 50}
    assert v["final_tree"]["mean"]["accuracy"] == pytest.approx((0.90 + 0.84 + 0.87) / 3)
    assert v["one_round_tree"] == {"mean": {"accuracy": 0.82, "macro_f1": 0.66}}

    for name in ("report.json", "global_tree.json", "rules.txt", "global_tree.png", "global_tree_one_round.json"):
        (tmp_path / name).write_text("{}")
    icdta4fl_job.print_summary(report, tmp_path)
    out = capsys.readouterr().out
    assert "global test set" not in out and "model (each site's validation rows)" in out
    lines = out.splitlines()
    row = next(line for line in lines if line.startswith("global (ICDTA4FL, refined 1 round), mean of the sites"))
    assert row.split()[-4:] == [f"{(0.90 + 0.84 + 0.87) / 3:.4f}", f"{(0.80 + 0.70 + 0.75) / 3:.4f}", "15", "6"]
    assert next(line for line in lines if "site-2 (50 rows)" in line).split()[-2:] == ["0.8400", "0.7000"]
    one = next(line for line in lines if line.startswith("one-round tree (the paper's), mean of the sites"))
    assert one.split()[-4:] == ["0.8200", "0.6600", "12", "5"]
    assert not any(line.split()[-1:] == ["6"] and "0." not in line for line in lines)  # no blank metric rows
    # every output named with its path
    for label, name in (("report", "report.json"), ("global tree", "global_tree.json"), ("rules", "rules.txt"),
                        ("picture", "global_tree.png"), ("one-round tree", "global_tree_one_round.json")):
        assert any(line.split()[:len(label.split())] == label.split() and line.endswith(str(tmp_path / name))
                   for line in lines), (label, out)


def test_icdta4fl_with_a_global_test_set_keeps_its_table(icdta4fl_job, tmp_path, capsys):
    server = _icdta4fl_server_result()
    server["global"].update(accuracy=0.91, macro_f1=0.81, n_test=200)
    server["one_round"].update(accuracy=0.88, macro_f1=0.77)
    summary = {"dataset": "car", "partition": {"kind": "iid", "alpha": None, "seed": 1}}
    report = icdta4fl_job.build_report(_icdta4fl_args(env="sim"), server, summary, None, {})
    assert report["partition"] == {"kind": "iid", "alpha": None, "seed": 1}
    icdta4fl_job.print_summary(report, tmp_path)
    out = capsys.readouterr().out
    assert "model (global test set)" in out and "validation rows" not in out
    assert "0.9100" in out and "0.8800" in out and "mean of the sites" not in out


def _write_eval_events(tb_dir, site, metric, values, tag="eval_metrics"):
    """tb_events/<site>/ as the server's TBAnalyticsReceiver writes it from a site's MetricsCallback."""
    from nvflare.app_opt.tracking.tb.tb_event_writer import TensorBoardEventWriter

    writer = TensorBoardEventWriter(str(tb_dir / site))
    for step, value in enumerate(values):
        writer.add_scalars(tag, {metric: value}, global_step=step)
    writer.flush()
    writer.close() if hasattr(writer, "close") else None


def test_last_round_eval_reads_what_the_server_wrote_and_skips_the_rest(tmp_path):
    from treeflare.xgb.eval_log import eval_metric_names, last_round_eval

    tb = tmp_path / "tb_events"
    _write_eval_events(tb, "site-1", "auc", [0.81, 0.86, 0.9125])
    _write_eval_events(tb, "site-1", "auc", [0.5, 0.6, 0.7], tag="train_metrics")  # training rows: not validation
    _write_eval_events(tb, "site-2", "auc", [0.7, float("nan"), float("inf")])  # only round 1 is a number
    _write_eval_events(tb, "site-9", "auc", [0.99])  # not a site of this job
    _write_eval_events(tb, "site-3", "error", [0.1])  # not the job's metric
    (tb / "site-4" / "eval_metrics_auc").mkdir(parents=True)
    (tb / "site-4" / "eval_metrics_auc" / "events.out.tfevents.1.x").write_bytes(b"\x00garbage")
    assert eval_metric_names({"eval_metric": "auc"}) == ["auc"]
    got = last_round_eval(tb, ["site-1", "site-2", "site-3", "site-4"], ["auc"], rounds=3)
    assert set(got) == {"site-1", "site-2"}
    assert got["site-1"]["round"] == 3 and got["site-1"]["auc"] == pytest.approx(0.9125, abs=1e-6)
    assert got["site-2"] == {"round": 1, "auc": pytest.approx(0.7, abs=1e-6)}
    assert last_round_eval(tb, ["site-1"], ["auc"], rounds=2)["site-1"]["round"] == 2  # rounds beyond the job's: no


def _xgb_report(job, validation, global_metrics=None) -> dict:
    return {"job": "xgb_histogram", "dataset": "the sites' own data", "mode": "horizontal", "n_sites": 3,
            "params": {"rounds": 3, "n_classes": 2, "transport": "direct"}, "global": global_metrics,
            "validation": validation, "baselines": {b: None for b in job.BASELINES}, "timings_s": {"flare_run": 9.5}}


def test_xgb_without_a_global_test_set_shows_each_sites_last_round_eval(xgb_job, tmp_path):
    tb = tmp_path / "tb_events"
    _write_eval_events(tb, "site-1", "auc", [0.81, 0.86, 0.9125])
    from treeflare.xgb.eval_log import last_round_eval

    validation = {"rows": xgb_job.VALIDATION_ROWS["horizontal"], "metrics": ["auc"],
                  "sites": last_round_eval(tb, ["site-1", "site-2", "site-3"], ["auc"], 3)}
    text = xgb_job.summary_table(_xgb_report(xgb_job, validation))
    lines = text.splitlines()
    assert lines[1].startswith("model (each site's validation rows)")
    row = next(line for line in lines if line.startswith("NVFlare horizontal (direct), site-1's eval, round 3"))
    assert row.split()[-1] == "0.9125"
    # the columns are the sites' eval metric: no accuracy or macro-F1 column left blank
    assert lines[1].split()[-1] == "auc" and "accuracy" not in lines[1] and "macro_f1" not in lines[1]
    assert "every site's validation rows (test.csv), evaluated collectively" in text
    # no site's metrics at all: said so, not a blank row
    empty = xgb_job.summary_table(_xgb_report(xgb_job, {**validation, "sites": {}}))
    assert "no site's eval metrics arrived" in empty and "NVFlare horizontal" not in empty
    # a global test set: the table as before
    full = xgb_job.summary_table(_xgb_report(xgb_job, validation, {"auc": 0.93, "accuracy": 0.88, "logloss": 0.3}))
    assert "NVFlare horizontal (direct)  0.9300" in full and "validation rows" not in full


def test_xgb_partition_settings_only_when_this_script_split_the_data(xgb_job):
    args = argparse.Namespace(mode="horizontal", partition="iid", alpha=0.5)
    assert xgb_job.partition_params(args, split_here=False) == {}
    assert xgb_job.partition_params(args, split_here=True) == {"partition": "iid"}
    assert xgb_job.partition_params(argparse.Namespace(mode="horizontal", partition="label", alpha=0.3), True) == \
        {"partition": "label", "alpha": 0.3}
    assert xgb_job.partition_params(argparse.Namespace(mode="vertical", partition="iid", alpha=0.5), True) == \
        {"partition": "vertical"}


def test_outputs_text_names_what_exists(tmp_path):
    from treeflare.console import outputs_text

    (tmp_path / "model.json").write_text("{}")
    text = outputs_text({"model": tmp_path / "model.json", "report": tmp_path / "report.json", "federation": None})
    assert text.splitlines()[1:] == ["outputs:", f"  model  {tmp_path / 'model.json'}"]
    assert outputs_text({"report": tmp_path / "nothing.json"}) == ""
