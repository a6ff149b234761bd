"""`treeflare icdta4fl` (treeflare.jobs.icdta4fl) with site-3 replaced by a hostile site (tests/hostile_site), everything else unchanged.

    python tests/hostile_job.py [--hostile-mode MODE[@SITE] ...] <treeflare icdta4fl arguments>

MODE is one of HostileExecutor's modes (nan_threshold, wrong_type, huge_code, many_categories, forged_counts,
sleep); SITE defaults to site-3; the option may be given once per hostile site.
"""

from __future__ import annotations

import importlib
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
    job_mod = importlib.import_module("treeflare.jobs.icdta4fl")

    from treeflare.flare.icdta4fl.executor import ICDTA4FLExecutor
    from treeflare.flare.icdta4fl.protocol import TASKS
    from treeflare.flare.icdta4fl.recipe import ICDTA4FLRecipe
    from treeflare_hostile.executor import HostileExecutor

    class HostileRecipe(ICDTA4FLRecipe):
        def add_site_apps(self, job, sites):  # one app per site, hostile where --hostile-mode says
            for site in sites:
                ex = (HostileExecutor(data_root=self.data_root, mode=modes[site]) if site in modes
                      else ICDTA4FLExecutor(data_root=self.data_root))
                job.to(ex, site, tasks=TASKS)
                if site in modes:
                    job.to(str(HOSTILE_DIR), site)  # the hostile executor's package, in that site's custom/
            return sites

    original_build = job_mod.build_job

    def build_job(args, fed_summary, data_root, sites):
        import treeflare.flare.icdta4fl.recipe as recipe_mod

        saved = recipe_mod.ICDTA4FLRecipe
        recipe_mod.ICDTA4FLRecipe = HostileRecipe
        try:
            return original_build(args, fed_summary, data_root, sites)
        finally:
            recipe_mod.ICDTA4FLRecipe = saved

    job_mod.build_job = build_job
    return job_mod.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
