#!/usr/bin/env bash
# A local NVFlare POC system for treeflare jobs.
#
#   scripts/poc.sh up K                 prepare and start a POC: server (localhost:8002, or $TREEFLARE_POC_PORT)
#                                       and sites site-1..site-K
#   scripts/poc.sh run JOB [ARGS...]    run jobs/JOB/job.py on it (--env poc); outputs in --workspace
#                                       (default: $TREEFLARE_POC_ROOT/runs/JOB), the same files as a simulator run,
#                                       plus flare/poc_result/{<job_id>/workspace, site-N/<job_id>} (server result, site logs)
#   scripts/poc.sh submit JOB_DIR [OUT] submit an exported job folder (job.py --export DIR), wait, download into OUT
#   scripts/poc.sh status               what is running
#   scripts/poc.sh down                 stop everything the POC started
#
# The POC keeps its own HOME and workspace under $TREEFLARE_POC_ROOT (default /tmp/treeflare-poc-$UID), so your
# ~/.nvflare is never touched. Only one POC per port (8002 unless TREEFLARE_POC_PORT is set; `up` refuses a busy
# port). Python: $PYTHON, else .venv/bin/python.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
ROOT="${TREEFLARE_POC_ROOT:-/tmp/treeflare-poc-$(id -u)}"
export TREEFLARE_POC_ROOT="$ROOT" MPLBACKEND="${MPLBACKEND:-Agg}"
deploy() { "$PY" -m treeflare.flare.deploy "$@"; }

usage() { awk 'NR>1 && /^#/{sub(/^# ?/,"");print;next} NR>1{exit}' "$0"; exit "${1:-2}"; }

cmd="${1:-}"; [ $# -gt 0 ] && shift
case "$cmd" in
  up)
    [ $# -eq 1 ] && [[ "$1" =~ ^[1-9][0-9]*$ ]] || { echo "usage: scripts/poc.sh up K (number of sites)" >&2; exit 2; }
    deploy poc-up --root "$ROOT" "$1"
    ;;
  run)
    [ $# -ge 1 ] || { echo "usage: scripts/poc.sh run JOB [job args...]; jobs: $(ls "$REPO/jobs" | tr '\n' ' ')" >&2; exit 2; }
    job="$1"; shift
    script="$REPO/jobs/$job/job.py"
    [ -f "$script" ] || { echo "error: no job '$job' (jobs: $(ls "$REPO/jobs" | tr '\n' ' '))" >&2; exit 2; }
    deploy poc-status --root "$ROOT" >/dev/null || { echo "error: no POC running in $ROOT; start one with: scripts/poc.sh up K" >&2; exit 2; }
    extra=()
    case " $* " in *" --workspace "*|*" --workspace="*) ;; *) extra+=(--workspace "$ROOT/runs/$job");; esac
    exec "$PY" "$script" "$@" "${extra[@]}" --env poc --poc-root "$ROOT"
    ;;
  submit)
    [ $# -ge 1 ] || { echo "usage: scripts/poc.sh submit JOB_DIR [OUT]" >&2; exit 2; }
    deploy submit --root "$ROOT" "$1" --out "${2:-$ROOT/results}"
    ;;
  status) deploy poc-status --root "$ROOT" ;;
  down) deploy poc-down --root "$ROOT" ;;
  -h|--help|help) usage 0 ;;
  *) usage 2 ;;
esac
