"""The PSI phase, the submitter's side: :func:`add_psi` puts it into a job (the vertical jobs' first phase), and
:func:`build_psi_job` / :func:`run_psi` run it as a job of its own (``treeflare psi``).

The phase, in the order its server workflows run (``controller``): our check (each site reads and checks its ids;
a bad party ends the job before any encryption), NVFlare's DH-PSI (``nvflare.app_common.psi`` with
``nvflare.app_opt.psi.dh_psi`` on openmined-psi), our result (each site's rows kept, seconds, bytes; written to
``psi_result.json`` in the server's run folder). Each site keeps its intersection in its own run folder
(``<run folder>/psi/intersection.json``, see ``protocol.intersection_dir``); nothing about the ids leaves it.
"""

from __future__ import annotations

import time
from pathlib import Path

from ...data.intersection import DEFAULT_MIN_ROWS
from ...psi.party import DEFAULT_MAX_RATIO, check_ratio
from .controller import MeteredDhPSIController, PsiCheckController, PsiResultController, check_min_rows
from .executor import DH_PSI_ID, LOCAL_PSI_ID, MeteredDhPSITaskHandler, PsiSiteExecutor, SiteIds
from .protocol import (JOB_NAME, PSI_TASK, RESULT_FILE, TASK_CHECK, TASK_DISCARD, TASK_RESULT,
                       check_kinds, check_method, intersection_dir)

SERVER_IDS = ("treeflare_psi_check", "treeflare_psi_dh", "treeflare_psi_result")
ECDH_SERVER_ID = "treeflare_psi_ecdh"
ECDH_EXECUTOR_ID = "treeflare_psi_ecdh_executor"


def add_psi(job, sites, *, kinds=("train", "test"), data_root: str = "", schema=None, binding: str = "",
            min_rows: int = DEFAULT_MIN_ROWS, task_timeout: int = 600, method: str = "ecdh",
            max_ratio: float = DEFAULT_MAX_RATIO, workers: int | str = 0, audit: bool = False) -> None:
    """Add the PSI phase to ``job`` (a ``FedJob``), **before** the job's own controller is added (server workflows
    run in the order added).

    Args:
        sites: the parties (all of the job's sites).
        kinds: the kinds of rows to intersect: ``("train", "test")`` for training, ``("predict",)`` for a
            prediction run's new rows; each kind only ever matches the same kind.
        data_root: the sites' data folder (``<data_root>/<site>/``) when they have no binding of their own.
        schema: the job's schema (a ``Schema`` or its dict); only its ``id_column`` is read (else the site binding's
            id column, else the federation's ``partition.json``).
        binding: the named site binding to read ("" the default one).
        min_rows: the fewest training rows the intersection may hold (the job fails below it); a prediction
            run (no ``train`` kind) needs a non-empty intersection.
        task_timeout: seconds each site has for each of the phase's tasks (a round of ECDH-PSI included).
        method: ``"ecdh"`` (``treeflare.psi``: ECDH-PSI over X25519, the server relaying sealed messages) or
            ``"nvflare"`` (NVFlare's DH-PSI on openmined-psi).
        max_ratio: the largest a party's set may be over the largest other party's (the check stops the phase
            before any encryption, naming the party; each site may lower it, ``$TREEFLARE_PSI_MAX_RATIO``).
        workers: ``--psi ecdh``: each party's blinding pool (processes, 0 = all cores, or ``dask-local:N``).
        audit: ``--psi ecdh``: the controller records every relayed request and reply (``audit.record_exchange``;
            tests and reviews only).
    """
    sites = [str(s) for s in sites]
    if len(sites) < 2:
        raise ValueError("PSI needs at least 2 parties")
    kinds = check_kinds(list(kinds))
    min_rows = check_min_rows(min_rows)
    method = check_method(method)
    max_ratio = check_ratio(max_ratio)
    schema_dict = schema.to_dict() if hasattr(schema, "to_dict") else (dict(schema) if schema else None)
    id_only = {"id_column": schema_dict.get("id_column")} if schema_dict and schema_dict.get("id_column") else None
    common = {"sites": sites, "kinds": kinds, "min_rows": min_rows, "task_timeout": int(task_timeout)}
    job.to_server(PsiCheckController(**common, max_ratio=max_ratio), id=SERVER_IDS[0])
    if method == "ecdh":
        from .ecdh_controller import EcdhPsiController
        from .ecdh_executor import EcdhPsiExecutor

        job.to_server(EcdhPsiController(**common, max_ratio=max_ratio, audit=audit), id=ECDH_SERVER_ID)
        job.to_clients(EcdhPsiExecutor(sites=sites, local_psi_id=LOCAL_PSI_ID, max_ratio=max_ratio, workers=workers),
                       id=ECDH_EXECUTOR_ID, tasks=[TASK_CHECK, TASK_RESULT, TASK_DISCARD])
    else:
        from nvflare.app_common.psi.psi_executor import PSIExecutor

        job.to_server(MeteredDhPSIController(**common), id=SERVER_IDS[1])
        job.to_clients(PSIExecutor(psi_algo_id=DH_PSI_ID), id="treeflare_psi_executor", tasks=[PSI_TASK])
        job.to_clients(MeteredDhPSITaskHandler(local_psi_id=LOCAL_PSI_ID), id=DH_PSI_ID)
        job.to_clients(PsiSiteExecutor(local_psi_id=LOCAL_PSI_ID, meter_id=DH_PSI_ID), id="treeflare_psi_tasks",
                       tasks=[TASK_CHECK, TASK_RESULT, TASK_DISCARD])
    job.to_server(PsiResultController(**common), id=SERVER_IDS[2])
    job.to_clients(SiteIds(kinds=kinds, data_root=str(data_root or ""), schema=id_only, binding=binding or ""),
                   id=LOCAL_PSI_ID)


def build_psi_job(sites, *, kinds=("train", "test"), data_root: str = "", schema=None, binding: str = "",
                  min_rows: int = DEFAULT_MIN_ROWS, task_timeout: int = 600, name: str = JOB_NAME, audit: bool = False,
                  method: str = "ecdh", max_ratio: float = DEFAULT_MAX_RATIO, workers: int | str = 0):
    """The PSI phase as a job of its own (a :class:`~treeflare.flare.recipe.TreeflareRecipe`). ``audit``: a server filter records what crosses the server
    (``audit.MessageRecorder``; for tests and reviews: it writes the DH-PSI messages to the server's run folder)."""
    from nvflare.job_config.api import FedJob

    from ..recipe import TreeflareRecipe

    job = FedJob(name=name, min_clients=len(sites))
    if audit:
        from nvflare.job_config.defs import FilterType

        from .audit import MessageRecorder

        tasks = [TASK_CHECK, PSI_TASK, TASK_RESULT, TASK_DISCARD]  # FLARE matches filters to task names exactly
        job.to_server(MessageRecorder(), id="treeflare_psi_audit_data", filter_type=FilterType.TASK_DATA, tasks=tasks)
        job.to_server(MessageRecorder(), id="treeflare_psi_audit_result", filter_type=FilterType.TASK_RESULT,
                      tasks=tasks)
    add_psi(job, sites, kinds=kinds, data_root=data_root, schema=schema, binding=binding, min_rows=min_rows,
            task_timeout=task_timeout, method=method, max_ratio=max_ratio, workers=workers, audit=audit)
    return TreeflareRecipe(job, sites)


def psi_options(args) -> dict:
    """``add_psi``'s method, ratio and workers from a command's parsed ``--psi``, ``--psi-max-ratio`` and
    ``--workers`` (defaults where the command has none)."""
    return {"method": getattr(args, "psi", None) or "ecdh",
            "max_ratio": float(getattr(args, "psi_max_ratio", None) or DEFAULT_MAX_RATIO),
            "workers": getattr(args, "workers", 0) or 0}


def psi_report(server: dict, run_dir, sites) -> dict:
    """What a job script copies into its report under ``"psi"``: the server's result, and where each site keeps
    its intersection (the file, where that site's run folder is on this machine)."""
    from ..runner import find_site_file
    from ...data.intersection import INTERSECTION_FILE

    kept = {}
    for site in sites:
        found = find_site_file(run_dir, site, f"{intersection_dir('.').name}/{INTERSECTION_FILE}")
        kept[site] = str(found) if found is not None else None
    return {**server, "intersection_files": kept}


def run_psi(args, sites, *, data_root: str = "", schema=None, kinds=("train", "test"),
            audit: bool = False) -> tuple[dict | None, Path]:
    """Run the PSI job where ``args.env`` says; (the server's result, or None when it failed; the run folder)."""
    from ..runner import read_server_result, run_job

    workspace = Path(args.workspace).resolve()
    job = build_psi_job(sites, kinds=kinds, data_root=data_root, schema=schema,
                        binding=getattr(args, "binding", "") or "", min_rows=args.psi_min_rows,
                        task_timeout=int(getattr(args, "task_timeout", 600) or 600), audit=audit,
                        **psi_options(args))
    start = time.perf_counter()
    run_dir = run_job(job, args, sites)
    server = read_server_result(run_dir, RESULT_FILE, workspace, JOB_NAME)
    if server is not None:
        server = {**psi_report(server, run_dir, sites), "flare_run_s": time.perf_counter() - start}
    return server, run_dir
