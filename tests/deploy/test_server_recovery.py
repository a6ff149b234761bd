"""treeflare.flare.server_recovery: jobs a server restart interrupted are ended through NVFlare's own job manager
(a real SimpleJobDefManager on a FilesystemStorage in a temporary folder; no FLARE system started)."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from nvflare.apis.fl_context import FLContext
from nvflare.apis.fl_constant import ReservedKey
from nvflare.apis.impl.job_def_manager import SimpleJobDefManager
from nvflare.apis.job_def import RunStatus
from nvflare.apis.server_engine_spec import ServerEngineSpec
from nvflare.apis.workspace import Workspace
from nvflare.app_common.storages.filesystem_storage import FilesystemStorage

from treeflare.flare import server_recovery as sr
from treeflare.flare.xgb.controller import RESULT_FILE as XGB_RESULT

XGB_PATH = "treeflare.flare.xgb.controller.XGBDirectController"


class _Engine(ServerEngineSpec):
    """The one engine call the job manager makes: its job store."""

    def __init__(self, store):
        self.store = store

    def get_component(self, name):
        return self.store if name == "job_store" else None


_Engine.__abstractmethods__ = frozenset()  # the rest of the engine is not used here


def _system(tmp_path):
    store = FilesystemStorage(root_dir=str(tmp_path / "store"), uri_root="/")
    manager = SimpleJobDefManager(uri_root="/jobs", job_store_id="job_store")
    ctx = FLContext()
    ctx.set_prop(ReservedKey.ENGINE, _Engine(store), private=True, sticky=False)
    kit = tmp_path / "kit"
    (kit / "startup").mkdir(parents=True)
    (kit / "local").mkdir()
    return manager, Workspace(str(kit), "server"), ctx


def _job(manager, ctx, workspace, status, workflows, result=None):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("job/meta.json", "{}")
    job_id = manager.create({"name": "j"}, buf.getvalue(), ctx)["job_id"]
    manager.set_status(job_id, status, ctx)
    run_dir = workspace.get_run_dir(job_id)
    config = f"{run_dir}/app_server/config"
    import os

    os.makedirs(config)
    with open(f"{config}/config_fed_server.json", "w") as f:
        json.dump({"workflows": [{"id": f"w{i}", "path": p, "args": {}} for i, p in enumerate(workflows)]}, f)
    with open(f"{run_dir}/progress.json", "w") as f:  # something the job wrote before the restart
        f.write('{"round": 17}')
    if result is not None:
        with open(f"{run_dir}/{XGB_RESULT}", "w") as f:
            json.dump(result, f)
    return job_id


def _archived(manager, ctx, job_id) -> dict:
    data = manager.get_storage_component(job_id, "workspace", ctx)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist()}


def test_interrupted_job_ends_failed_with_reason_and_keeps_what_it_wrote(tmp_path):
    manager, ws, ctx = _system(tmp_path)
    interrupted = _job(manager, ctx, ws, RunStatus.RUNNING,
                       ["treeflare.flare.psi.controller.PsiCheckController", XGB_PATH])
    done = _job(manager, ctx, ws, RunStatus.FINISHED_COMPLETED, [XGB_PATH])
    still_running = _job(manager, ctx, ws, RunStatus.RUNNING, [XGB_PATH])
    foreign = _job(manager, ctx, ws, RunStatus.DISPATCHED, ["nvflare.app_common.workflows.fedavg.FedAvg"])

    ended = sr.end_interrupted_jobs(manager, ws, ctx, running={still_running}, alive=lambda j: False)

    assert sorted(ended) == sorted([interrupted, foreign])
    assert manager.get_job(interrupted, ctx).meta["status"] == RunStatus.FINISHED_ABNORMAL.value
    assert manager.get_job(interrupted, ctx).meta[sr.META_REASON_KEY] == sr.REASON
    assert manager.get_job(foreign, ctx).meta["status"] == RunStatus.FINISHED_ABNORMAL.value
    assert manager.get_job(done, ctx).meta["status"] == RunStatus.FINISHED_COMPLETED.value
    assert manager.get_job(still_running, ctx).meta["status"] == RunStatus.RUNNING.value
    files = _archived(manager, ctx, interrupted)  # what `nvflare job download` hands the admin
    result = json.loads(files[XGB_RESULT])
    assert result["status"] == "failed" and "server restarted" in result["error"] and result["job"]
    assert json.loads(files["progress.json"]) == {"round": 17}
    assert XGB_RESULT not in _archived(manager, ctx, foreign)  # no treeflare workflow: no treeflare result
    assert sr.end_interrupted_jobs(manager, ws, ctx, alive=lambda j: False) == [still_running]


def test_a_final_result_already_written_is_kept_and_a_live_job_process_is_left_alone(tmp_path):
    manager, ws, ctx = _system(tmp_path)
    finished = _job(manager, ctx, ws, RunStatus.RUNNING, [XGB_PATH], result={"status": "completed", "rounds": 3})
    alive = _job(manager, ctx, ws, RunStatus.RUNNING, [XGB_PATH])
    assert sr.end_interrupted_jobs(manager, ws, ctx, alive=lambda j: j == alive) == [finished]
    assert json.loads(_archived(manager, ctx, finished)[XGB_RESULT]) == {"status": "completed", "rounds": 3}
    assert manager.get_job(alive, ctx).meta["status"] == RunStatus.RUNNING.value


def test_only_treeflare_classes_are_looked_up(tmp_path):
    cfg = tmp_path / "app_server" / "config"
    cfg.mkdir(parents=True)
    (cfg / "config_fed_server.json").write_text(json.dumps({"workflows": [{"path": "os.system"}, {"path": XGB_PATH}]}))
    assert sr.result_file_of(tmp_path) == ("xgb_histogram", XGB_RESULT)
    (cfg / "config_fed_server.json").write_text(json.dumps({"workflows": [{"path": "os.system"}]}))
    assert sr.result_file_of(tmp_path) is None


def test_add_to_server_kit_is_idempotent_and_refuses_a_site_kit(tmp_path):
    local = tmp_path / "server" / "local"
    local.mkdir(parents=True)
    (local / "resources.json.default").write_text(json.dumps({"servers": [{}], "components": [{"id": "job_manager"}]}))
    sr.add_to_server_kit(tmp_path / "server")
    sr.add_to_server_kit(tmp_path / "server")
    comps = json.loads((local / "resources.json").read_text())["components"]
    assert [c["id"] for c in comps] == ["job_manager", sr.COMPONENT_ID]
    assert comps[1]["path"] == sr.COMPONENT_PATH
    site = tmp_path / "site" / "local"
    site.mkdir(parents=True)
    (site / "resources.json.default").write_text(json.dumps({"components": []}))
    with pytest.raises(ValueError, match="not a server kit"):
        sr.add_to_server_kit(tmp_path / "site")
    from treeflare.flare import deploy

    assert deploy.main(["server-recovery", str(tmp_path / "site")]) == 2
    assert not (site / "resources.json").exists()
    assert deploy.main(["server-recovery", str(tmp_path / "server")]) == 0


def test_only_a_server_job_process_of_the_job_counts_as_alive():
    import subprocess
    import sys

    job = "0b5e7c1e-job-under-test"
    site_like = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-m",
                                  "nvflare.private.fed.app.client.worker_process", "-n", job])
    try:
        assert not sr._job_process_alive(job)  # a site's job process (same host in the lab) is not the server's
        server_like = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "-m",
                                        sr.SERVER_JOB_MODULE.decode(), "-n", job])
        try:
            import time

            deadline = time.monotonic() + 5
            while not sr._job_process_alive(job) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert sr._job_process_alive(job)
            assert not sr._job_process_alive("another-job")
        finally:
            server_like.kill()
            server_like.wait()
    finally:
        site_like.kill()
        site_like.wait()
