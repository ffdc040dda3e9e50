#!/usr/bin/env bash
# Desktop benchmark: the stock e2b-desktop SDK beside the Computer API, against a
# real `sandcell serve` (gvisor, loopback, the installed images, the daemon as tests/e2b runs
# it): create to first screenshot, screenshots and clicks both ways, a base create as the
# floor (bench/desktop/bench.py). p50/p90/p99 over N runs (default 3).
# Needs root, runsc and the installed base and desktop images
# ($SANDCELL_DATA_DIR, default /var/lib/sandcell). Writes bench/desktop/results.json
# (or --out FILE) and prints it.
#
#   bench/desktop/run.sh [--runs N] [--out FILE]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
runs=3 out=$ROOT/bench/desktop/results.json
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--out FILE]" >&2; exit 2 ;;
  esac
done
say() { echo "==> $*" >&2; }
die() { echo "bench/desktop: $*" >&2; exit 1; }
# shellcheck source=tests/lib/daemon.sh
. "$ROOT/tests/lib/daemon.sh"
sc_require_gvisor
[ -d "$INSTALLED/images/desktop" ] || die "desktop is not installed in $INSTALLED (make images install)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sandcell/e2b-test"
sc_e2b_venv "$CACHE/venv" 2.63.0
sc_bin
sc_tmp sc-bench-desk
sc_e2b_templates
sc_serve
export E2B_API_URL="$URL" E2B_SANDBOX_URL="$URL"
E2B_API_KEY=$(cat "$DATA/admin.key")
export E2B_API_KEY
say "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$CACHE/venv/bin/python" "$ROOT/bench/desktop/bench.py" --runs "$runs" > "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
