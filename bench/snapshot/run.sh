#!/usr/bin/env bash
# gvisor snapshot benchmark: Sandcell's pause_to_disk / restore-to-agent-ready against
# `runsc checkpoint` / `runsc restore` driven directly (p50/p90 over N runs, JSON on stdout).
# Needs root, runsc and the installed minimal image.  Usage: bench/snapshot/run.sh [RUNS]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
data=${SANDCELL_DATA_DIR:-/var/lib/sandcell}
cd "$root"
nice cargo build -q --release -p sandcell-runtime --example bench_snapshot
exec target/release/examples/bench_snapshot --image "$data/images/minimal" --runs "${1:-20}"
