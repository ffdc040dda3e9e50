#!/usr/bin/env bash
# Create benchmark (gvisor, the installed `base` image, loopback, networks on): POST
# /sandboxes until 201 from the warm pool (`serve --warm N`) and without it (`--warm 0`),
# with env vars and egress rules, time to interactive with the stock E2B Python SDK (when
# tests/e2b/run.sh's venv exists), and `runsc run /bin/true` on the same image tree as the
# floor, interleaved run by run (bench/create/bench.py does the measuring). p50/p90/p99 over
# N runs (default 20), the runsc version and the load average.
# Needs root, runsc and the installed base image. Release build unless --debug.
# Writes bench/create/results.json (or --out FILE) and prints it.
# --suite burst: N creates from C concurrent SDK clients, pool and boot, beside as many
# concurrent `runsc run /bin/true` (burst.py, results-burst.json); --suite density: N idle
# sandboxes all answering a command, their memory per sandbox (density.py,
# results-density.json); --suite pause: pause and resume of pooled sandboxes with a network,
# beside `runsc checkpoint`/`restore` of a bare container (pause.py, results-pause.json).
#
#   bench/create/run.sh [--suite create|burst|density|pause] [--runs N] [--warm N] [--out FILE]
#                       [--debug] [--data-dir D] [--port P]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=20 warm=2 profile=release out= port=31103 suite=create
data=${SANDCELL_DATA_DIR:-/var/lib/sandcell}
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) suite=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --warm) warm=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --debug) profile=debug; shift ;;
    --data-dir) data=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    *) echo "usage: $0 [--suite create|burst|density|pause] [--runs N] [--warm N] [--out FILE] [--debug] [--data-dir D] [--port P]" >&2; exit 2 ;;
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
case "$suite" in
  create)
    out=${out:-bench/create/results.json}
    "$py" bench/create/bench.py --serve "$serve" --data-dir "$data" --runs "$runs" --warm "$warm" \
      --port "$port" --build "$profile" > "$out.tmp" ;;
  burst)
    # --runs: the creates (from 10 clients); --warm: the pool's size
    out=${out:-bench/create/results-burst.json}
    (cd bench/create && "$py" burst.py --serve "$(realpath "$serve")" --data-dir "$data" --creates "$runs" \
      --warm "$warm" --build "$profile") > "$out.tmp" ;;
  density)
    # --runs: the sandboxes kept running together
    out=${out:-bench/create/results-density.json}
    (cd bench/create && "$py" density.py --serve "$(realpath "$serve")" --data-dir "$data" \
      --sandboxes "$runs" --build "$profile") > "$out.tmp" ;;
  pause)
    # --runs: pause + resume rounds, each of a new sandbox from the pool
    out=${out:-bench/create/results-pause.json}
    (cd bench/create && "$py" pause.py --serve "$(realpath "$serve")" --data-dir "$data" \
      --runs "$runs" --warm "$warm" --build "$profile") > "$out.tmp" ;;
  *) die "unknown --suite $suite (create, burst, density, pause)" ;;
esac
mv "$out.tmp" "$out"
cat "$out"
