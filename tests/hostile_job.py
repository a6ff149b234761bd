"""jobs/icdta4fl/job.py with site-3 replaced by a hostile site (tests/hostile_site), everything else unchanged.

    python tests/hostile_job.py [--hostile-mode MODE[@SITE] ...] <job.py arguments>

MODE is one of HostileExecutor's modes (nan_threshold, wrong_type, huge_code, many_categories, forged_counts,
sleep); SITE defaults to site-3; the option may be given once per hostile site.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
HOSTILE_DIR = HERE / "hostile_site"
HOSTILE_SITE = "site-3"
sys.path.insert(0, str(HOSTILE_DIR))


def main(argv: list[str]) -> int:
    modes = {}
    while "--hostile-mode" in argv:
        i = argv.index("--hostile-mode")
        mode, _, site = argv[i + 1].partition("@")
        modes[site or HOSTILE_SITE] = mode
        argv = argv[:i] + argv[i + 2:]
    modes = modes or {HOSTILE_SITE: "nan_threshold"}
    spec = importlib.util.spec_from_file_location("icdta4fl_job", HERE.parent / "jobs" / "icdta4fl" / "job.py")
    job_mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job_mod)

    from nvflare.job_config.api import FedJob
    from treeflare.flare import runner
    from treeflare.flare.icdta4fl.executor import ICDTA4FLExecutor
    from treeflare_hostile.executor import HostileExecutor

    original_build = job_mod.build_job

    def build_job(args, fed_summary, data_root, sites):
        def to_clients(self, executor, tasks=None, **kw):  # one app per site instead of one for @ALL
            for site in sites:
                ex = (HostileExecutor(data_root=executor.data_root, mode=modes[site]) if site in modes
                      else ICDTA4FLExecutor(data_root=executor.data_root))
                self.to(ex, site, tasks=tasks)

        def ship_package(job, client_targets=None):
            original_ship(job, client_targets=sites)
            for site in modes:
                job.to(str(HOSTILE_DIR), site)

        original_to_clients, original_ship = FedJob.to_clients, runner.ship_package
        FedJob.to_clients, runner.ship_package = to_clients, ship_package
        try:
            return original_build(args, fed_summary, data_root, sites)
        finally:
            FedJob.to_clients, runner.ship_package = original_to_clients, original_ship

    job_mod.build_job = build_job
    return job_mod.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
