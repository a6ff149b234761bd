"""Per-round progress of the XGBoost job, on the server: ``round 12/50  eval auc 0.9120  elapsed 8.1 s, ~25 s left``.

The sites already stream XGBoost's per-round metrics to the server for TensorBoard (NVFlare's ``MetricsCallback``
-> ``TBWriter`` -> ``ConvertToFedEvent``: a ``fed.analytix_log_stats`` event per round and watched set). This
component listens to the same events from one site (rank 0, whose evaluation XGBoost computes over every
site's rows in horizontal mode, and which holds the labels in vertical mode) and turns its ``eval`` metric into
one line per round through :class:`~treeflare.flare.progress.ProgressReporter`. The same events flow in both
transports (direct and flare). Values are checked (a known round, a finite number under the expected metric
name); anything else from a site is ignored, never printed.
"""

from __future__ import annotations

import math
import threading
import time

from ..progress import ProgressReporter, format_duration, remaining

METRICS_EVENT = "fed.analytix_log_stats"
EVAL_TAG = "eval_metrics"  # MetricsCallback's tag for xgb.train's evals=[(dvalid, "eval"), ...]


def round_line(done: int, rounds: int, metric: str, value: float, elapsed: float, left: float | None) -> str:
    text = f"round {done}/{rounds}  eval {metric} {value:.4f}  elapsed {format_duration(elapsed)}"
    return text + (f", ~{format_duration(left)} left" if left is not None and done < rounds else "")


class XGBRoundProgress(ProgressReporter):
    def __init__(self, site: str, rounds: int, metric: str):
        """
        Args:
            site: the site whose metrics are shown (rank 0).
            rounds: the boosting rounds asked for.
            metric: the eval metric name in xgb_params (``auc``, ``mlogloss``).
        """
        super().__init__()
        self.site = site
        self.rounds = int(rounds)
        self.metric = metric
        self._last = -1
        self._first_at: float | None = None
        self._round_lock = threading.Lock()  # events may arrive on several threads

    def handle_event(self, event_type: str, fl_ctx) -> None:
        super().handle_event(event_type, fl_ctx)
        if event_type == METRICS_EVENT:
            try:
                self._on_metrics(fl_ctx)
            except Exception:  # progress is for show: a malformed event never disturbs the job
                pass

    def _on_metrics(self, fl_ctx) -> None:
        from nvflare.apis.dxo import from_shareable
        from nvflare.apis.fl_constant import FLContextKey, ReservedKey
        from nvflare.apis.shareable import Shareable
        from nvflare.apis.analytix import AnalyticsData

        data = fl_ctx.get_prop(FLContextKey.EVENT_DATA, None)
        if not isinstance(data, Shareable) or data.get_peer_prop(ReservedKey.IDENTITY_NAME, None) != self.site:
            return
        record = AnalyticsData.from_dxo(from_shareable(data))
        if record is None or record.tag != EVAL_TAG or not isinstance(record.value, dict):
            return
        self.on_round(record.step, record.value.get(self.metric))

    def on_round(self, step, value) -> None:
        """One round's eval metric (``step`` 0-based, as XGBoost counts)."""
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < self.rounds or step <= self._last:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return
        with self._round_lock:
            if step <= self._last:
                return
            now = time.monotonic()
            if self._first_at is None:
                self._first_at = now
            self._last = step
            done = step + 1
            left = remaining(now - self._first_at, done, self.rounds)
            self.emit(round_line(done, self.rounds, self.metric, float(value), self.elapsed(), left), done=done,
                      total=self.rounds, metric=self.metric, value=float(value))
