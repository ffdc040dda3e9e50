#!/usr/bin/env bash
# JuiceFS against s3backer, on the host, over the same local SeaweedFS (issue 18's measured
# comparison; bench/volume/compare.py does the measuring, see its docstring for the
# workloads). JuiceFS is formatted and mounted with the options the daemon uses
# (crates/server/src/volumes/juicefs.rs); s3backer's block file carries ext4 on a loop
# device (on the host, for the benchmark only: the product never loop-mounts an image a
# guest can write). No sandbox, no daemon. The mounts are made in a private mount namespace.
#
# Needs root, /dev/fuse, fio, s3backer (apt install fio s3backer), mkfs.ext4 and losetup;
# SeaweedFS and JuiceFS come from tests/lib/volumes.sh's venv. Listens on 127.0.0.1:8333,
# so it does not run next to a volumes test.
# Writes bench/volume/compare-results.json (or --out FILE) and prints it.
#
#   bench/volume/compare.sh [--runs N] [--out FILE] [--mib N] [--files N]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
out="$ROOT/bench/volume/compare-results.json"
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out=$2; shift 2 ;;
        --runs | --mib | --files) args+=("$1" "$2"); shift 2 ;;
        *) echo "usage: $0 [--runs N] [--out FILE] [--mib N] [--files N]" >&2; exit 2 ;;
    esac
done
say() { echo "==> $*" >&2; }
die() { echo "bench/volume/compare: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (FUSE mounts, a loop device)"
for t in fio s3backer mkfs.ext4 losetup; do
    command -v "$t" >/dev/null || die "$t is needed on PATH (apt install fio s3backer e2fsprogs mount)"
done
# shellcheck source=tests/lib/volumes.sh
. "$ROOT/tests/lib/volumes.sh"
sc_volume_tools

TMP=$(mktemp -d /tmp/sc-bench-s3backer.XXXXXX)
SC_CLEANUP_HOOKS=()
cleanup() {
    local m dev
    # compare.py unmounts what it mounted, in its own mount namespace; should anything
    # be left in this one: ext4, its loop device, the FUSE mounts.
    for m in $(awk -v t="$TMP/" '$5 ~ "^"t { print $5 }' /proc/self/mountinfo | sort -r); do
        dev=$(awk -v m="$m" '$5 == m { print $10 }' /proc/self/mountinfo)
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
        case "$dev" in /dev/loop*) losetup -d "$dev" 2>/dev/null || true ;; esac
    done
    for dev in $(losetup -j "$TMP/s3b/fuse/file" -O NAME -n 2>/dev/null); do losetup -d "$dev" || true; done
    for m in $(awk -v t="$TMP/" '$5 ~ "^"t { print $5 }' /proc/self/mountinfo); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    local hook
    for hook in "${SC_CLEANUP_HOOKS[@]}"; do "$hook" || true; done
    if grep -q " $TMP/" /proc/mounts; then
        echo "bench/volume/compare: still mounted under $TMP; not removed" >&2
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT
sc_s3_start
export TMP S3_ENDPOINT S3_ACCESS_KEY S3_SECRET_KEY JUICEFS WEED
# In a mount namespace of its own with private propagation: a namespace another process
# makes meanwhile (a sandbox starting) would otherwise get copies of these mounts and keep
# the ext4 (and so the loop device and s3backer's file) busy after the unmount.
if ! unshare --mount --propagation private python3 "$ROOT/bench/volume/compare.py" "${args[@]}" >"$out.tmp"; then
    rm -f "$out.tmp"
    logs=$(mktemp -d /tmp/sc-bench-s3backer-logs.XXXXXX)
    cp "$TMP/s3.log" "$TMP/jfs/mount.log" "$logs/" 2>/dev/null || true
    die "failed; SeaweedFS's and JuiceFS's logs: $logs"
fi
mv "$out.tmp" "$out"
cat "$out"
