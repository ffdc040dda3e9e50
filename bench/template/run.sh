#!/usr/bin/env bash
# Template benchmark (gvisor runtime, the installed `base` image, loopback, no networks):
#  - `sandcell template build` of a five-step Dockerfile (COPY of 4 MiB in 8 files, RUN,
#    ENV, WORKDIR, RUN): cold (a new data dir each run, so no cached layer) and fully cached;
#  - the same steps through the daemon's E2B template API (upload, POST /v3/templates,
#    POST /v2/templates/{t}/builds/{b}, status until ready): forced and cached, and one
#    build with a startCmd/readyCmd;
#  - create latency through `sandcell serve` (POST /sandboxes until 201) from the installed
#    `base`, from each built template and from a named snapshot (the restore path).
# p50/p90/p99 over N runs (default 10; builds at most 10 of each kind: tens of seconds each;
# bench/template/bench.py does the measuring), with the commit,
# runsc version and load average at start and end. Release build unless --debug.
# Needs root, runsc and the installed minimal and base images (`make images install`).
# Writes bench/template/results.json (or --out FILE) and prints it.
#
#   bench/template/run.sh [--runs N] [--out FILE] [--debug] [--data-dir D]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=10 profile=release out=bench/template/results.json
data=${SANDCELL_DATA_DIR:-/var/lib/sandcell}
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --debug) profile=debug; shift ;;
    --data-dir) data=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--out FILE] [--debug] [--data-dir D]" >&2; exit 2 ;;
  esac
done
die() { echo "bench/template: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (the gvisor runtime)"
command -v runsc >/dev/null || die "runsc is needed on PATH (.ci/install-deps installs it)"
for image in minimal base; do
  [ -x "$data/images/$image/rootfs/sbin/sandcell-agent" ] ||
    die "the installed $image image is needed in $data/images (make images install)"
done
cd "$root"
flag=--release; [ "$profile" = debug ] && flag=
nice cargo build $flag -q -p sandcell-cli --bin sandcell
commit=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- crates || commit="$commit+dirty"

tmp=$(mktemp -d /tmp/sc-bench-template.XXXXXX)
cleanup() {
  # Never remove a tree that still has a sandbox's mount in it.
  if grep -q " $tmp/" /proc/mounts; then
    echo "bench/template: mounts left under $tmp; not removing it" >&2
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT
case "$out" in /*) ;; *) out=$root/$out ;; esac
# The installed images as they are now, hard links where the file system allows (else a
# copy): a `make install` during the run replaces their files, and a build exporting from
# a tree whose files vanish fails.
mkdir -p "$tmp/installed/images"
for image in minimal base; do
  cp -al "$data/images/$image" "$tmp/installed/images/$image" 2>/dev/null ||
    cp -a "$data/images/$image" "$tmp/installed/images/$image"
done
[ ! -d "$data/kernels" ] || ln -s "$data/kernels" "$tmp/installed/kernels"
python3 bench/template/bench.py --sandcell "$root/target/$profile/sandcell" --installed "$tmp/installed" \
  --tmp "$tmp" --runs "$runs" --profile "$profile" --commit "$commit" > "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
