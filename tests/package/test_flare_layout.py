"""The FLARE glue's layout: one folder per job under ``treeflare/flare/`` whose controller (server) and executor
(sites) share only the job's ``protocol.py``, never each other; and exported jobs name those modules, which their
own ``custom/`` code holds (the ICDTA4FL export is checked in test_job_icdta4fl.py)."""

from __future__ import annotations



import ast
import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from flare_helpers import REPO, job_module

FLARE = REPO / "custom" / "treeflare" / "flare"
JOBS = ("icdta4fl", "xgb", "vertical", "discovery", "psi")
SIDES = ("controller", "executor")


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, anywhere in it (function-level imports too), as absolute dotted names; for
    ``from X import name`` both X and X.name, since the name may be a submodule."""
    package = ".".join(path.relative_to(REPO / "custom").with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


@pytest.mark.parametrize("job", JOBS)
def test_controller_and_executor_share_only_the_protocol(job):
    folder = FLARE / job
    assert all((folder / f"{m}.py").is_file() for m in (*SIDES, "protocol")), sorted(p.name for p in folder.glob("*"))
    name = f"treeflare.flare.{job}"
    for side, other in (SIDES, SIDES[::-1]):
        imports = imported_modules(folder / f"{side}.py")
        assert f"{name}.protocol" in imports, f"{job}/{side}.py does not import its protocol"
        assert f"{name}.{other}" not in imports, f"{job}/{side}.py imports {job}/{other}.py"
    protocol = imported_modules(folder / "protocol.py")
    assert not {f"{name}.{s}" for s in SIDES} & protocol, f"{job}/protocol.py imports a side"
    assert not any(m.split(".")[0] == "nvflare" for m in protocol), f"{job}/protocol.py imports NVFlare"


def test_no_controller_imports_an_executor_anywhere_in_the_glue():
    """Across jobs too: a server-side module never imports a site-side one, nor the reverse."""
    modules = {".".join(p.relative_to(REPO / "custom").with_suffix("").parts): p for p in FLARE.rglob("*.py")}
    roles = {m: m.rsplit(".", 1)[-1] for m in modules if m.rsplit(".", 1)[-1] in SIDES}
    assert len(roles) >= 2 * len(JOBS), sorted(roles)
    for module, role in roles.items():
        crossed = {m for m in imported_modules(modules[module]) if roles.get(m, role) != role}
        assert not crossed, f"{module} imports {sorted(crossed)}"


EXPORTS = {
    "xgb_histogram": (["--dataset", "car", "--sites", "2", "--binding", "vertical"],
                      {"treeflare.flare.xgb.controller.XGBDirectController",
                       "treeflare.flare.xgb.executor.XGBDirectExecutor",
                       "treeflare.flare.xgb.data_loader.TreeflareXGBDataLoader",
                       "treeflare.flare.xgb.progress.XGBRoundProgress"}),
    "vertical_tree": (["--dataset", "car", "--passive", "1", "--binding", "vertical"],
                      {"treeflare.flare.vertical.controller.VerticalController",
                       "treeflare.flare.vertical.executor.VerticalExecutor",
                       "treeflare.flare.progress.ProgressReporter",
                       # the PSI phase the vertical job starts with (issue 22)
                       "treeflare.flare.psi.controller.PsiCheckController",
                       "treeflare.flare.psi.ecdh_controller.EcdhPsiController",
                       "treeflare.flare.psi.controller.PsiResultController",
                       "treeflare.flare.psi.executor.SiteIds", "treeflare.flare.psi.ecdh_executor.EcdhPsiExecutor"}),
}


def test_exported_jobs_name_the_job_folders_and_carry_them(tmp_path, monkeypatch):
    """Exported with today's layout, each job's configurations name the job folder's modules (and hand the sites
    the job's --binding), and every class they name imports from the app's own custom/ alone (the editable install hidden), as on a site without treeflare.
    The XGBoost export, run as a user runs it, shows no warning and prints the submit/wait/download commands
    with --startup-kit."""
    monkeypatch.chdir(tmp_path)
    checks = []
    for job, (argv, expected) in EXPORTS.items():
        out = tmp_path / f"export_{job}"
        argv = [*argv, "--workspace", str(tmp_path / f"ws_{job}"), "--export", str(out)]
        if job == "xgb_histogram":  # as a user runs it: NVFlare's first import of nvflare.recipe reads sys.argv
            res = subprocess.run([sys.executable, "-W", "always", str(REPO / "jobs" / job / "job.py"), *argv],
                                 capture_output=True, text=True, cwd=tmp_path, timeout=300)
            assert res.returncode == 0, res.stderr[-3000:]
            assert "Warning" not in res.stderr, res.stderr[-3000:]  # NVFlare's reserved --export UserWarning
            kit = "--startup-kit ADMIN_KIT"  # nvflare job wait/download fail without it (STARTUP_KIT_MISSING)
            assert [line.strip() for line in res.stdout.splitlines() if line.strip().startswith("nvflare job")] == [
                f"nvflare job submit -j {out / job} {kit}", f"nvflare job wait <job_id> --timeout 3600 {kit}",
                f"nvflare job download <job_id> -o results {kit}   # results/<job_id>/workspace/"]
        else:
            with pytest.raises(SystemExit) as done:
                job_module(job).main(argv)
            assert done.value.code == 0
        for app in sorted((out / job).glob("app*")):
            paths = set()
            for cfg in app.glob("config/config_fed_*.json"):
                paths.update(p for p in _paths(json.loads(cfg.read_text())) if p.startswith("treeflare."))
            for cfg in app.glob("config/config_fed_client.json"):  # --binding reaches the sites' readers
                assert '"binding": "vertical"' in cfg.read_text(), (job, cfg)
            checks.append((str(app / "custom"), sorted(paths)))
        named = set().union(*(set(p) for c, p in checks if f"export_{job}" in c))
        assert named == expected, (job, sorted(named))
    # -S: no site-packages .pth processing, so the editable install of treeflare is invisible
    code = ("import importlib, json, sys\n"
            f"sys.path.append({sysconfig.get_paths()['purelib']!r})\n"
            f"for custom, paths in json.loads({json.dumps(checks)!r}):\n"
            "    sys.path.insert(0, custom)\n"
            "    for p in paths:\n"
            "        module, cls = p.rsplit('.', 1)\n"
            "        m = importlib.import_module(module)\n"
            "        assert m.__file__.startswith(custom), m.__file__\n"
            "        getattr(m, cls)\n"
            "    sys.path.remove(custom)\n"
            "    for name in [n for n in sys.modules if n.split('.')[0] == 'treeflare']:\n"
            "        del sys.modules[name]\n"
            "print('ok')\n")
    res = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-3000:]


def _paths(node):
    if isinstance(node, dict):
        if isinstance(node.get("path"), str):
            yield node["path"]
        for v in node.values():
            yield from _paths(v)
    elif isinstance(node, list):
        for v in node:
            yield from _paths(v)
