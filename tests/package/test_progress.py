"""Progress lines (flare.progress, flare.xgb.progress) in-process: the server side writes and serves them, the
job-script side prints each once; the XGBoost round lines from NVFlare's metric events, bad values ignored."""

from __future__ import annotations

import argparse
import io
import json
import math
import threading
import time

import pytest

from treeflare.flare.progress import (PROGRESS_FILE, STATS_GROUP, ProgressLog, ProgressPrinter, ProgressReporter,
                                      add_progress_args, format_duration, printer_for, progress_wanted,
                                      read_progress_file, remaining, stats_lines)
from treeflare.flare.xgb.progress import METRICS_EVENT, XGBRoundProgress, round_line


class Stream(io.StringIO):
    def __init__(self, tty=False):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


def test_options_quiet_progress_and_terminal():
    p = argparse.ArgumentParser()
    add_progress_args(p)
    assert progress_wanted(p.parse_args([])) and not progress_wanted(p.parse_args(["--quiet"]))
    assert printer_for(p.parse_args(["--quiet"]), Stream(tty=True)) is None
    assert printer_for(p.parse_args(["--quiet"]), Stream(tty=False)) is None
    with pytest.raises(SystemExit):
        p.parse_args(["--quiet", "--progress"])


def printed(options, tty, records) -> list[str]:
    """What a job script prints of ``records`` (the server's lines, in order) with these options."""
    p = argparse.ArgumentParser()
    add_progress_args(p)
    out = Stream(tty=tty)
    printer = printer_for(p.parse_args(options), out)
    if printer is None:
        return []
    for r in records:  # one poll per line: held-back lines must come out at the right moment, not only at the end
        printer.show([r])
    printer.finish()
    return out.getvalue().splitlines()


def numbered(lines: list[dict]) -> list[dict]:
    return [{"seq": i + 1, "t": 0.0, **r} for i, r in enumerate(lines)]


def test_a_log_gets_one_line_per_phase_or_per_tenth_a_terminal_every_line():
    xgb = numbered([{"text": f"round {k}/50", "done": k, "total": 50} for k in range(1, 51)])
    assert printed([], False, xgb) == [f"round {k}/50" for k in (1, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50)]
    assert printed([], True, xgb) == printed(["--progress"], False, xgb) == [r["text"] for r in xgb]
    assert printed(["--quiet"], False, xgb) == printed(["--quiet"], True, xgb) == []
    layers = numbered([{"text": f"layer {k}/4", "done": k, "total": 4} for k in range(1, 5)])
    assert printed([], False, layers) == ["layer 1/4", "layer 2/4", "layer 3/4", "layer 4/4"]  # each is 25%
    icdta4fl = numbered([{"text": "local training: 1/3 sites replied", "phase": "local training"},
                         {"text": "local training: 2/3 sites replied", "phase": "local training"},
                         {"text": "local training: 3/3 sites replied", "phase": "local training"},
                         {"text": "peer scoring: 1/3 sites replied", "phase": "peer scoring"},
                         {"text": "peer scoring: 2/3 sites replied", "phase": "peer scoring"},  # a site dropped
                         {"text": "aggregation: 2 of 3 trees merged"},
                         {"text": "global evaluation: 1/3 sites replied", "phase": "global evaluation"},
                         {"text": "global evaluation: 2/3 sites replied", "phase": "global evaluation"}])
    assert printed([], False, icdta4fl) == ["local training: 3/3 sites replied", "peer scoring: 2/3 sites replied",
                                            "aggregation: 2 of 3 trees merged", "global evaluation: 2/3 sites replied"]
    assert printed([], True, icdta4fl) == [r["text"] for r in icdta4fl]


def test_log_and_printer_each_line_once_in_order(tmp_path):
    log = ProgressLog(tmp_path / PROGRESS_FILE, keep=3)
    for i in range(5):
        log.emit(f"step {i}", step=i)
    assert [r["text"] for r in log.recent()] == ["step 2", "step 3", "step 4"]  # what show_stats returns
    assert [r["step"] for r in read_progress_file(log.path)] == [0, 1, 2, 3, 4]
    out = Stream()
    printer = ProgressPrinter(out)
    printer.show(list(reversed(log.recent())))
    printer.show_file(log.path)  # earlier lines arrive later: already past them, not printed out of order
    printer.show(log.recent())
    assert out.getvalue().splitlines() == ["step 2", "step 3", "step 4"]
    log.emit("step 5")
    printer.show_file(log.path)
    assert out.getvalue().splitlines()[-1] == "step 5" and len(printer.printed) == 4


def test_follow_file_prints_while_running_and_skips_an_old_run(tmp_path):
    path = tmp_path / "run" / PROGRESS_FILE
    path.parent.mkdir()
    path.write_text(json.dumps({"seq": 1, "t": time.time() - 3600, "text": "old run"}) + "\n")
    out = Stream()
    printer = ProgressPrinter(out)
    with printer.follow_file(path, interval=0.05):
        time.sleep(0.2)
        log = ProgressLog(path)  # the new run starts: the file is this run's from now on
        log.emit("round 1/2")
        deadline = time.monotonic() + 5
        while "round 1/2" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert out.getvalue() == "round 1/2\n"  # printed while the job still runs
        log.emit("round 2/2")
    printer.show_file(path, fresh_only=True)
    assert out.getvalue().splitlines() == ["round 1/2", "round 2/2"]
    assert not [t for t in threading.enumerate() if t.name == "treeflare_progress"]


def test_show_stats_answer_and_reply_parsing(tmp_path):
    from nvflare.apis.fl_context import FLContext
    from nvflare.widgets.info_collector import GroupInfoCollector, InfoCollector

    reporter = ProgressReporter()
    reporter.log = ProgressLog(tmp_path / PROGRESS_FILE)
    reporter.emit("sites trained 1/3", k=1)
    ctx = FLContext()
    collector = GroupInfoCollector()
    ctx.set_prop(InfoCollector.CTX_KEY_STATS_COLLECTOR, collector, private=True, sticky=False)
    reporter.handle_event(InfoCollector.EVENT_TYPE_GET_STATS, ctx)
    lines = collector.info[STATS_GROUP]["lines"]
    assert [r["text"] for r in lines] == ["sites trained 1/3"]
    reply = {"server": {"ServerRunner": {"status": "started"}, STATS_GROUP: {"lines": lines}}}  # show_stats' shape
    assert stats_lines(reply) == lines and stats_lines({"server": "job not running"}) == [] and stats_lines(None) == []


def metric_event(site, step, value, tag="eval_metrics", metric="auc"):
    from nvflare.apis.analytix import AnalyticsData, AnalyticsDataType
    from nvflare.apis.fl_constant import FLContextKey, ReservedKey
    from nvflare.apis.fl_context import FLContext

    shareable = AnalyticsData(tag, {metric: value}, AnalyticsDataType.METRICS, global_step=step).to_dxo().to_shareable()
    shareable.set_peer_props({ReservedKey.IDENTITY_NAME: site})
    ctx = FLContext()
    ctx.set_prop(FLContextKey.EVENT_DATA, shareable, private=True, sticky=False)
    return ctx


def test_xgb_round_lines_from_metric_events(tmp_path):
    progress = XGBRoundProgress(site="site-1", rounds=4, metric="auc")
    progress.log = ProgressLog(tmp_path / PROGRESS_FILE)
    for site, step, value, tag in [("site-2", 0, 0.5, "eval_metrics"),  # not rank 0: ignored
                                   ("site-1", 0, 0.81, "train_metrics"),  # the training set's metric: ignored
                                   ("site-1", 0, 0.8123, "eval_metrics"),
                                   ("site-1", 0, 0.9, "eval_metrics"),  # the same round again
                                   ("site-1", 1, math.nan, "eval_metrics"),  # not a number
                                   ("site-1", 7, 0.9, "eval_metrics"),  # beyond the rounds asked for
                                   ("site-1", 1, 0.85, "eval_metrics"), ("site-1", 3, 0.9, "eval_metrics")]:
        progress.handle_event(METRICS_EVENT, metric_event(site, step, value, tag))
    progress.handle_event(METRICS_EVENT, metric_event("site-1", 2, 0.88, metric="logloss"))  # another metric
    progress.on_round(True, 0.9)
    progress.on_round(2, "0.9")
    lines = [r["text"] for r in read_progress_file(progress.log.path)]
    assert len(lines) == 3
    assert lines[0].startswith("round 1/4  eval auc 0.8123  elapsed ") and "left" not in lines[0]
    assert lines[1].startswith("round 2/4  eval auc 0.8500  elapsed ") and lines[1].endswith(" left")
    assert lines[2].startswith("round 4/4  eval auc 0.9000") and "left" not in lines[2]


def test_line_formats_and_estimate():
    assert round_line(12, 50, "auc", 0.91234, 8.06, 25.0) == "round 12/50  eval auc 0.9123  elapsed 8.1 s, ~25.0 s left"
    assert format_duration(125) == "2 min 05 s" and format_duration(7260) == "2 h 01 min"
    assert remaining(10.0, 1, 50) is None  # the first round pays for the start: no pace yet
    assert remaining(10.0, 11, 50) == pytest.approx(39.0) and remaining(5.0, 50, 50) == 0.0


def test_a_controller_says_its_phase_where_the_job_has_a_reporter(tmp_path):
    """PSI and key generation say that they have started (the vertical job printed nothing for 40 s before its first
    layer line); a job without a reporter, or with another component under its id, gets nothing and no error."""
    import json
    from types import SimpleNamespace

    from treeflare.flare.progress import ProgressLog, ProgressReporter, say

    reporter = ProgressReporter()
    reporter.log = ProgressLog(tmp_path / "progress.jsonl")
    for component in (reporter, None, object()):
        engine = SimpleNamespace(get_component=lambda _id, c=component: c)
        say(SimpleNamespace(get_engine=lambda e=engine: e), "PSI: the 3 parties check their ids")
    lines = [json.loads(line) for line in (tmp_path / "progress.jsonl").read_text().splitlines()]
    assert [line["text"] for line in lines] == ["PSI: the 3 parties check their ids"]
