#!/usr/bin/env bash
# Volumes across daemons, through an S3 outage and through a `kill -9` of the daemon
# (tests/e2b/volumes_nodes.py): two `sandcell serve` on one bucket, each with its own empty
# data dir; a SeaweedFS stopped and started again under a writing sandbox; a daemon (and
# then its volume's JuiceFS) killed under a sandbox's fsync loop. SeaweedFS listens on its
# fixed ports (S3 :8333), so this runs when no other suite's SeaweedFS does
# (tests/e2b/run.sh calls it at its end).
#
# Needs what tests/e2b/run.sh needs (root, runsc, the installed images, /dev/fuse).
# PY_SDK: the e2b version [default: run.sh's]; VOL_NODES_FILES, VOL_NODES_MIB: the small
# files and MiB of random bytes daemon A writes [10000, 1024: the issue's sizes]; arguments: the parts to run
# (two_daemons, outage, kill9) [all three].
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/tests/e2b"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sandcell/e2b-test"
PY_SDK=${PY_SDK:-$(sed -n 's/^PY_SDK=\([0-9.]*\)$/\1/p' "$HERE/run.sh")}

say() { echo "==> $*" >&2; }
die() { echo "tests/e2b/volumes_nodes: $*" >&2; exit 1; }

# shellcheck source=tests/lib/daemon.sh
. "$ROOT/tests/lib/daemon.sh"
# shellcheck source=tests/lib/volumes.sh
. "$ROOT/tests/lib/volumes.sh"
sc_require_gvisor
sc_volume_tools
sc_e2b_venv "$CACHE/venv" "$PY_SDK"
sc_bin
sc_tmp sc-e2b-volnodes
sc_e2b_templates
# Two data dirs with the same templates: A's and B's.
mv "$DATA" "$TMP/data-a"
mkdir -p "$TMP/data-b"
cp -a "$TMP/data-a/images" "$TMP/data-b/images"
if [ -e "$TMP/data-a/kernels" ]; then cp -a "$TMP/data-a/kernels" "$TMP/data-b/kernels"; fi
sc_s3_start
echo "$S3_PID" >"$TMP/s3.pid"
# The SeaweedFS the test restarts has another pid: stopped by its pid file.
sc_s3_stop_restarted() {
    local pid
    pid=$(cat "$TMP/s3.pid" 2>/dev/null) || return 0
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
}
# After the unmount (a daemon killed by a failed test leaves JuiceFS mounts behind).
SC_CLEANUP_HOOKS=(sc_volumes_unmount sc_s3_stop_restarted "${SC_CLEANUP_HOOKS[@]}")

S3_SERVE_ARGS=$(sc_s3_serve_args)
export TMP SANDCELL_TEMPLATE S3_SERVE_ARGS S3_ACCESS_KEY S3_SECRET_KEY
status=0
"$CACHE/venv/bin/python" "$HERE/volumes_nodes.py" "$@" || status=1
if [ "$status" != 0 ]; then
    for d in a b; do
        echo "---- daemon $d stderr (last 30 lines) ----" >&2
        tail -n 30 "$TMP/serve-$d.err" 2>/dev/null >&2 || true
    done
fi
exit "$status"
