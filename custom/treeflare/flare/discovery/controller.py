"""Server side of schema discovery: every site must answer; the profiles are checked and merged into ``schema.json``
(written to the run folder) or the job fails naming the sites and columns."""

from __future__ import annotations

from pathlib import Path

from nvflare.apis.controller_spec import Task
from nvflare.apis.shareable import Shareable

from ...data import DataError, Schema
from ...data.discovery import (DEFAULT_MIN_CATEGORY_ROWS, SchemaConflict, check_min_category_rows, check_profile,
                               column_parties, discovery_summary, merge_profiles)
from ...files import write_json_atomic
from ..workflow import JobFailed, ResultWorkflow, collect, replies_of
from .protocol import TASK

JOB_NAME = "schema_discovery"
RESULT_FILE = "schema_discovery_result.json"
SCHEMA_FILE = "schema.json"


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
        collect(self, task, fl_ctx, self.sites, abort_signal)
        if abort_signal is not None and abort_signal.triggered:
            raise JobFailed("aborted during schema discovery")
        raw, problems = replies_of(task, self.sites, key="profile")
        profiles = {}
        for site, profile in raw.items():
            try:
                profiles[site] = check_profile(profile, site, declared_ordinal=self.ordinal,
                                               min_category_rows=self.min_category_rows)
            except DataError as exc:
                problems[site] = str(exc)
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
        result["parties"] = column_parties(profiles, schema) if self.vertical else None
        write_json_atomic(run_dir / SCHEMA_FILE, schema_file(schema, result["discovery"], result["parties"]))


def schema_file(schema: Schema, discovery: dict | None = None, parties: dict | None = None) -> dict:
    """The contents of a ``schema.json`` (a :class:`Schema` as JSON, with how it was made beside it). ``parties``
    (vertical): the party holding each column, written as each feature's ``"party"`` for a reviewer (a job reads
    the columns a party holds from that party's own data; ``Schema.from_dict`` ignores the field)."""
    out = schema.to_dict()
    if parties:
        out["features"] = [{**f, "party": parties[f["name"]]} for f in out["features"]]
    if discovery is not None:
        out["discovery"] = discovery
    return out
