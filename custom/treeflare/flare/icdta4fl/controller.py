"""Server side of ICDTA4FL as an NVFlare workflow: routes the one ICDTA4FL protocol (``treeflare.icdta4fl.server``)
to the sites, and writes what it returns.

The protocol yields each task; this controller broadcasts it, hands back every site's reply as received (or why
there is none: timed out, an error reply), and the protocol checks them against the server's own schema and plan.
A protocol failure (too few valid sites, or with ``min_clients`` not given a site whose data is missing or unreadable)
ends the job ``failed`` with its reason; anything else as well, with the real error (``workflow.ResultWorkflow``).
The in-process driver (``icdta4fl.driver``) runs the same protocol.
"""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from nvflare.apis.controller_spec import Task
from nvflare.apis.fl_constant import FLContextKey, ReturnCode
from nvflare.apis.shareable import Shareable

from ...data import read_site_csv
from ...icdta4fl.encoding import encode
from ...icdta4fl.export import export_text, plot_tree
from ...icdta4fl.payloads import MAX_SITE_ROWS
from ...icdta4fl.driver import drive
from ...data.errors import SITE_DATA
from ...icdta4fl.server import DEFAULT_MAX_ROWS_RATIO, DEFAULT_REFINE, ICDTA4FLServer, ProtocolFailed, failure_reason
from ...files import write_text_atomic
from ..progress import PROGRESS_ID
from ..site_executor import FAILURE_KEY
from ..workflow import JobFailed, ResultWorkflow, collect
from .protocol import TASKS

__all__ = ["ICDTA4FLController", "RESULT_FILE", "DEFAULT_REFINE"]

RESULT_FILE = "icdta4fl_result.json"


class ICDTA4FLController(ResultWorkflow):
    JOB = "icdta4fl"
    RESULT_FILE = RESULT_FILE

    def __init__(self, schema: dict, algorithm: str = "cart", local_params: dict | None = None,
                 selection: dict | None = None, aggregation: dict | None = None, min_clients: int | None = None,
                 task_timeout: int = 600, server_test: str = "", job_info: dict | None = None,
                 refine_params: dict | None = None, max_rows_ratio: float = DEFAULT_MAX_ROWS_RATIO,
                 max_site_rows: int = MAX_SITE_ROWS):
        """
        Args (see ``icdta4fl.server.ICDTA4FLServer``, which checks them all before any task):
            schema: the shared data schema (``Schema.to_dict()``).
            algorithm: "cart" or "id3" for the local trees.
            local_params, selection, aggregation, refine_params: the learner's, the peer-score filter's, the
                merge/rebuild's and the refinement's options.
            min_clients: fewest valid sites the job goes on with, even when some sites' data is missing; None
                (default): every site must load its data (a site whose data is missing or unreadable ends the job,
                naming it), and a site whose reply is missing or invalid is dropped while 2 valid sites remain.
            task_timeout: seconds each site has per task.
            server_test: the server's own global test CSV (optional), for global metrics.
            job_info: free-form facts copied into the result (dataset, partition).
            max_rows_ratio, max_site_rows: the bound on a site's declared rows.
        """
        super().__init__()
        # NVFlare writes the job config from attributes named like the arguments: keep those as given.
        self.schema = schema
        self.algorithm = algorithm
        self.local_params = dict(local_params or {})
        self.selection = dict(selection or {})
        self.aggregation = dict(aggregation or {})
        self.min_clients = None if min_clients is None else max(1, int(min_clients))
        self.task_timeout = int(task_timeout)
        self.server_test = server_test
        self.job_info = dict(job_info or {})
        self.refine_params = dict(refine_params or {})
        self.max_rows_ratio = max_rows_ratio
        self.max_site_rows = max_site_rows
        self.protocol = ICDTA4FLServer(schema, algorithm, local_params=self.local_params,
                                       selection=self.selection, aggregation=self.aggregation,
                                       refine_params=self.refine_params, min_clients=self.min_clients,
                                       max_rows_ratio=max_rows_ratio, max_site_rows=max_site_rows,
                                       job_info=self.job_info)

    def initial_result(self) -> dict:
        return {**super().initial_result(), **self.protocol.initial_result()}

    def run_workflow(self, result, run_dir: Path, abort_signal, fl_ctx):
        sites = [c.name for c in fl_ctx.get_engine().get_clients()]
        steps = self.protocol.run(result, sites, server_test=self._read_server_test(), verify=_verify_context(fl_ctx))
        logged = {}
        try:
            model, one_round = drive(steps, lambda ask: self._broadcast(ask, abort_signal, fl_ctx),
                                     lambda text, phase: self._progress(fl_ctx, text, phase),
                                     lambda: self._log_drops(result, logged, fl_ctx))
        except ProtocolFailed as exc:
            raise JobFailed(str(exc)) from None
        if self.protocol.refine["rounds"]:
            one_round.save_json(run_dir / "global_tree_one_round.json")
        model.save_json(run_dir / "global_tree.json")
        write_text_atomic(run_dir / "rules.txt", export_text(model))
        try:
            plot_tree(model, run_dir / "global_tree.png")
        except Exception as exc:  # a picture must never cost the model
            self.log_warning(fl_ctx, f"could not draw the global tree: {exc}")

    def _log_drops(self, result, logged: dict, fl_ctx) -> None:
        """Log each reason the protocol recorded for dropping a site, once (the server's log says who and why)."""
        for site, reasons in (result.get("dropped_sites") or {}).items():
            if logged.get(site) != reasons:
                new = reasons[len(logged[site]) + 2:] if site in logged else reasons
                task, _, reason = new.partition(": ")
                self.log_error(fl_ctx, f"dropped {site} at {task}: {reason}")
                logged[site] = reasons

    def _broadcast(self, message, abort_signal, fl_ctx) -> dict:
        """One task to the sites the protocol named; site -> its reply as received, or why there is none."""
        if message.task not in TASKS:  # the executors handle these alone
            raise JobFailed(f"the protocol asked for task {message.task!r}, which no site handles")
        replied, failed = [], []

        def received(client_task, fl_ctx):  # NVFlare calls it with these keywords; it must never raise
            try:
                reply = client_task.result
                ok = reply is not None and reply.get_return_code() == ReturnCode.OK
                (replied if ok else failed).append(client_task.client.name)
                self._progress(fl_ctx, replied_line(message.phase, len(message.sites), replied, failed),
                               phase=message.phase)
            except Exception as exc:  # noqa: BLE001 - progress is never worth a result
                self.log_warning(fl_ctx, f"progress line not written: {exc}")

        task = Task(name=message.task, data=Shareable(message.data), timeout=self.task_timeout,
                    result_received_cb=received)
        collect(self, task, fl_ctx, message.sites, abort_signal)
        if abort_signal is not None and abort_signal.triggered:
            raise JobFailed(f"aborted during {message.task}")
        answers = {}
        for ct in task.client_tasks:
            site, reply = ct.client.name, ct.result
            if site not in message.sites:
                continue
            if reply is None:
                answers[site] = "no reply (timed out, or its result could not be serialized)"
            elif reply.get_return_code() != ReturnCode.OK:
                answers[site] = failure_reason(reply.get_return_code(), str(reply.get("error", "")),
                                               site_data=reply.get(FAILURE_KEY) == SITE_DATA)
                self.log_error(fl_ctx, f"{site} refused {message.task}: {answers[site]}")
            else:
                answers[site] = reply
        return answers

    def _read_server_test(self):
        if not self.server_test:
            return None
        schema = self.protocol.schema
        test = read_site_csv(self.server_test, schema, site="server")
        return encode(test, self.algorithm), test.y_codes()

    def _progress(self, fl_ctx, text: str, phase: str | None = None) -> None:
        """A progress line for the job script (when the job has a progress reporter); ``phase``: the line is one
        step of that phase (a log shows only the phase's last)."""
        engine = fl_ctx.get_engine() if fl_ctx is not None else None
        reporter = getattr(engine, "get_component", lambda _id: None)(PROGRESS_ID)
        if reporter is not None:
            reporter.emit(text, **({"phase": phase} if phase else {}))


def replied_line(phase: str, n_sites: int, replied: list, failed: list) -> str:
    """A phase's progress line as replies arrive: the sites that answered without an error; those that replied with
    one are named as failed (the protocol's own line then says how many replies were valid)."""
    text = f"{phase}: {len(replied)}/{n_sites} sites replied"
    return text + (f" ({len(failed)} failed: {', '.join(failed)})" if failed else "")


def _verify_context(fl_ctx):
    """What the server checks the sites' signed statements with, as each site will: the job id, the root CA of its own
    startup kit and its own identity (a site's list may not hold it). None without a kit (the simulator)."""
    engine = fl_ctx.get_engine()
    try:
        kit = Path(engine.get_workspace().get_startup_kit_dir())
    except Exception:  # noqa: BLE001 - no workspace or kit: the simulator
        return None
    if fl_ctx.get_prop(FLContextKey.SIMULATE_MODE, False) or not (kit / "rootCA.pem").is_file():
        return None
    root_ca = x509.load_pem_x509_certificate((kit / "rootCA.pem").read_bytes())
    return {"job_id": str(fl_ctx.get_job_id()), "root_ca": root_ca, "server_names": (fl_ctx.get_identity_name(),)}
