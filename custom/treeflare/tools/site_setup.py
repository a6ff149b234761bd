#!/usr/bin/env python
"""Operator tooling for provisioned treeflare sites (standard library + PyYAML, which NVFlare installs).

    treeflare provision --project configs/project.yml --workspace WS [--server H] [--port P]
                                       [--sites N] [--data-dir DIR] [--install-package]
    treeflare site bind KIT --data-dir DIR [--name NAME] [--replace] [--label-column C] [--id-column C]
                                  [--train F] [--test F] [--min-category-rows K] [--categorical-allowed C ...]
                                  [--predict F] [--vertical-model PATH] [--refine-peers SITE ...] [--allow-missing]
    treeflare site allow-package KIT [--prefix treeflare.]

``bind`` writes ``KIT/local/treeflare_site.json``: where this site's CSV files are and what its label/id
columns are called (read by the site's executors; the job cannot override it). ``--name NAME`` writes a named
binding, ``KIT/local/treeflare_site.NAME.json``, read only by jobs run with ``--binding NAME`` (a site in both a
horizontal and a vertical job keeps one of each). A binding that exists with other contents is kept unless
``--replace`` is given. A ``--data-dir`` that does not exist or does not hold the site's files (train.csv and
test.csv, or the ``--train``/``--test`` names; a prediction binding's ``--predict`` file) is refused, naming the
folder and the file, unless ``--allow-missing`` says the data will arrive later.
``allow-package`` writes ``KIT/local/resources.json`` = the kit's ``resources.json.default`` with ``treeflare.``
added to ``class_allow_list``: needed only when sites pip-install treeflare and jobs are submitted without their
``app/custom/`` folder (non-BYOC).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

try:
    from treeflare.cli import Parser
except ImportError:  # run by path on a site's host without treeflare (app/site_setup.py): argparse's own parser
    Parser = argparse.ArgumentParser

HERE = Path(__file__).resolve().parent
SITE_FILE = "treeflare_site.json"
PACKAGE_PREFIX = "treeflare."
# the same rule as treeflare.flare.site_config.check_binding_name (this script runs without treeflare installed)
BINDING_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


def binding_file(name: str = "") -> str:
    """The file in a kit's local/ folder of the binding ``name`` ("" is the default binding)."""
    if name and not BINDING_NAME.fullmatch(name):
        raise SystemExit(f"error: --name {name!r}: a binding name is a letter followed by up to 63 letters, "
                         "digits, '_' or '-'")
    return f"treeflare_site.{name}.json" if name else SITE_FILE


def _write_json_atomic(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


class BindError(ValueError):
    """A binding refused (``error: ...`` and exit 2 from the command line)."""


def check_data_dir(data_dir, train=None, test=None, predict=None, base: Path | None = None) -> None:
    """Refuse (BindError: ``error: ...``, exit 2) a data folder that does not exist or lacks a file the binding
    names: its training and test files (``train``/``test``, default train.csv and test.csv), or for a prediction
    binding (``predict`` given, neither ``train`` nor ``test``) its file of new rows. A relative folder is looked
    up in ``base`` (the kit's local/ folder), as the site reads it."""
    folder = Path(data_dir).expanduser()
    relative = "" if folder.is_absolute() or base is None else \
        f" (a relative --data-dir is read from the kit's local/ folder: {Path(base) / folder})"
    folder = folder if folder.is_absolute() or base is None else Path(base) / folder
    later = "; pass --allow-missing if the data will arrive there later"
    if not folder.is_dir():
        what = "is a file, not a folder" if folder.exists() else "does not exist"
        raise BindError(f"--data-dir {data_dir}: the folder {what}{relative}; give the folder holding this site's "
                        f"{train or 'train.csv'} and {test or 'test.csv'}{later}")
    predicts = bool(predict and not (train or test))
    names = [predict] if predicts else [train or "train.csv", test or "test.csv"]
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        held = sorted(p.name for p in folder.glob("*.csv"))[:10]
        found = f" (its CSV files: {', '.join(held)})" if held else " (it holds no CSV file)"
        raise BindError(f"--data-dir {data_dir}: no {' and no '.join(missing)} in this folder{found}; name this "
                        f"site's {'file' if predicts else 'files'} with {'--predict' if predicts else '--train/--test'}"
                        f"{later}")


def bind(kit: Path, data_dir: str, label_column=None, id_column=None, train=None, test=None,
         min_category_rows=None, predict=None, vertical_model=None, categorical_allowed=None, name: str = "",
         replace: bool = False, refine_peers=None, require_data: bool = False) -> Path:
    """Write the kit's binding (see the module doc). ``require_data``: refuse a data folder that does not exist or
    lacks the binding's files (:func:`check_data_dir`); ``site bind`` asks for it unless ``--allow-missing``
    (``provision --data-dir`` writes bindings before the data reaches the sites' hosts)."""
    out_name = binding_file(name)
    local = Path(kit) / "local"
    if not local.is_dir():
        raise SystemExit(f"error: {kit} is not a startup kit (no local/ folder)")
    binding = {"data_dir": str(data_dir)}
    for key, value in (("train", train), ("test", test), ("label_column", label_column), ("id_column", id_column),
                       ("predict", predict), ("vertical_model", vertical_model)):
        if value:
            binding[key] = value
    if min_category_rows is not None:
        if min_category_rows < 1:
            raise SystemExit("error: --min-category-rows must be >= 1")
        binding["min_category_rows"] = int(min_category_rows)
    if categorical_allowed:
        columns = [c.strip() for c in categorical_allowed]
        if not all(columns):
            raise SystemExit("error: --categorical-allowed: an empty column name")
        binding["categorical_allowed"] = columns
    if refine_peers:
        peers = [c.strip() for c in refine_peers]
        if not all(peers):
            raise SystemExit("error: --refine-peers: an empty site name")
        binding["refine_peers"] = peers
    out = local / out_name
    if out.exists() and not replace:
        try:
            same = json.loads(out.read_text()) == binding
        except (OSError, ValueError):
            same = False
        if not same:
            what = f"binding {name!r}" if name else "the default binding"
            raise SystemExit(f"error: {out} already holds {what} with other contents; keep it and write another "
                             "with --name NAME (a job reads it with --binding NAME), or overwrite it with --replace")
    if require_data:
        check_data_dir(data_dir, train, test, predict, base=local)
    _write_json_atomic(out, binding)
    return out


def allow_package(kit: Path, prefix: str = PACKAGE_PREFIX) -> Path:
    if not prefix.endswith("."):
        raise SystemExit("error: a package prefix must end with '.' (e.g. treeflare.)")
    local = Path(kit) / "local"
    current = local / "resources.json"
    source = current if current.is_file() else local / "resources.json.default"
    if not source.is_file():
        raise SystemExit(f"error: {local} has neither resources.json nor resources.json.default")
    resources = json.loads(source.read_text())
    allow = resources.setdefault("class_allow_list", [])
    if prefix not in allow:
        allow.append(prefix)
    _write_json_atomic(current, resources)
    return current


def provision(project: Path, workspace: Path, server=None, port=None, sites=None, data_dir=None,
              install_package=False) -> Path:
    import yaml

    cfg = yaml.safe_load(Path(project).read_text())
    parts = cfg["participants"]
    srv = next(p for p in parts if p.get("type") == "server")
    if server:
        srv["name"] = server
    if port:
        srv["fed_learn_port"] = int(port)
    if sites:
        orgs = [p for p in parts if p.get("type") != "client"]
        clients = [{"name": f"site-{i + 1}", "type": "client", "org": f"org{i + 1}"} for i in range(int(sites))]
        cfg["participants"] = [orgs[0], *clients, *orgs[1:]]
    workspace = Path(workspace).resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    project_file = workspace / "project.yml"
    project_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
    nvflare = [sys.executable, "-m", "nvflare.cli"]
    proc = subprocess.run([*nvflare, "provision", "-p", str(project_file), "-w", str(workspace), "--force"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise SystemExit(f"error: nvflare provision failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    prod = sorted((workspace / cfg["name"]).glob("prod_*"))[-1]
    for p in cfg["participants"]:
        kit = prod / p["name"]
        if p.get("type") == "client":
            if data_dir:
                bind(kit, str(Path(data_dir).resolve() / p["name"]), replace=True)
            else:
                shutil.copyfile(HERE / "treeflare_site.example.json", kit / "local" / (SITE_FILE + ".example"))
        if install_package and p.get("type") in ("client", "server"):
            allow_package(kit)
    srv = next(p for p in cfg["participants"] if p.get("type") == "server")
    admin = next(p["name"] for p in cfg["participants"] if p.get("type") == "admin")
    print(f"startup kits in {prod}")
    print(f"  server {srv['name']}:{srv.get('fed_learn_port', 8002)} -> {prod / srv['name']}")
    for p in cfg["participants"]:
        if p.get("type") == "client":
            print(f"  site {p['name']} -> {prod / p['name']}")
    print(f"  admin {admin} -> {prod / admin}")
    print("  start the server with NVFLARE_CLIENT_OUTCOME_WAIT_TIMEOUT=60 in its environment, or a job that lost "
          "a site shows RUNNING for 15 minutes after it ended (NVFlare's default wait)")
    print("next: copy each kit to its host; run <kit>/startup/start.sh there (server first); then submit jobs "
          f"with: nvflare job submit -j <job folder> --startup-kit {prod / admin}   (see docs/DEPLOY.md)")
    return prod


def build_parser() -> Parser:
    p = Parser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("provision", help="provision a project: startup kits for the server, each site and the admin")
    source_project = Path(__file__).resolve().parents[3] / "configs" / "project.yml"  # in a source tree
    pr.add_argument("--project", "-p", type=Path, required=not source_project.is_file(),
                    default=source_project if source_project.is_file() else None,
                    help="NVFlare project file" + (f" (default: {source_project})" if source_project.is_file() else ""))
    pr.add_argument("--workspace", "-w", type=Path, default=Path("provision"),
                    help="provisioning workspace; kits land in WS/<project>/prod_NN/<participant>/ "
                         "(default: ./provision)")
    pr.add_argument("--server", help="server host name (default: as in the project file)")
    pr.add_argument("--port", type=int, help="server port (default: as in the project file)")
    pr.add_argument("--sites", type=int, help="sites site-1..site-N (default: as in the project file)")
    pr.add_argument("--data-dir", help="write each site's local/treeflare_site.json pointing at DIR/<site> (else a "
                                       "template for the site's operator to fill in)")
    pr.add_argument("--install-package", action="store_true",
                    help="allow treeflare.* in each kit's class allow list, for sites that pip-install treeflare "
                         "instead of receiving it in the job (docs/DEPLOY.md)")
    b = sub.add_parser("bind", help="write a site's local/treeflare_site.json (or a named binding)")
    b.add_argument("kit", type=Path)
    b.add_argument("--data-dir", required=True, help="folder with this site's train.csv/test.csv (or the --train/"
                                                     "--test files; the --predict file for a prediction binding); "
                                                     "refused if it does not hold them, unless --allow-missing")
    b.add_argument("--allow-missing", action="store_true",
                   help="write the binding although --data-dir or its files do not exist yet (the data will arrive "
                        "there later; a job fails at that site, naming the file, until it does)")
    b.add_argument("--name", default="", help="write the named binding local/treeflare_site.NAME.json, read by "
                                              "jobs run with --binding NAME (default: the default binding)")
    b.add_argument("--replace", action="store_true", help="overwrite a binding that exists with other contents")
    b.add_argument("--label-column", help="the label's column in this site's files, if named otherwise than the "
                                            "job's schema says")
    b.add_argument("--id-column", help="vertical jobs: this site's column of customer ids, if named otherwise")
    b.add_argument("--train", help="the training file's name in --data-dir (default train.csv)")
    b.add_argument("--test", help="the validation file's name in --data-dir (default test.csv)")
    b.add_argument("--min-category-rows", type=int,
                   help="schema discovery: report a category value only if this many of the site's rows hold it "
                        "(a floor: a job asking for more gets more)")
    b.add_argument("--refine-peers", nargs="+", metavar="SITE",
                   help="ICDTA4FL refinement: the federation's sites as you know them; this site masks its counts only "
                        "in a sum over sites of this list (the server cannot rewrite it)")
    b.add_argument("--categorical-allowed", nargs="+", metavar="COLUMN",
                   help="schema discovery: columns this site reads as numbers that a job may declare categorical "
                        "or ordinal (a job declaring any other numeric column so is refused)")
    b.add_argument("--predict", help="vertical prediction runs: this site's file of new rows in --data-dir "
                                     "(default predict.csv)")
    b.add_argument("--vertical-model", help="vertical prediction runs: this site's part of the model, the "
                                            "vertical_*_model.json its training run wrote (default: that name in "
                                            "--data-dir)")
    a = sub.add_parser("allow-package", help="allow the installed treeflare package in a kit's class allow list")
    a.add_argument("kit", type=Path)
    a.add_argument("--prefix", default=PACKAGE_PREFIX, help="the class-name prefix to allow")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "provision":
        provision(args.project, args.workspace, args.server, args.port, args.sites, args.data_dir,
                  args.install_package)
    elif args.cmd == "bind":
        try:
            print(bind(args.kit, args.data_dir, args.label_column, args.id_column, args.train, args.test,
                       args.min_category_rows, args.predict, args.vertical_model, args.categorical_allowed,
                       args.name, args.replace, args.refine_peers, require_data=not args.allow_missing))
        except BindError as exc:  # a refused data folder
            print(f"error: {exc}", file=sys.stderr)
            return 2
    else:
        print(allow_package(args.kit, args.prefix))
    return 0


if __name__ == "__main__":
    sys.exit(main())
