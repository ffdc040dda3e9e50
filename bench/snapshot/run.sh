#!/usr/bin/env bash
# gvisor snapshot benchmark: Sandcell's checkpoint (pause to disk), restore (resume), fork of
# 1 and of 4 children and create-from-snapshot, against the same operations with `runsc`
# driven directly, interleaved run by run (p50/p90/p99 over N runs, the 1-minute load average
# sampled before each run). Writes bench/snapshot/results.json and prints it.
# Needs root, runsc and the installed minimal image.  Usage: bench/snapshot/run.sh [--runs N]
# SANDCELL_BENCH_PROFILE=dev builds and runs the debug build (no release build needed).
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
profile=${SANDCELL_BENCH_PROFILE:-release}
nice cargo build -q --profile "$profile" -p sandcell-runtime --example bench_gvisor_snapshot
bin=${CARGO_TARGET_DIR:-target}/$([ "$profile" = dev ] && echo debug || echo "$profile")/examples/bench_gvisor_snapshot
out=bench/snapshot/results.json
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# Twice: as the daemon runs (a child subreaper reaping runsc's orphans, runtime/src/subreaper.rs)
# and without (the orphans wait for the host's init), to show what the subreaper saves.
for mode in on off; do
  "$bin" --image "$data/images/minimal" --runs "$runs" \
    --subreaper "$mode" > "$out.$mode"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
on, off = (json.load(open(f"{out}.{m}")) for m in ("on", "off"))
on["without_subreaper"] = {"load1": off["load1"], "results": off["results"]}
json.dump(on, open(out + ".tmp", "w"), indent=2)
PY
rm -f "$out.on" "$out.off"
mv "$out.tmp" "$out"
cat "$out"
