"""Schema discovery as a small FLARE job of its own: every site describes its bound training file, the server
merges the descriptions into ``schema.json`` (the data layer's :mod:`treeflare.data.discovery` does the work;
this is the glue).

Every job script runs it first with ``--schema discover`` (the default on POC and provisioned sites when no
``--dataset``/``--csv`` is given) and embeds the result in the training job, as it embeds a schema derived from
the submitter's data otherwise; ``treeflare schema discover`` runs it alone, for a person to review the result.
Every site must answer: a site that fails, sends an invalid reply or disagrees with the others stops the job
before any training, with a reason naming the sites and columns.

This module is the submitter's side (build the job, run it, read a reviewed schema file); ``controller`` and
``executor`` are the server's and the sites' sides, ``protocol`` what both name.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ...data import DataError, Schema
from ...data.discovery import DEFAULT_MIN_CATEGORY_ROWS, check_min_category_rows
from ...data.schema import read_schema_file as read_schema_document
from ...files import write_json_atomic
from .controller import JOB_NAME, RESULT_FILE, SCHEMA_FILE, SchemaDiscoveryController, schema_file
from .executor import SchemaDiscoveryExecutor
from .protocol import TASK


def build_discovery_job(sites: list[str], data_root: str = "", *, label=None, id_column=None, categorical=None,
                        ordinal=None, min_category_rows: int = DEFAULT_MIN_CATEGORY_ROWS, vertical=False,
                        task_timeout: int = 300, binding: str = ""):
    from nvflare.job_config.api import FedJob

    from ..recipe import TreeflareRecipe

    job = FedJob(name=JOB_NAME, min_clients=len(sites))
    job.to_server(SchemaDiscoveryController(sites=sites, label=label, id_column=id_column, categorical=categorical,
                                            ordinal=ordinal, min_category_rows=min_category_rows, vertical=vertical,
                                            task_timeout=task_timeout), id="schema_discovery")
    job.to_clients(SchemaDiscoveryExecutor(data_root=data_root or "", binding=binding), tasks=[TASK])
    return TreeflareRecipe(job, sites)


def discover(args, sites: list[str], *, data_root: str = "", vertical: bool = False, out: Path | None = None,
             own_workspace: bool = False) -> tuple[Schema, dict]:
    """Run the discovery job where ``args.env`` says (its FLARE folders under ``<workspace>/discovery/``, or
    ``<workspace>/`` itself with ``own_workspace``: a workspace of discovery alone) and return the sites' schema and
    the discovery summary; the schema is written to ``out`` (default ``<workspace>/schema.json``). A failure or a
    conflict ends the command with the reason (exit 1), written to
    ``<workspace>/report.json`` too."""
    from ...cli import parse_categorical, parse_ordinal
    from ..runner import read_server_result, run_job

    workspace = Path(args.workspace).resolve()
    if getattr(args, "export", None):
        raise DataError("--export writes one job folder: give it a reviewed schema (--schema schema.json, written "
                        "by treeflare schema) instead of --schema discover")
    k = check_min_category_rows(DEFAULT_MIN_CATEGORY_ROWS if getattr(args, "min_category_rows", None) is None
                                else args.min_category_rows)
    job = build_discovery_job(sites, data_root, label=_strip(getattr(args, "label", None)),
                              id_column=_strip(getattr(args, "id", None)),
                              categorical=parse_categorical(getattr(args, "categorical", None)),
                              ordinal=parse_ordinal(getattr(args, "ordinal", None)), min_category_rows=k,
                              vertical=vertical, task_timeout=int(getattr(args, "task_timeout", 300) or 300),
                              binding=getattr(args, "binding", "") or "")
    sub = argparse.Namespace(**{**vars(args), "workspace": workspace if own_workspace else workspace / "discovery"})
    print(f"schema discovery on {', '.join(sites)} (a site reports a category value only if {k} of its rows or "
          "more hold it, or its own floor if that is higher)", flush=True)
    run_dir = run_job(job, sub, sites)
    server = read_server_result(run_dir, RESULT_FILE, workspace, JOB_NAME)
    if server is None:
        raise SystemExit(1)
    schema = Schema.from_dict(server["schema"])
    parties = check_parties(server.get("parties"), schema, sites, "the server's discovery result") if vertical else None
    target = Path(out) if out is not None else workspace / SCHEMA_FILE
    write_json_atomic(target, schema_file(schema, server["discovery"], parties))
    rows = ", ".join(f"{s} {info['n_rows']}" for s, info in server["discovery"]["sites"].items())
    held = ("; columns held: " + ", ".join(f"{s} {sum(p == s for p in parties.values())}" for s in sites)
            if parties else "")
    print(f"schema: {len(schema.features)} features ({len(schema.categorical)} categorical, {len(schema.ordinal)} "
          f"ordinal), label {schema.label!r} with {len(schema.classes)} classes; rows: {rows}{held}\n"
          f"written to {target}", flush=True)
    return schema, {**server["discovery"], "parties": parties}


def _strip(value):
    return value.strip() if isinstance(value, str) and value.strip() else None


def check_parties(parties, schema: Schema, sites: list[str] | None, source: str) -> dict[str, str]:
    """``parties`` (column -> the party holding it, as a vertical ``schema.json`` or the discovery result records
    them) checked against ``schema`` and, when given, the job's ``sites``; returns it in schema order. Raises
    DataError naming ``source`` and the column."""
    if not isinstance(parties, dict):
        raise DataError(f"{source}: expected which party holds each column")
    out = {}
    for name in schema.feature_names:
        party = parties.get(name)
        if not isinstance(party, str) or not party.strip():
            raise DataError(f"{source}: column {name!r}: no party named (set its \"party\" to the site holding it)")
        if sites is not None and party not in sites:
            raise DataError(f"{source}: column {name!r}: party {party[:60]!r} is not one of this job's sites "
                            f"({', '.join(sites)})")
        out[name] = party
    if set(parties) - set(out):
        raise DataError(f"{source}: a party is named for a column that is not a feature")
    return out


def schema_file_parties(path, schema: Schema, sites: list[str] | None = None) -> dict[str, str] | None:
    """The party of each column in a reviewed ``schema.json`` (each feature's ``"party"``; written by a vertical
    discovery), None when the file names none (a horizontal schema, an older file): checked by
    :func:`check_parties`. The job itself reads each party's columns from that party's data; this is for the
    reviewer's table and to catch a file written for other sites."""
    import json

    doc = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    doc = doc["schema"] if isinstance(doc.get("schema"), dict) else doc
    named = {f["name"]: f["party"] for f in doc["features"] if "party" in f}
    return check_parties(named, schema, sites, str(path)) if named else None


def read_schema_file(path) -> Schema:
    """A reviewed ``schema.json`` (written by ``treeflare schema``, perhaps edited by a person): the data layer's
    reader, plus what a job needs of it (two classes, a feature)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: schema file not found (write one with treeflare schema, or pass --schema discover)")
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
                        "min_category_rows": summary["min_category_rows"],
                        **({"parties": summary["parties"]} if summary["parties"] else {})}
    schema = read_schema_file(args.schema)
    if vertical and not schema.id_column:
        raise DataError(f"--schema {args.schema}: a vertical job joins the parties on an id column; the file names "
                        "none (set \"id_column\")")
    parties = schema_file_parties(args.schema, schema, sites) if vertical else None
    return schema, {"schema": "file", "schema_file": str(Path(args.schema).resolve()),
                    **({"parties": parties} if parties else {})}
