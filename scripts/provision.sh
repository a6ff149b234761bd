#!/usr/bin/env bash
# Provision a treeflare project: startup kits for the server, each site and the admin.
#
#   scripts/provision.sh [-p configs/project.yml] [-w WORKSPACE] [--server HOST] [--port PORT] [--sites N]
#                        [--data-dir DIR] [--install-package]
#
#   -p FILE            project file (default configs/project.yml)
#   -w DIR             provisioning workspace (default ./provision); kits land in DIR/<project>/prod_NN/<participant>/
#   --server HOST      server host name (default: as in the project file)
#   --port PORT        server port (default: as in the project file)
#   --sites N          sites site-1..site-N (default: as in the project file)
#   --data-dir DIR     write each site's local/treeflare_site.json pointing at DIR/<site> (else a template
#                      local/treeflare_site.json.example is written for the site operator to fill in)
#   --install-package  add "treeflare." to each kit's class allow list (local/resources.json), for sites that
#                      pip-install treeflare instead of receiving it in the job (see docs/DEPLOY.md)
#
# Then give each participant its own folder (the kit) over a secure channel; on each host run <kit>/startup/start.sh.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
PROJECT="$REPO/configs/project.yml"; WS="provision"; SERVER=""; PORT=""; SITES=""; DATA=""; INSTALL=0
while [ $# -gt 0 ]; do
  case "$1" in
    -p) PROJECT="$2"; shift 2;;
    -w) WS="$2"; shift 2;;
    --server) SERVER="$2"; shift 2;;
    --port) PORT="$2"; shift 2;;
    --sites) SITES="$2"; shift 2;;
    --data-dir) DATA="$2"; shift 2;;
    --install-package) INSTALL=1; shift;;
    -h|--help) awk 'NR>1 && /^#/{sub(/^# ?/,"");print;next} NR>1{exit}' "$0"; exit 0;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2;;
  esac
done
[ -f "$PROJECT" ] || { echo "error: project file $PROJECT not found" >&2; exit 2; }
mkdir -p "$WS"; WS="$(cd "$WS" && pwd)"
exec "$PY" "$REPO/app/site_setup.py" provision --project "$PROJECT" --workspace "$WS" \
  ${SERVER:+--server "$SERVER"} ${PORT:+--port "$PORT"} ${SITES:+--sites "$SITES"} ${DATA:+--data-dir "$DATA"} \
  $([ "$INSTALL" = 1 ] && echo --install-package)
