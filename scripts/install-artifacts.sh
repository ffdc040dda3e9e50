#!/usr/bin/env bash
# Installs the built guest kernel and the minimal image into a Sandcell data directory:
#
#   <D>/kernels/<hash>/vmlinux          (hash = the kernel's build-cache key)
#   <D>/kernels/default -> <hash>
#   <D>/images/minimal/rootfs.ext4      (read-only base image)
#   <D>/images/minimal/rootfs/          (the unpacked tree, used by the gvisor runtime)
#
#   scripts/install-artifacts.sh [--data-dir D] [--kernel VMLINUX] [--image-dir DIR]
#
# D defaults to $SANDCELL_DATA_DIR or /var/lib/sandcell. Without --kernel/--image-dir the
# artifacts come from scripts/build-kernel.sh and scripts/build-image.sh minimal, which
# return their cached results in a second (and build them when nothing is cached).
#
# Every file appears under its final name by rename, so a reader sees the old or the new
# version, never a partial one. Big files are hard-linked from the cache when it is on the
# same filesystem (copied otherwise); the tree is always copied, so nothing a sandbox might
# do to it reaches the cache. Running it again with the same artifacts changes nothing.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
data=${SANDCELL_DATA_DIR:-/var/lib/sandcell}
kernel=
image_dir=

usage() { echo "usage: $0 [--data-dir D] [--kernel VMLINUX] [--image-dir DIR]" >&2; exit 2; }
log() { echo "install-artifacts: $*" >&2; }
die() { echo "install-artifacts: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --data-dir) [ $# -ge 2 ] || usage; data=$2; shift 2 ;;
    --kernel) [ $# -ge 2 ] || usage; kernel=$2; shift 2 ;;
    --image-dir) [ $# -ge 2 ] || usage; image_dir=$2; shift 2 ;;
    *) usage ;;
  esac
done

[ -n "$kernel" ] || kernel=$("$root/scripts/build-kernel.sh" | tail -n 1)
[ -n "$image_dir" ] || image_dir=$("$root/scripts/build-image.sh" minimal | tail -n 1)
[ -f "$kernel" ] || die "kernel $kernel not found"
[ -f "$image_dir/rootfs.ext4" ] && [ -d "$image_dir/rootfs" ] \
  || die "$image_dir does not hold rootfs.ext4 and rootfs/ (an output of build-image.sh)"

# The identity of each artifact: its cache directory's name (the hash of its inputs), or,
# for a file from elsewhere, the hash of its content.
identity() {
  local dir; dir=$(basename "$(dirname "$1")")
  case "$dir" in *[!0-9a-f]*|'') sha256sum "$1" | cut -c1-16 ;; *) echo "$dir" ;; esac
}
kernel_id=$(identity "$kernel")
image_id=$(identity "$image_dir/rootfs.ext4")

# link_or_copy SRC DST: DST appears atomically with SRC's content.
link_or_copy() {
  local tmp; tmp="$2.tmp.$$"
  rm -f "$tmp"
  ln "$1" "$tmp" 2>/dev/null || cp --sparse=always "$1" "$tmp"
  mv -f "$tmp" "$2"
}

mkdir -p "$data/kernels" "$data/images"

# --- kernel ---
kdir=$data/kernels/$kernel_id
if [ -f "$kdir/vmlinux" ] && cmp -s "$kernel" "$kdir/vmlinux"; then
  log "kernel $kernel_id: already installed"
else
  mkdir -p "$kdir"
  link_or_copy "$kernel" "$kdir/vmlinux"
  log "kernel $kernel_id: installed $kdir/vmlinux"
fi
if [ "$(readlink "$data/kernels/default" 2>/dev/null)" != "$kernel_id" ]; then
  ln -sfn "$kernel_id" "$data/kernels/default.tmp.$$"
  mv -T "$data/kernels/default.tmp.$$" "$data/kernels/default"
  log "kernel: default -> $kernel_id"
fi

# --- image ---
idir=$data/images/minimal
mkdir -p "$idir"
if [ "$(cat "$idir/.installed" 2>/dev/null)" = "$image_id" ] \
    && [ -f "$idir/rootfs.ext4" ] && [ -d "$idir/rootfs" ]; then
  log "image minimal $image_id: already installed"
else
  link_or_copy "$image_dir/rootfs.ext4" "$idir/rootfs.ext4"
  rm -rf "$idir/rootfs.new" "$idir/rootfs.old"
  cp -a "$image_dir/rootfs" "$idir/rootfs.new"
  # Two renames: a reader between them finds no rootfs/ (and fails) rather than a mixed one.
  [ -d "$idir/rootfs" ] && mv -T "$idir/rootfs" "$idir/rootfs.old"
  mv -T "$idir/rootfs.new" "$idir/rootfs"
  rm -rf "$idir/rootfs.old"
  echo "$image_id" > "$idir/.installed.tmp.$$" && mv -f "$idir/.installed.tmp.$$" "$idir/.installed"
  log "image minimal $image_id: installed $idir/{rootfs.ext4,rootfs/}"
fi
echo "$data"
