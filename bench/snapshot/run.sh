#!/usr/bin/env bash
# gvisor snapshot benchmark: Sandcell's pause_to_disk / restore-to-agent-ready against
# `runsc checkpoint` / `runsc restore` driven directly (p50/p90 over N runs). Writes
# bench/snapshot/results.json and prints it.
# Needs root, runsc and the installed minimal image.  Usage: bench/snapshot/run.sh [--runs N]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
data=${SANDCELL_DATA_DIR:-/var/lib/sandcell}
runs=20
case "${1:-}" in
  --runs) runs=$2 ;;
  "") ;;
  *) runs=$1 ;;
esac
cd "$root"
nice cargo build -q --release -p sandcell-runtime --example bench_gvisor_snapshot
out=bench/snapshot/results.json
target/release/examples/bench_gvisor_snapshot --image "$data/images/minimal" --runs "$runs" > "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
