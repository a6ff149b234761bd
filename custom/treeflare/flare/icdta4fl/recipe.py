"""ICDTA4FL as an NVFlare Recipe: the controller on the server, the executor on every site, the package shipped.

    recipe = ICDTA4FLRecipe(schema=schema.to_dict(), sites=["site-1", "site-2", "site-3"], data_root="/data/fed")
    recipe.execute(SimEnv(clients=recipe.sites))

Every argument is checked by the controller (``icdta4fl.server.ICDTA4FLServer``) before any task; ``treeflare
icdta4fl`` builds one from its options (:mod:`treeflare.jobs.icdta4fl`).
"""

from __future__ import annotations

from nvflare.apis.job_def import ALL_SITES
from nvflare.job_config.api import FedJob

from ...icdta4fl.payloads import MAX_SITE_ROWS
from ...icdta4fl.server import DEFAULT_MAX_ROWS_RATIO, DEFAULT_MIN_CLIENTS
from ..progress import PROGRESS_ID, ProgressReporter
from ..recipe import TreeflareRecipe, site_path
from .controller import ICDTA4FLController
from .executor import ICDTA4FLExecutor
from .protocol import TASKS

JOB_NAME = "icdta4fl"


class ICDTA4FLRecipe(TreeflareRecipe):
    """One ICDTA4FL job.

    Args:
        schema: the shared data schema (``Schema.to_dict()``).
        sites: the sites' names.
        algorithm, local_params, selection, aggregation, refine_params, max_rows_ratio, min_clients,
            task_timeout, server_test, job_info, max_site_rows: the controller's (``ICDTA4FLController``).
        data_root: the sites' data folder as the sites see it (``<data_root>/<site>/train.csv``); a site's own
            binding overrides it ("": the sites hold their data; a relative path is made absolute).
        binding: the name of the site binding the sites read ("": the default one).
    """

    def __init__(self, *, schema: dict, sites, algorithm: str = "cart", local_params: dict | None = None,
                 selection: dict | None = None, aggregation: dict | None = None, refine_params: dict | None = None,
                 max_rows_ratio: float = DEFAULT_MAX_ROWS_RATIO, min_clients: int | None = None,
                 task_timeout: int = 300, server_test: str = "", job_info: dict | None = None,
                 data_root: str = "", binding: str = "", max_site_rows: int = MAX_SITE_ROWS, name: str = JOB_NAME):
        controller_args = dict(schema=schema, algorithm=algorithm, local_params=local_params, selection=selection,
                               aggregation=aggregation, max_rows_ratio=max_rows_ratio, task_timeout=task_timeout,
                               server_test=server_test, job_info=job_info, refine_params=refine_params,
                               max_site_rows=max_site_rows)
        if min_clients is not None:  # None: every site must load its data (the controller's default)
            controller_args["min_clients"] = min_clients
        # NVFlare schedules the job once this many sites are connected, and runs it without a site that fails to
        # start: with min_clients None the protocol itself refuses to go on without a site whose data is missing
        job = FedJob(name=name, min_clients=min_clients or DEFAULT_MIN_CLIENTS)
        job.to_server(ICDTA4FLController(**controller_args), id="icdta4fl_controller")
        job.to_server(ProgressReporter(), id=PROGRESS_ID)  # phase lines the command prints while FLARE runs
        self.data_root, self.binding = site_path(data_root), binding
        super().__init__(job, sites, client_targets=self.add_site_apps(job, list(sites)))

    def add_site_apps(self, job: FedJob, sites: list[str]) -> list[str]:
        """The sites' executor, in one app for every site; returns the client apps' targets. A subclass may give
        each site an app of its own (tests/hostile_job.py gives some sites a hostile executor)."""
        job.to_clients(ICDTA4FLExecutor(data_root=self.data_root, binding=self.binding), tasks=TASKS)
        return [ALL_SITES]
