"""ICDTA4FL's controller and site executors wired together in one process: every task and reply goes through
NVFlare's own serializer (FOBS), and every message is recorded, so protocol tests need no simulator."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from nvflare.apis.shareable import Shareable
from nvflare.app_common.decomposers import common_decomposers
from nvflare.fuel.utils import fobs

from treeflare.flare.icdta4fl.controller import ICDTA4FLController
from treeflare.flare.icdta4fl.executor import ICDTA4FLExecutor

common_decomposers.register()


def wire(shareable: Shareable) -> Shareable:
    """What arrives at the other end."""
    return fobs.loads(fobs.dumps(shareable))


class InProcessRun:
    """Run ``controller`` against one ``ICDTA4FLExecutor`` per site reading ``data_root/<site>/``."""

    def __init__(self, data_root: Path, sites: list[str], executors: dict | None = None, kits: dict | None = None):
        """``kits``: site -> its startup kit folder (client.key, client.crt, rootCA.pem); without one a site runs as
        in the simulator."""
        self.sites = list(sites)
        self.executors = {s: (executors or {}).get(s) or ICDTA4FLExecutor(data_root=str(data_root)) for s in sites}
        self.kits = dict(kits or {})
        self.messages = []  # (direction, site, task name, Shareable as received)

    def site_context(self, site):
        engine = None
        if site in self.kits:
            workspace = SimpleNamespace(get_startup_kit_dir=lambda: str(self.kits[site]))
            engine = SimpleNamespace(get_workspace=lambda: workspace)
        return SimpleNamespace(get_identity_name=lambda: site, get_engine=lambda: engine, get_job_id=lambda: "job",
                               get_prop=lambda key, default=None: default)

    def _broadcast(self, task, fl_ctx, targets=None, min_responses=0, abort_signal=None, **kw):
        task.client_tasks = []
        for site in targets:
            data = wire(task.data)
            self.messages.append(("to_site", site, task.name, data))
            ctx = self.site_context(site)
            reply = wire(self.executors[site].execute(task.name, data, ctx, None))
            self.messages.append(("to_server", site, task.name, reply))
            task.client_tasks.append(SimpleNamespace(client=SimpleNamespace(name=site), result=reply))
        task.completion_status = "ok"  # as NVFlare's monitor, once every target answered

    def run(self, controller: ICDTA4FLController, run_dir: Path) -> dict:
        controller.broadcast = self._broadcast  # the controllers wait themselves (workflow.collect)
        controller.logged = []
        for level in ("log_info", "log_warning", "log_error"):
            setattr(controller, level, lambda fl_ctx, msg, *a, _l=level, **k: controller.logged.append((_l, msg)))
        controller.system_panic = lambda reason, fl_ctx: controller.logged.append(("panic", reason))
        for executor in self.executors.values():
            for level in ("log_info", "log_warning", "log_error"):
                setattr(executor, level, lambda *a, **k: None)
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        engine = SimpleNamespace(
            get_clients=lambda: [SimpleNamespace(name=s) for s in self.sites],
            get_workspace=lambda: SimpleNamespace(get_run_dir=lambda job_id: str(run_dir)))
        controller.control_flow(None, SimpleNamespace(get_engine=lambda: engine, get_job_id=lambda: "job"))
        return json.loads((run_dir / controller.RESULT_FILE).read_text())
