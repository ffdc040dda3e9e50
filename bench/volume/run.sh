#!/usr/bin/env bash
# Volume benchmark (gvisor, the stock E2B Python SDK): inside one sandbox, a volume (JuiceFS
# over a local SeaweedFS, tests/lib/volumes.sh) against the sandbox's own disk in the same
# run, interleaved run by run: sequential write (64 MiB, fsync) and read MiB/s, and a
# small-file workload (500 files of 4 KiB, then sync) in files/s. p50/p90/p99 over N runs
# (default 5). Warm only: the host's block cache is not emptied between runs (cold reads
# and 4 KiB random IOPS are not measured yet).
# Needs root, runsc, /dev/fuse and an installed minimal image (SANDCELL_DATA_DIR).
# Writes bench/volume/results.json (or --out FILE) and prints it.
#
#   bench/volume/run.sh [--runs N] [--out FILE]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
runs=5 out="$ROOT/bench/volume/results.json"
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "usage: $0 [--runs N] [--out FILE]" >&2; exit 2 ;;
    esac
done
say() { echo "==> $*" >&2; }
die() { echo "bench/volume: $*" >&2; exit 1; }
# shellcheck source=tests/lib/daemon.sh
. "$ROOT/tests/lib/daemon.sh"
# shellcheck source=tests/lib/volumes.sh
. "$ROOT/tests/lib/volumes.sh"
sc_require_gvisor
sc_volume_tools
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sandcell/e2b-test"
sc_e2b_venv "$CACHE/venv" 2.63.0
sc_bin
sc_tmp sc-bench-volume
FIXTURE="$DATA/images/minimal-bash"
mkdir -p "$FIXTURE"
cp -a "$INSTALLED/images/minimal/rootfs" "$FIXTURE/rootfs"
[ -e "$FIXTURE/rootfs/bin/bash" ] || { printf '#!/bin/sh\nexec /bin/sh "$@"\n' >"$FIXTURE/rootfs/bin/bash"; chmod 755 "$FIXTURE/rootfs/bin/bash"; }
sc_s3_start
# shellcheck disable=SC2046
sc_serve $(sc_s3_serve_args) --warm 0
export E2B_API_URL="$URL" E2B_SANDBOX_URL="$URL" E2B_VOLUME_API_URL="$URL"
E2B_API_KEY=$(cat "$DATA/admin.key"); export E2B_API_KEY
"$CACHE/venv/bin/python" "$ROOT/bench/volume/bench.py" --runs "$runs" --template minimal-bash >"$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
