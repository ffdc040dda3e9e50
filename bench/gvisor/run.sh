#!/usr/bin/env bash
# gvisor runtime vs runsc driven directly: p50/p90 over N runs (default 20) of
#  - agent_ready: create + start of the minimal image until the agent answers /health
#  - run_true:    `sandcell run --runtime gvisor -- true` end to end vs `runsc run` of /bin/true
#  - run_true_in_agent_sandbox: the same sandcell runs vs runsc doing the same job by itself
#                 (`runsc run` of the agent bundle, `runsc exec /bin/true`, `runsc kill`)
# Same bundle, same runsc flags, interleaved. Needs root, runsc and the installed minimal
# image (`make images install`). Writes bench/gvisor/results.json and prints the ratios.
#
#   bench/gvisor/run.sh [--runs N] [--data-dir D]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=20
data=${SANDCELL_DATA_DIR:-/var/lib/sandcell}
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --data-dir) data=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--data-dir D]" >&2; exit 2 ;;
  esac
done
cd "$root"
cargo build --release -q -p sandcell-cli
cargo build --release -q -p sandcell-runtime --example bench_gvisor
out=bench/gvisor/results.json
target/release/examples/bench_gvisor --sandcell target/release/sandcell --image "$data/images/minimal" --runs "$runs" > "$out.tmp"
mv "$out.tmp" "$out"
python3 - "$out" <<'PY' || cat "$out"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"runsc {r['runsc']['version']} ({r['runsc']['platform']}), {r['runs']} runs; goal: {r['goal']}")
for k in ("agent_ready", "run_true", "run_true_in_agent_sandbox"):
    s = r[k]
    print(f"{k:26} sandcell p50 {s['sandcell_ms']['p50']:7.1f} ms p90 {s['sandcell_ms']['p90']:7.1f} ms | "
          f"runsc p50 {s['runsc_direct_ms']['p50']:7.1f} ms p90 {s['runsc_direct_ms']['p90']:7.1f} ms | "
          f"ratio p50 {s['ratio_p50']:.3f} (+{s['overhead_p50_ms']:.1f} ms) goal met: {s['goal_met']}")
PY
