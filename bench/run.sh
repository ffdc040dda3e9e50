#!/usr/bin/env bash
# Runs every benchmark and gathers their JSON into bench/results/latest.json.
#   bench/run.sh [--runs N]          (default 20 runs per measurement)
# Each suite writes its own results.json next to its script; this script only runs them in
# turn and merges the results, so one failing suite is reported without hiding the others.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
runs=20
[ "${1:-}" = "--runs" ] && runs=$2
mkdir -p bench/results
status=0
suites=()
for suite in vmm gvisor api snapshot image template; do
  echo "==> bench/$suite" >&2
  if bench/$suite/run.sh --runs "$runs" >/dev/null; then
    suites+=("$suite")
  else
    echo "bench/$suite failed" >&2
    status=1
  fi
done
python3 - "${suites[@]}" <<'PY' > bench/results/latest.json
import json, sys, datetime
out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
for s in sys.argv[1:]:
    with open(f"bench/{s}/results.json") as f:
        out[s] = json.load(f)
    if s == "vmm":
        with open("bench/vmm/snapshot-results.json") as f:
            out["vmm_snapshot"] = json.load(f)
print(json.dumps(out, indent=2))
PY
echo "bench/results/latest.json written" >&2
exit $status
