#!/usr/bin/env bash
# Create benchmark (gvisor, the installed `base` image, loopback, networks on): POST
# /sandboxes until 201 from the warm pool (`serve --warm N`) and without it (`--warm 0`),
# with env vars and egress rules, time to interactive with the stock E2B Python SDK (when
# tests/e2b/run.sh's venv exists), and `runsc run /bin/true` on the same image tree as the
# floor, interleaved run by run (bench/create/bench.py does the measuring). p50/p90/p99 over
# N runs (default 20), the runsc version and the load average.
# Needs root, runsc and the installed base image. Release build unless --debug.
# Writes bench/create/results.json (or --out FILE) and prints it.
#
#   bench/create/run.sh [--runs N] [--warm N] [--out FILE] [--debug] [--data-dir D] [--port P]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=20 warm=2 profile=release out=bench/create/results.json port=31103
data=${SANDCELL_DATA_DIR:-/var/lib/sandcell}
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --warm) warm=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --debug) profile=debug; shift ;;
    --data-dir) data=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--warm N] [--out FILE] [--debug] [--data-dir D] [--port P]" >&2; exit 2 ;;
  esac
done
die() { echo "bench/create: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (the gvisor runtime)"
command -v runsc >/dev/null || die "runsc is needed on PATH"
[ -x "$data/images/base/rootfs/sbin/sandcell-agent" ] || die "the installed base image is needed in $data/images"
cd "$root"
flag=--release; [ "$profile" = debug ] && flag=
nice cargo build $flag -q -p sandcell-server --bin sandcell-serve
serve=${CARGO_TARGET_DIR:-target}/$profile/sandcell-serve
py=python3
venv=${XDG_CACHE_HOME:-$HOME/.cache}/sandcell/e2b-test/venv
[ -x "$venv/bin/python" ] && py=$venv/bin/python
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$py" bench/create/bench.py --serve "$serve" --data-dir "$data" --runs "$runs" --warm "$warm" \
  --port "$port" --build "$profile" > "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
