"""Every treeflare job as an NVFlare :class:`~nvflare.recipe.spec.Recipe`, on NVFlare's public API only.

A recipe here is built from the job's settings (each job's ``*Recipe`` class: :mod:`.icdta4fl.recipe`,
:mod:`.xgb.recipe`, :mod:`.vertical.recipe`, and the small PSI, discovery and vertical-prediction jobs); it ships
the whole ``treeflare`` package as the apps' custom code (NVFlare's automatic copy is shallow: it would take only
each component's own file), and runs as any recipe does::

    recipe = ICDTA4FLRecipe(schema=schema, sites=["site-1", "site-2", "site-3"], data_root="/data/fed")
    recipe.execute(SimEnv(clients=recipe.sites))      # or recipe.export(job_dir) for `nvflare job submit`

The ``treeflare`` command runs them through :func:`treeflare.flare.runner.run_job`, which adds POC and provisioned
systems with result collection and progress lines.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from nvflare.apis.job_def import ALL_SITES
from nvflare.job_config.api import FedJob
from nvflare.recipe.spec import Recipe

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # .../treeflare
# Clients poll for tasks every 2 s by default; our workflows exchange a handful of short tasks.
TASK_REQUEST_INTERVAL = 0.2


def staged_package() -> Path:
    """A clean copy of the package (no caches, no build metadata) in a folder of its own.

    ``job.to(folder)`` copies the folder's *contents* into the app's custom/, so the folder holds
    ``treeflare/`` and lands as ``custom/treeflare/``.
    """
    stage = Path(tempfile.mkdtemp(prefix="treeflare-custom-"))
    shutil.copytree(PACKAGE_DIR, stage / "treeflare",
                    # the embedded datasets stay here (the sites read their own folders), and so does the operator's
                    # binding template: `nvflare job submit` parses every .json file of a job folder as a config
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "datasets", "*.example.json"))
    atexit.register(shutil.rmtree, stage, True)
    return stage


def ship_package(job: FedJob, client_targets=(ALL_SITES,)) -> None:
    """Put the whole package into the server and client apps' custom/ folders."""
    job.set_app_packages(["treeflare"])  # no shallow auto-copy of single modules
    stage = str(staged_package())
    job.to(stage, "server")
    for target in client_targets:
        job.to(stage, target)
    job.to({"server": {"task_request_interval": TASK_REQUEST_INTERVAL}}, "server")


def site_path(path) -> str:
    """A folder given to the sites: "" stays "" (the sites' own bindings), a relative path is made absolute here
    (a site's process runs in its own workspace, where a path relative to the submitter means nothing)."""
    if not path:
        return ""
    return str(Path(path).resolve()) if not Path(path).is_absolute() else str(path)


class TreeflareRecipe(Recipe):
    """A FedJob of this package as a Recipe: the package shipped with it, its sites named.

    ``client_targets``: the client apps the package goes into: every site (NVFlare's ``@ALL``) for a job with
    one app for all sites, or the site names for a job with one app per site (a FedJob holding both exports only
    the all-sites one).
    """

    def __init__(self, job: FedJob, sites, client_targets=(ALL_SITES,)):
        self.sites = list(sites)
        self.client_targets = list(client_targets)
        self.fed_job = job  # NVFlare keeps its own reference private; ours is for components added after this
        super().__init__(job)
        self.shipped = False

    def add_to_server(self, component, id: str) -> None:
        """A server component (a workflow or a widget) added after the recipe was built, e.g. a progress reporter."""
        self.fed_job.to_server(component, id=id)

    def finalize(self):
        # the package last, once, so that everything added to the job before running it is in the apps
        if not self.shipped:
            ship_package(self.fed_job, self.client_targets)
            self.shipped = True
