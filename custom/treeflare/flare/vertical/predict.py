"""The vertical job's prediction run (``treeflare vertical --predict MODEL_DIR``): a FLARE job in which every
party loads only its own part of a trained model and its own new rows, and the active site gets the predictions
(:mod:`treeflare.vertical.prediction`; the same controller and executor as training, in ``mode="predict"``).
Its first phase is a private set intersection of the new rows' ids (``treeflare.flare.psi``, kind ``predict``):
the rows every party holds are predicted, and the active site learns how many of its own it could not score.

Where the new rows come from: ``--csv`` (or ``--dataset``), split by columns as training split its data into
``<workspace>/predict_data/<site>/`` together with each site's own model part, which the sites read as their data
root (simulator, POC; ``--overlap F``: each party gets the shared rows and rows of its own, as training's
``--overlap`` deals them); otherwise each site's binding (``predict``, ``vertical_model``; see ``site_config``).
Writes ``<workspace>/predictions.csv`` (copied from the active site's run folder when it is on this machine) and
``<workspace>/report.json``.
"""
from __future__ import annotations

import io
import json
import shutil
import time
from pathlib import Path

from nvflare.job_config.api import FedJob

from ...data import DataError, load_dataset, site_name
from ...data.csv_io import read_prediction_rows, read_raw
from ...data.separators import check_separator
from ...data.federation import write_marked_folder
from ...files import write_json_atomic
from ...vertical.model_parts import find_model_parts, model_sites, prediction_site_files
from ..psi.job import add_psi, psi_options, psi_report
from ..psi.protocol import RESULT_FILE as PSI_RESULT
from ..recipe import TreeflareRecipe
from ..runner import find_site_file, one_poc, read_server_result, run_job
from .controller import RESULT_FILE, VerticalController
from .executor import PREDICTIONS, VerticalExecutor
from .protocol import MSG, STEP


def predict_main(args, job_name: str) -> int:
    """Run the prediction job that ``args`` describe and write ``<workspace>/report.json`` (and predictions.csv);
    the exit status."""
    given = [opt for opt, dest in (("--schema", "schema"), ("--label", "label"), ("--id", "id"),
                                   ("--categorical", "categorical"), ("--ordinal", "ordinal"))
             if getattr(args, dest, None)]
    if given:
        raise DataError(f"{', '.join(given)}: a prediction run takes its columns from the model's parts; give the "
                        "new rows with --csv, or leave them to each site's own file")
    if args.csv and args.dataset:
        raise DataError("--predict: give the new rows with --csv or --dataset, not both")
    workspace, model_dir = Path(args.workspace).resolve(), Path(args.predict).resolve()
    if workspace in (model_dir, model_dir.parent):
        raise DataError(f"--workspace {workspace}: holds the model ({model_dir}); write the predictions elsewhere")
    _folder, parts = find_model_parts(model_dir)
    trained = json.loads((model_dir / "report.json").read_text()) if (model_dir / "report.json").is_file() else {}
    sites = model_sites(parts)
    if sites is None and isinstance(trained.get("sites"), dict):
        sites = [trained["sites"]["active"], *trained["sites"]["passive"]]
    sites = sites or [site_name(i) for i in range(args.passive + 1)]
    workspace.mkdir(parents=True, exist_ok=True)
    new_rows = None
    if args.csv or args.dataset:
        if args.env == "prod":
            raise DataError("--csv splits the new rows among sites on this machine (simulator, POC); on real sites "
                            "each site reads its own new rows and model part (its binding's 'predict' and "
                            "'vertical_model'): leave out --csv")
        if args.csv:
            raw = read_prediction_rows(args.csv, sum(len(p.get("features") or []) for p in parts.values()),
                                       sep=check_separator(getattr(args, "sep", None)))
            new_rows = str(Path(args.csv).resolve())
        else:  # an embedded dataset's rows, with the ids its training run gave them (a demonstration)
            text = load_dataset(args.dataset).with_row_ids().to_frame().to_csv(index=False)
            raw, new_rows = read_raw(args.dataset, opener=lambda: io.StringIO(text)), f"dataset {args.dataset}"
        files = prediction_site_files(raw, parts, sites, source=new_rows, overlap=getattr(args, "overlap", None) or 1.0,
                                      seed=args.seed)
        data_root = write_marked_folder(workspace / "predict_data", files, written_by="treeflare vertical prediction")
    else:
        data_root = args.data_root
        if args.env == "sim" and not data_root:
            raise DataError("give the new rows: --csv FILE (split by columns like training), or --data-root DIR "
                            "holding DIR/<site>/predict.csv and each site's model part")
    job = FedJob(name=f"{job_name}_predict", min_clients=len(sites))
    # the PSI phase first: each party keeps the new rows every party holds (one is enough to predict). The id column
    # is the model's (its parts here, else the training report's); a site's binding may name its own for it
    id_column = ((parts.get(sites[0]) or {}).get("schema") or {}).get("id_column") or trained.get("id_column")
    id_column = id_column if isinstance(id_column, str) and id_column else None
    add_psi(job, sites, kinds=("predict",), data_root=str(data_root or ""), binding=getattr(args, "binding", "") or "",
            schema={"id_column": id_column} if id_column else None, min_rows=1, task_timeout=args.task_timeout,
            **{k: v for k, v in psi_options(args).items() if k in ("method", "max_ratio")})
    job.to_server(VerticalController(active_site=sites[0], passive_sites=sites[1:], task_timeout=args.task_timeout,
                                     job_info={"model_dir": str(model_dir)}, mode="predict"),
                  id="vertical_controller")
    job.to_clients(VerticalExecutor(data_root=str(data_root or ""), workers=args.workers,
                                    binding=getattr(args, "binding", "") or "",
                                    raw_text=bool(getattr(args, "raw_text", False))), tasks=[STEP, MSG])
    t = time.perf_counter()
    with one_poc(args, sites):
        run_dir = run_job(TreeflareRecipe(job, sites), args, sites)
    flare_s = time.perf_counter() - t
    psi = read_server_result(run_dir, PSI_RESULT, workspace, f"{job_name}_predict")  # a failed PSI ends the job
    if psi is None:
        return 1
    server = read_server_result(run_dir, RESULT_FILE, workspace, f"{job_name}_predict")
    if server is None:
        return 1
    found = find_site_file(run_dir, sites[0], PREDICTIONS)
    out = workspace / "predictions.csv"
    if found is not None:
        shutil.copyfile(found, out)
    report = {
        "job": f"{job_name}_predict", "mode": "predict", "status": "completed", "n_rows": server["n_rows"],
        # the active site's new rows that some party does not hold: not scored (predictions.csv lists the others)
        "n_unscored": server.get("n_unscored"),
        "model": {"dir": str(model_dir), "model_id": server.get("model_id"), "model": server.get("model"),
                  "objective": server.get("objective"), "n_trees": server.get("n_trees"),
                  "trained_on": trained.get("dataset")},
        "new_rows": new_rows or "each site's own file (its binding's 'predict')",
        "sites": {"active": sites[0], "passive": sites[1:]}, "env": args.env,
        "predictions": str(out.relative_to(workspace)) if found is not None else None,
        "messages": server.get("messages"),
        "psi": psi_report(psi, run_dir, sites),
        "timings_s": {**{f"active_{k}": v for k, v in (server.get("timings_s") or {}).items()}, "flare_run": flare_s},
    }
    write_json_atomic(workspace / "report.json", report)
    where = out if found is not None else f"{sites[0]}'s run folder ({PREDICTIONS}); the predictions never left it"
    unscored = server.get("n_unscored") or 0
    print(f"\n{server['n_rows']} predictions of the vertical {server.get('model')} (model {server.get('model_id')}, "
          f"{len(sites)} parties) in {where}\n{unscored} of {sites[0]}'s {server['n_rows'] + unscored} rows not scored "
          f"(ids some other party does not hold; the private set intersection left them out)"
          f"\nreport: {workspace / 'report.json'}")
    return 0
