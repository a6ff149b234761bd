"""Schema discovery as a small FLARE job of its own: every site describes its bound training file, the server
merges the descriptions into ``schema.json`` (the data layer's :mod:`treeflare.data.discovery` does the work;
this is the glue).

Every job script runs it first with ``--schema discover`` (the default on POC and provisioned sites when no
``--dataset``/``--csv`` is given) and embeds the result in the training job, as it embeds a schema derived from
the submitter's data otherwise; ``scripts/schema.py discover`` runs it alone, for a person to review the result.
Every site must answer: a site that fails, sends an invalid reply or disagrees with the others stops the job
before any training, with a reason naming the sites and columns.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nvflare.apis.controller_spec import Task
from nvflare.apis.executor import Executor
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.shareable import Shareable, make_reply

from ..data import DataError, Schema
from ..data.schema import read_schema_file as read_schema_document
from ..data.discovery import (DEFAULT_MIN_CATEGORY_ROWS, SchemaConflict, check_min_category_rows, check_profile,
                              discovery_summary, merge_profiles, site_min_category_rows, site_profile)
from ..data.errors import public_error
from ..reporting import write_json_atomic
from .site_config import load_binding
from .workflow import JobFailed, ResultWorkflow

JOB_NAME = "schema_discovery"
TASK = "treeflare_discover_schema"
RESULT_FILE = "schema_discovery_result.json"
SCHEMA_FILE = "schema.json"


class SchemaDiscoveryExecutor(Executor):
    """Site side: reads this site's bound training file (``local/treeflare_site.json``, ``$TREEFLARE_DATA_ROOT``,
    else ``<data_root>/<site>/``) and replies with its profile. The site sets its floor for ``k`` (its binding's
    ``min_category_rows``, default 5): a job may ask for a higher ``k``, never a lower one."""

    def __init__(self, data_root: str = ""):
        super().__init__()
        self.data_root = data_root

    def execute(self, task_name: str, shareable: Shareable, fl_ctx, abort_signal) -> Shareable:
        site = fl_ctx.get_identity_name()
        if task_name != TASK:
            return make_reply(ReturnCode.TASK_UNKNOWN)
        try:
            binding = load_binding(site, fl_ctx, self.data_root)
            self.log_info(fl_ctx, f"{site} describes {binding.path('train')} ({binding.source})")
            reply = make_reply(ReturnCode.OK)
            reply["profile"] = profile_site(binding, site, dict(shareable.get("request") or {}))
            return reply
        except Exception as exc:  # noqa: BLE001 -- any failure becomes a reply, never a crash of the site
            self.log_error(fl_ctx, f"{task_name} failed at {site}: {type(exc).__name__}: {exc}")
            reply = make_reply(ReturnCode.EXECUTION_EXCEPTION)
            reply["error"] = public_error(exc)
            return reply


def profile_site(binding, site: str, request: dict) -> dict:
    """A site's profile of its training file for the server's ``request`` (label, id_column, categorical,
    ordinal, min_category_rows), bounded by the site's binding: its floor for k, the numeric columns it lets a job
    read as categories, and its label and id columns, which the job's names rename (never pick another column)."""
    label, id_column = request.get("label"), request.get("id_column")
    categorical, ordinal = request.get("categorical") or [], request.get("ordinal") or {}
    if not isinstance(categorical, list) or not all(isinstance(c, str) for c in categorical):
        raise DataError("the request's 'categorical' is not a list of column names",
                        problem="the request's 'categorical' is not a list of column names", site=site)
    if not isinstance(ordinal, dict) or not all(isinstance(c, str) for c in ordinal):
        raise DataError("the request's 'ordinal' does not map column names to levels",
                        problem="the request's 'ordinal' does not map column names to levels", site=site)
    raw = binding.read_raw("train", site, label, id_column)
    # the site's floor, not the job's word, bounds k from below
    k = site_min_category_rows(request.get("min_category_rows", DEFAULT_MIN_CATEGORY_ROWS), binding.min_category_rows)
    return site_profile(raw, label=label or binding.label_column, id_column=id_column or binding.id_column,
                        categorical=categorical, ordinal=ordinal, min_category_rows=k,
                        categorical_allowed=binding.categorical_allowed, file=binding.path("train").name, site=site)


class SchemaDiscoveryController(ResultWorkflow):
    JOB = JOB_NAME
    RESULT_FILE = RESULT_FILE

    def __init__(self, sites: list, label: str | None = None, id_column: str | None = None,
                 categorical: list | None = None, ordinal: dict | None = None,
                 min_category_rows: int = DEFAULT_MIN_CATEGORY_ROWS, vertical: bool = False, task_timeout: int = 300):
        """
        Args:
            sites: the sites that must describe their data (in order; vertical: the active party first).
            label, id_column: the job's names for the label and id columns (None: each site's binding names them).
            categorical: columns declared categorical; ordinal: columns declared ordinal, with levels lowest first.
            min_category_rows: the k the job asks for; each site uses it or its own floor, whichever is higher.
            vertical: sites hold different columns of the same rows (joined on the id column).
        """
        super().__init__()
        self.sites = [str(s) for s in sites]
        self.label, self.id_column = label, id_column
        self.categorical = list(categorical or [])
        self.ordinal = {str(c): list(v) for c, v in (ordinal or {}).items()}
        self.min_category_rows = check_min_category_rows(min_category_rows)
        self.vertical = bool(vertical)
        self.task_timeout = int(task_timeout)

    def initial_result(self) -> dict:
        return {**super().initial_result(), "sites": self.sites}

    def run_workflow(self, result, run_dir: Path, abort_signal, fl_ctx):
        request = {"label": self.label, "id_column": self.id_column, "categorical": self.categorical,
                   "ordinal": self.ordinal, "min_category_rows": self.min_category_rows}
        task = Task(name=TASK, data=Shareable({"request": request}), timeout=self.task_timeout)
        self.broadcast_and_wait(task, fl_ctx, targets=self.sites, min_responses=len(self.sites),
                                abort_signal=abort_signal)
        if abort_signal is not None and abort_signal.triggered:
            raise JobFailed("aborted during schema discovery")
        profiles, problems = {}, {}
        for ct in task.client_tasks:
            site, reply = ct.client.name, ct.result
            if site not in self.sites:
                continue
            if reply is None:
                problems[site] = "no reply (timed out)"
            elif reply.get_return_code() != ReturnCode.OK:
                problems[site] = f"{reply.get('error') or reply.get_return_code()}"[:2000]
            else:
                try:
                    profiles[site] = check_profile(reply.get("profile"), site, declared_ordinal=self.ordinal,
                                                   min_category_rows=self.min_category_rows)
                except DataError as exc:
                    problems[site] = str(exc)
        for site in self.sites:
            if site not in profiles and site not in problems:
                problems[site] = "no reply"
        if problems:
            raise JobFailed("schema discovery: " + "; ".join(f"{s}: {p}" for s, p in problems.items()))
        profiles = {s: profiles[s] for s in self.sites}  # site order, whatever the order of the replies
        try:
            schema = merge_profiles(profiles, ordinal=self.ordinal, vertical=self.vertical, site_order=self.sites)
        except SchemaConflict as exc:
            result["conflicts"] = exc.conflicts
            raise JobFailed(str(exc)) from None
        result["schema"] = schema.to_dict()
        result["discovery"] = discovery_summary(profiles, schema)
        write_json_atomic(run_dir / SCHEMA_FILE, schema_file(schema, result["discovery"]))


def schema_file(schema: Schema, discovery: dict | None = None) -> dict:
    """The contents of a ``schema.json`` (a :class:`Schema` as JSON, with how it was made beside it)."""
    out = schema.to_dict()
    if discovery is not None:
        out["discovery"] = discovery
    return out


# -- the submitter's side -----------------------------------------------------------------------------
def build_discovery_job(sites: list[str], data_root: str = "", *, label=None, id_column=None, categorical=None,
                        ordinal=None, min_category_rows: int = DEFAULT_MIN_CATEGORY_ROWS, vertical=False,
                        task_timeout: int = 300):
    from nvflare.job_config.api import FedJob

    from .runner import ship_package

    job = FedJob(name=JOB_NAME, min_clients=len(sites))
    job.to_server(SchemaDiscoveryController(sites=sites, label=label, id_column=id_column, categorical=categorical,
                                            ordinal=ordinal, min_category_rows=min_category_rows, vertical=vertical,
                                            task_timeout=task_timeout), id="schema_discovery")
    job.to_clients(SchemaDiscoveryExecutor(data_root=data_root or ""), tasks=[TASK])
    ship_package(job)
    return job


def discover(args, sites: list[str], *, data_root: str = "", vertical: bool = False, out: Path | None = None
             ) -> tuple[Schema, dict]:
    """Run the discovery job where ``args.env`` says (its FLARE folders under ``<workspace>/discovery/``) and
    return the sites' schema and the discovery summary; the schema is written to ``out`` (default
    ``<workspace>/schema.json``). A failure or a conflict ends the command with the reason (exit 1), written to
    ``<workspace>/report.json`` too."""
    from ..cli import parse_categorical, parse_ordinal
    from .runner import read_server_result, run_job

    workspace = Path(args.workspace).resolve()
    if getattr(args, "export", None):
        raise DataError("--export writes one job folder: give it a reviewed schema (--schema schema.json, written "
                        "by scripts/schema.py) instead of --schema discover")
    k = check_min_category_rows(DEFAULT_MIN_CATEGORY_ROWS if getattr(args, "min_category_rows", None) is None
                                else args.min_category_rows)
    job = build_discovery_job(sites, data_root, label=_strip(getattr(args, "label", None)),
                              id_column=_strip(getattr(args, "id", None)),
                              categorical=parse_categorical(getattr(args, "categorical", None)),
                              ordinal=parse_ordinal(getattr(args, "ordinal", None)), min_category_rows=k,
                              vertical=vertical, task_timeout=int(getattr(args, "task_timeout", 300) or 300))
    sub = argparse.Namespace(**{**vars(args), "workspace": workspace / "discovery"})
    print(f"schema discovery on {', '.join(sites)} (a site reports a category value only if {k} of its rows or "
          "more hold it, or its own floor if that is higher)", flush=True)
    run_dir = run_job(job, sub, sites)
    server = read_server_result(run_dir, RESULT_FILE, workspace, JOB_NAME)
    if server is None:
        raise SystemExit(1)
    schema = Schema.from_dict(server["schema"])
    target = Path(out) if out is not None else workspace / SCHEMA_FILE
    write_json_atomic(target, schema_file(schema, server["discovery"]))
    rows = ", ".join(f"{s} {info['n_rows']}" for s, info in server["discovery"]["sites"].items())
    print(f"schema: {len(schema.features)} features ({len(schema.categorical)} categorical, {len(schema.ordinal)} "
          f"ordinal), label {schema.label!r} with {len(schema.classes)} classes; rows: {rows}\n"
          f"written to {target}", flush=True)
    return schema, server["discovery"]


def _strip(value):
    return value.strip() if isinstance(value, str) and value.strip() else None


def read_schema_file(path) -> Schema:
    """A reviewed ``schema.json`` (written by ``scripts/schema.py``, perhaps edited by a person): the data layer's
    reader, plus what a job needs of it (two classes, a feature)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: schema file not found (write one with scripts/schema.py, or pass --schema discover)")
    schema = read_schema_document(path)
    if len(schema.classes) < 2:
        raise DataError(f"{path}: the label needs at least 2 classes, the file lists {list(schema.classes)}")
    if not schema.features:
        raise DataError(f"{path}: no feature columns")
    return schema


def sites_schema(args, sites: list[str], *, data_root: str = "", vertical: bool = False) -> tuple[Schema, dict]:
    """The schema of a job whose data only the sites hold: ``--schema FILE`` read, or ``--schema discover`` run.
    Returns (schema, what to record in the report)."""
    if args.schema == "discover":
        schema, summary = discover(args, sites, data_root=data_root, vertical=vertical)
        return schema, {"schema": "discovered", "schema_file": str(Path(args.workspace).resolve() / SCHEMA_FILE),
                        "site_rows": {s: v["n_rows"] for s, v in summary["sites"].items()},
                        "min_category_rows": summary["min_category_rows"]}
    schema = read_schema_file(args.schema)
    if vertical and not schema.id_column:
        raise DataError(f"--schema {args.schema}: a vertical job joins the parties on an id column; the file names "
                        "none (set \"id_column\")")
    return schema, {"schema": "file", "schema_file": str(Path(args.schema).resolve())}
