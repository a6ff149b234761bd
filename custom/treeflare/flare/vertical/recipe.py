"""Vertical trees with packed Paillier encryption as an NVFlare Recipe: PSI first (each party keeps the ids every
party holds), then the vertical controller driving the label holder (``active_site``) and the passive sites.

    recipe = VerticalTreeRecipe(sites=["site-1", "site-2", "site-3"], params=VerticalParams(...).to_dict(),
                                data_root="/data/vfl")
    recipe.execute(SimEnv(clients=recipe.sites))

``treeflare vertical`` builds one from its options (:mod:`treeflare.jobs.vertical_tree`).
"""

from __future__ import annotations

from nvflare.job_config.api import FedJob

from ..progress import PROGRESS_ID, ProgressReporter
from ..psi.job import DEFAULT_MIN_ROWS, add_psi
from ..recipe import TreeflareRecipe, site_path
from .controller import VerticalController
from .executor import VerticalExecutor
from .protocol import MSG, STEP

JOB_NAME = "vertical_tree"


class VerticalTreeRecipe(TreeflareRecipe):
    """One vertical training job. ``sites[0]`` holds the label (the active party); the others hold columns.

    Args:
        sites: the parties, the label holder first.
        params: ``VerticalParams(...).validate().to_dict()``.
        data_root: the parties' data folder as they see it ("": each party's own binding).
        schema: the shared schema (``Schema.to_dict()``), or None where the parties hold their own.
        binding: the name of the site binding the parties read ("": the default one).
        workers: where a party's crypto runs (see ``VerticalExecutor``).
        min_key_bits, min_node_rows: the floors every party enforces on what the label holder asks.
        psi_min_rows: fewest shared ids the job goes on with.
        psi: the PSI phase's method and ratio bound (``add_psi``'s ``method``, ``max_ratio``).
    """

    def __init__(self, *, sites, params: dict, data_root: str = "", schema: dict | None = None, binding: str = "",
                 workers: int | str = 0, min_key_bits: int = 2048, min_node_rows: int = 10,
                 psi_min_rows: int = DEFAULT_MIN_ROWS, task_timeout: int = 600, job_info: dict | None = None,
                 name: str = JOB_NAME, psi: dict | None = None):
        sites, data_root = list(sites), site_path(data_root)
        job = FedJob(name=name, min_clients=len(sites))
        # the PSI phase first (server workflows run in the order added): each party keeps the ids all hold
        add_psi(job, sites, kinds=("train", "test"), data_root=data_root, schema=schema, binding=binding,
                min_rows=psi_min_rows, task_timeout=task_timeout, workers=workers, **(psi or {}))
        job.to_server(VerticalController(active_site=sites[0], passive_sites=sites[1:], params=params,
                                         task_timeout=task_timeout, job_info=job_info or {}),
                      id="vertical_controller")
        job.to_server(ProgressReporter(), id=PROGRESS_ID)  # tree and layer lines printed while FLARE runs
        job.to_clients(VerticalExecutor(data_root=data_root, workers=workers, min_key_bits=min_key_bits,
                                        min_node_rows=min_node_rows, schema=schema, binding=binding),
                       tasks=[STEP, MSG])
        super().__init__(job, sites)
