"""The command line for real FLARE systems: ``python -m treeflare.flare.deploy poc-up|poc-down|poc-status|submit``
(what treeflare poc runs), and ``server-recovery KIT`` (adds :mod:`.server_recovery`'s component, which ends the jobs
a server restart interrupted, to a provisioned server kit). The work is done by :mod:`.poc` (a local POC system)
and :mod:`.admin` (admin sessions, job submission and result collection)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .admin import DeployError, connected_sites, local_site_dirs, submit_and_collect
from .poc import LocalPoc, flare_lock


def main(argv=None) -> int:
    """``python -m treeflare.flare.deploy poc-up|poc-down|poc-status|submit ...`` (used by scripts/poc.sh)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m treeflare.flare.deploy", description=main.__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("poc-up", help="prepare and start a POC with K sites")
    up.add_argument("--root", type=Path, required=True)
    up.add_argument("sites", type=int)
    for name in ("poc-down", "poc-status"):
        sub.add_parser(name).add_argument("--root", type=Path, required=True)
    s = sub.add_parser("submit", help="submit an exported job folder, wait, download the result")
    s.add_argument("job_dir", type=Path)
    s.add_argument("--startup-kit", type=Path, help="admin kit (default: the POC's, with --root)")
    s.add_argument("--root", type=Path)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--timeout", type=float, default=3600.0)
    r = sub.add_parser("server-recovery", help="add the component that ends, at server start, the jobs a server "
                                               "restart interrupted to a server kit's local/resources.json")
    r.add_argument("kit", type=Path)
    args = p.parse_args(argv)
    try:
        if args.cmd == "poc-up":
            poc = LocalPoc(args.root)
            if poc.running():
                raise DeployError(f"a POC is already running in {poc.root} with sites {poc.sites}; "
                                  "run `treeflare poc down` first")
            sites = [f"site-{i + 1}" for i in range(args.sites)]
            t = time.perf_counter()
            with flare_lock():
                poc.prepare(sites)
                poc.start()
            print(f"POC up in {time.perf_counter() - t:.1f} s: server localhost:{poc.port}, sites {', '.join(sites)}\n"
                  f"  workspace {poc.workspace}\n  admin kit {poc.admin_kit}")
        elif args.cmd == "poc-down":
            poc = LocalPoc(args.root)
            was = poc.running()
            t = time.perf_counter()
            poc.stop()
            print(f"POC stopped in {time.perf_counter() - t:.1f} s" if was else "no POC was running")
        elif args.cmd == "poc-status":
            poc = LocalPoc(args.root)
            if not poc.running():
                print(f"no POC running in {poc.root}")
                return 1
            print(f"POC running in {poc.root}: sites {poc.sites}; connected: "
                  f"{connected_sites(poc.admin_kit)}\n  admin kit {poc.admin_kit}")
        elif args.cmd == "server-recovery":
            from .server_recovery import add_to_server_kit

            try:
                path = add_to_server_kit(args.kit)
            except (OSError, ValueError) as exc:
                raise DeployError(str(exc)) from None
            print(f"{path}: jobs a server restart interrupted end FINISHED:ABNORMAL with a failed result at the "
                  "next start (needs treeflare installed where the server runs)")
        elif args.cmd == "submit":
            if args.startup_kit:
                kit, sites = args.startup_kit, local_site_dirs(args.startup_kit)
            elif args.root:
                poc = LocalPoc(args.root)
                kit, sites = poc.admin_kit, poc.site_dirs()
            else:
                raise DeployError("submit needs --startup-kit or --root")
            outcome = submit_and_collect(kit, args.job_dir, args.out, timeout=args.timeout, site_dirs=sites)
            print(f"job {outcome.job_id}: {outcome.status}\n  server result: {outcome.server_dir}")
            for site, d in outcome.site_dirs.items():
                print(f"  {site}: {d}")
            return 0 if outcome.ok else 1
    except DeployError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
