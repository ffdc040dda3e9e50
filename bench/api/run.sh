#!/usr/bin/env bash
# The daemon as a client sees it (gvisor runtime, minimal image, loopback):
#  - time_to_interactive: POST /v2/sandboxes + the first `echo` through the envd proxy,
#    p50/p90 over N sequential runs (default 20)
#  - creates_per_second: 8 concurrent clients creating 3 sandboxes each
# Starts its own sandcell-serve on an ephemeral port with a temporary data dir. For the
# runsc-direct floor (runsc run of the same bundle until the agent answers) it copies
# agent_ready from bench/gvisor/results.json when that exists (bench/gvisor/run.sh).
# Needs root, runsc and the installed minimal image (`make images install`).
# Writes bench/api/results.json.
#
#   bench/api/run.sh [--runs N] [--clients N] [--per-client N] [--data-dir D]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=20 clients=8 per_client=3
data=${SANDCELL_DATA_DIR:-/var/lib/sandcell}
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --per-client) per_client=$2; shift 2 ;;
    --data-dir) data=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--clients N] [--per-client N] [--data-dir D]" >&2; exit 2 ;;
  esac
done
cd "$root"
cargo build --release -q -p sandcell-server --bin sandcell-serve --example bench_api
out=bench/api/results.json
target/release/examples/bench_api --serve target/release/sandcell-serve \
  --image "$data/images/minimal" --runs "$runs" --clients "$clients" --per-client "$per_client" > "$out.tmp"
python3 - "$out.tmp" bench/gvisor/results.json <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
g = sys.argv[2]
if os.path.exists(g):
    a = json.load(open(g)).get("agent_ready", {})
    if "runsc_direct_ms" in a:
        r["runsc_direct_agent_ready_ms"] = dict(a["runsc_direct_ms"], source="bench/gvisor/results.json (agent_ready, runsc run until the agent answers /health)")
json.dump(r, open(sys.argv[1], "w"), indent=2)
t, c = r["time_to_interactive_ms"], r["creates_per_second"]
print(f"time to interactive ({t['runs']} runs): p50 {t['p50']:.1f} ms, p90 {t['p90']:.1f} ms")
print(f"creates: {c['creates']} by {c['clients']} clients in {c['wall_s']:.2f} s = {c['per_second']:.1f}/s")
d = r.get("runsc_direct_agent_ready_ms")
if d: print(f"runsc direct, agent ready: p50 {d['p50']:.1f} ms, p90 {d['p90']:.1f} ms")
PY
mv "$out.tmp" "$out"
cat "$out"
