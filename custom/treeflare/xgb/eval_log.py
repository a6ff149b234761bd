"""The XGBoost job's metrics when there is no global test set: each site's eval metric at the last boosting round,
read from the TensorBoard events the server wrote (``tb_events/``).

The sites stream XGBoost's per-round metrics to the server (NVFlare's ``MetricsCallback`` -> ``TBWriter`` ->
``TBAnalyticsReceiver``), which writes ``tb_events/<site>/eval_metrics_<metric>/events.out.tfevents.*``. XGBoost's
``eval`` set is the sites' validation rows (each site's test.csv) and XGBoost computes metrics collectively, so
a site's value covers every site's validation rows (horizontal) or the shared rows, labelled by the label owner
(vertical); the direct transport streams rank 0's only. What the files hold came from the sites: only the job's
sites, the expected metric names, rounds within the job's and finite numbers are read; anything else is skipped.
"""

from __future__ import annotations

import math
from pathlib import Path

EVAL_TAG = "eval_metrics"  # MetricsCallback's tag for xgb.train's evals=[(dvalid, "eval"), ...]


def eval_metric_names(xgb_params: dict) -> list[str]:
    """The eval metrics XGBoost reports per round (``eval_metric``: one name or a list)."""
    names = xgb_params.get("eval_metric") or []
    return [names] if isinstance(names, str) else [n for n in names if isinstance(n, str)]


def read_scalars(events_dir: Path, tag: str) -> dict[int, float]:
    """{step: value} of the scalar ``tag`` in the event files of ``events_dir``; unreadable records are skipped."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    out: dict[int, float] = {}
    for path in sorted(events_dir.glob("events.out.tfevents.*")):
        try:
            for record in RawEventFileLoader(str(path)).Load():
                event = Event.FromString(record)
                for value in event.summary.value:
                    if value.tag == tag and value.WhichOneof("value") == "simple_value":
                        out[int(event.step)] = float(value.simple_value)
        except Exception:  # a truncated or foreign file: its metrics are for show, never a reason to fail the job
            continue
    return out


def last_round_eval(tb_dir, sites: list[str], metrics: list[str], rounds: int) -> dict:
    """``{site: {"round": r, metric: value, ...}}``: each site's eval metrics at the last round (1-based) for which
    it recorded every metric; sites with none are left out."""
    tb_dir = Path(tb_dir)
    out = {}
    for site in sites:
        series = {}
        for metric in metrics:
            folder = tb_dir / site / f"{EVAL_TAG}_{metric}"
            values = read_scalars(folder, EVAL_TAG) if folder.is_dir() else {}
            series[metric] = {s: v for s, v in values.items() if 0 <= s < rounds and math.isfinite(v)}
        common = set.intersection(*(set(v) for v in series.values())) if series else set()
        if common:
            last = max(common)
            out[site] = {"round": last + 1, **{m: series[m][last] for m in metrics}}
    return out
