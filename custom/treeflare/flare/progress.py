"""Progress lines from the server's side of a job, printed by the job script while FLARE runs.

FLARE logs at WARNING, so a long job would print nothing until its end. Here the server side writes short lines
("round 12/50  eval auc 0.9120  elapsed 8.1 s, ~25 s left") and the job script prints them as they come:

* server: a :class:`ProgressReporter` component (id ``"progress"``) appends each line, as JSON, to
  ``progress.jsonl`` in the server's run folder and answers NVFlare's ``show_stats`` admin command with the
  latest lines (group ``treeflare_progress``);
* job script: :class:`ProgressPrinter` prints the lines it has not printed yet. In the simulator it reads the
  file (the server's run folder is on this machine); on a POC or provisioned system it asks the server with
  ``show_stats`` through the admin session (the run folder may be on another host), and reads the downloaded
  result's file once the job has ended, so the last lines are never lost.

To give another job progress: put a ``ProgressReporter`` on the server (``job.to_server(ProgressReporter(),
id=PROGRESS_ID)``), and in the controller emit through it::

    progress = fl_ctx.get_engine().get_component(PROGRESS_ID)   # None when the job has no reporter
    if progress:
        progress.emit(f"sites trained {k}/{K}")

then call ``add_progress_args(parser)`` in the job script and pass ``progress=printer_for(args)`` to
``run_job``. Lines are text the server composed from values it checked; a site's strings are never printed.

How many lines: every line on a terminal or with ``--progress``, none with ``--quiet``. Otherwise (a log, a CI
run) fewer, chosen by the fields a line carries: ``done``/``total`` (counted work: rounds, layers) print the first,
the last and one per 10% of the work; ``phase`` (steps of one phase: "k/n sites replied") print the phase's last
line; a line with neither (a phase's summary) always prints.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections import deque
from pathlib import Path

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent

PROGRESS_ID = "progress"
PROGRESS_FILE = "progress.jsonl"
STATS_GROUP = "treeflare_progress"
KEEP_LINES = 200  # what show_stats returns: a poll every second or so never misses a line
MAX_TEXT = 300
POLL_S = 1.0


# -- the job script's options ----------------------------------------------------------------------
def add_progress_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--quiet", action="store_true", help="print no progress lines while the job runs")
    g.add_argument("--progress", action="store_true",
                   help="print every progress line (default: every line on a terminal; otherwise one per phase "
                        "or per 10%% of the work)")


def progress_wanted(args) -> bool:
    return not getattr(args, "quiet", False)


def every_line_wanted(args, stream=None) -> bool:
    """Every line with ``--progress`` or on a terminal; fewer lines in a log."""
    if getattr(args, "progress", False):
        return True
    stream = sys.stdout if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


def printer_for(args, stream=None) -> "ProgressPrinter | None":
    """The printer the job's options ask for, or None (``--quiet``)."""
    return ProgressPrinter(stream, every_line=every_line_wanted(args, stream)) if progress_wanted(args) else None


# -- server side -----------------------------------------------------------------------------------
class ProgressLog:
    """The lines of one run: appended to ``path`` (one JSON object per line) and kept in memory (the latest
    ``keep``). No NVFlare in here: usable and testable anywhere."""

    def __init__(self, path, keep: int = KEEP_LINES):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")  # this run's lines only
        self._recent: deque = deque(maxlen=keep)
        self._seq = 0
        self._lock = threading.Lock()

    def emit(self, text: str, **fields) -> dict:
        with self._lock:
            self._seq += 1
            record = {"seq": self._seq, "t": time.time(), "text": str(text)[:MAX_TEXT], **fields}
            with self.path.open("a") as fh:
                fh.write(json.dumps(record) + "\n")
            self._recent.append(record)
            return record

    def recent(self) -> list[dict]:
        with self._lock:
            return list(self._recent)


def say(fl_ctx, text: str, **fields) -> None:
    """One progress line from a controller, where the job has a :class:`ProgressReporter` (nothing otherwise): the
    phases that take long before the first result line (PSI, key generation) say that they have started."""
    engine = fl_ctx.get_engine()
    reporter = engine.get_component(PROGRESS_ID) if hasattr(engine, "get_component") else None
    if hasattr(reporter, "emit"):
        reporter.emit(text, **fields)


class ProgressReporter(FLComponent):
    """Server component holding the run's :class:`ProgressLog`; controllers and widgets emit through it."""

    def __init__(self):
        super().__init__()
        self.log: ProgressLog | None = None
        self.started = time.monotonic()

    def handle_event(self, event_type: str, fl_ctx) -> None:
        if event_type == EventType.START_RUN:
            run_dir = Path(fl_ctx.get_engine().get_workspace().get_run_dir(fl_ctx.get_job_id()))
            self.log = ProgressLog(run_dir / PROGRESS_FILE)
            self.started = time.monotonic()
        elif event_type == _stats_event():
            self._answer_stats(fl_ctx)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def emit(self, text: str, **fields) -> None:
        """Record one line; never fails the job (progress is only for show)."""
        if self.log is None:
            return
        try:
            self.log.emit(text, **fields)
        except OSError:
            pass

    def _answer_stats(self, fl_ctx) -> None:
        from nvflare.widgets.info_collector import InfoCollector

        collector = fl_ctx.get_prop(InfoCollector.CTX_KEY_STATS_COLLECTOR, None)
        if collector is not None and self.log is not None:
            collector.add_info(STATS_GROUP, {"lines": self.log.recent()})


def _stats_event() -> str:
    from nvflare.widgets.info_collector import InfoCollector

    return InfoCollector.EVENT_TYPE_GET_STATS


def format_duration(seconds: float) -> str:
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(int(round(seconds)), 60)
    return f"{minutes} min {s:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def remaining(elapsed_since_first: float, done: int, total: int) -> float | None:
    """Seconds left at the pace of the steps after the first (the first also pays for the start), or None."""
    if done < 2 or total <= done:
        return None if total > done else 0.0
    return elapsed_since_first / (done - 1) * (total - done)


# -- job-script side -------------------------------------------------------------------------------
class ProgressPrinter:
    """Prints each progress line once, in order, whatever source it came from; with ``every_line=False`` only
    the lines the module's docstring names (call :meth:`finish` after the job's last lines)."""

    def __init__(self, stream=None, every_line: bool = True):
        self.stream = sys.stdout if stream is None else stream
        self.every_line = every_line
        self.last_seq = 0
        self.started = time.time()
        self.printed: list[str] = []
        self._lock = threading.Lock()
        self._pending: dict | None = None  # the latest step of the current phase, not printed yet
        self._tenth = -1  # the last 10% of counted work printed

    def _pick(self, record) -> list[dict]:
        """The records to print now, given the next one."""
        if self.every_line:
            return [record]
        before = [self._pending] if self._pending is not None else []
        done, total = record.get("done"), record.get("total")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (done, total)) and total > 0:
            tenth = min(10, done * 10 // total)
            if done <= 1 or done >= total or tenth > self._tenth:
                self._tenth, self._pending = max(self._tenth, tenth), None
                return [*before, record]
            return []
        if isinstance(record.get("phase"), str):
            if before and before[0].get("phase") == record["phase"]:
                before = []
            self._pending = record  # printed when the next phase starts (or at the end)
            return before
        self._pending = None
        return [*before, record]

    def _print(self, record) -> None:
        text = str(record.get("text", ""))[:MAX_TEXT]
        self.printed.append(text)
        print(text, file=self.stream, flush=True)

    def finish(self) -> None:
        """Print the last phase's line still held back (fewer lines mode); the job has ended."""
        with self._lock:
            if self._pending is not None:
                self._print(self._pending)
                self._pending = None

    def show(self, records, since: float | None = None) -> None:
        """Print the records not printed yet (``since``: only those stamped at or after it)."""
        with self._lock:
            for r in sorted((r for r in records if isinstance(r, dict) and isinstance(r.get("seq"), int)),
                            key=lambda r: r["seq"]):
                t = r.get("t")
                stale = since is not None and not (isinstance(t, (int, float)) and t >= since)
                if r["seq"] <= self.last_seq or stale:
                    continue
                self.last_seq = r["seq"]
                for picked in self._pick(r):
                    self._print(picked)

    def show_file(self, path, fresh_only: bool = False) -> None:
        """``fresh_only``: skip lines older than this printer (a file an earlier run left in a reused folder; the
        clocks are the same, this machine's)."""
        self.show(read_progress_file(path), since=self._fresh() if fresh_only else None)

    def _fresh(self) -> float:
        return self.started - 1.0

    @contextlib.contextmanager
    def follow(self, poll, interval: float = POLL_S, since: float | None = None):
        """Call ``poll()`` (which returns records) every ``interval`` seconds in a thread while inside."""
        stop = threading.Event()

        def loop():
            while not stop.wait(interval):
                try:
                    self.show(poll(), since)
                except Exception:  # a failed poll (file not there yet, admin hiccup) only delays the lines
                    pass

        thread = threading.Thread(target=loop, name="treeflare_progress", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(timeout=interval + 5)

    def follow_file(self, path, interval: float = POLL_S):
        """The simulator: the server's run folder is on this machine."""
        return self.follow(lambda: read_progress_file(path), interval, since=self._fresh())

    def follow_admin(self, admin_kit, job_id: str, interval: float = 2.0):
        """A POC or provisioned system: ask the server (``show_stats``) through an admin session of our own."""
        from .admin import admin_session

        holder: dict = {}
        sessions = contextlib.ExitStack()  # opened at the first poll (a failed one is tried again), closed at the end

        def poll():
            if "sess" not in holder:
                holder["sess"] = sessions.enter_context(admin_session(Path(admin_kit)))
            return stats_lines(holder["sess"].show_stats(job_id, "server"))

        @contextlib.contextmanager
        def session():
            try:
                with self.follow(poll, interval):
                    yield self
            finally:
                with contextlib.suppress(Exception):
                    sessions.close()

        return session()


def read_progress_file(path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def stats_lines(stats) -> list[dict]:
    """Our lines in a ``show_stats`` reply ({target: {group: info}}, or {group: info})."""
    if not isinstance(stats, dict):
        return []
    for value in [stats, *stats.values()]:
        if isinstance(value, dict) and isinstance(value.get(STATS_GROUP), dict):
            lines = value[STATS_GROUP].get("lines")
            return lines if isinstance(lines, list) else []
    return []
