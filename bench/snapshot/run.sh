#!/usr/bin/env bash
# gvisor snapshot benchmark: Sandcell's checkpoint (pause to disk), restore (resume), fork of
# 1 and of 4 children and create-from-snapshot, against the same operations with `runsc`
# driven directly, interleaved run by run (p50/p90/p99 over N runs, the 1-minute load average
# sampled before each run). Writes bench/snapshot/results.json and prints it.
# Needs root, runsc and the installed minimal image.  Usage: bench/snapshot/run.sh [--runs N]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
data=${SANDCELL_DATA_DIR:-/var/lib/sandcell}
runs=10
case "${1:-}" in
  --runs) runs=$2 ;;
  "") ;;
  *) runs=$1 ;;
esac
cd "$root"
nice cargo build -q --release -p sandcell-runtime --example bench_gvisor_snapshot
out=bench/snapshot/results.json
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
target/release/examples/bench_gvisor_snapshot --image "$data/images/minimal" --runs "$runs" > "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
