#!/usr/bin/env bash
# Installs the built guest kernel and images into a Sandcell data directory:
#
#   <D>/kernels/<hash>/vmlinux          (hash = the kernel's build-cache key)
#   <D>/kernels/default -> <hash>
#   <D>/images/<name>/rootfs.ext4       (read-only base image)
#   <D>/images/<name>/rootfs/           (the unpacked tree, used by the gvisor runtime)
#
#   scripts/install-artifacts.sh [--data-dir D] [--kernel VMLINUX] [--image NAME]... [--image-dir DIR]
#
# D defaults to $SANDCELL_DATA_DIR or /var/lib/sandcell. Without --kernel the kernel comes
# from scripts/build-kernel.sh. Images:
#   (no option)           minimal (built if missing), and every other image under images/
#                         that is already built for the current inputs (base after `make
#                         images`); one that is not is skipped with a note
#   --image NAME ...      exactly these, from scripts/build-image.sh NAME (built if missing)
#   --image-dir DIR       DIR (an output of build-image.sh) installed as minimal, or as the
#                         one NAME given with --image
# build-image.sh returns cached results in a second.
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
images=()

usage() { echo "usage: $0 [--data-dir D] [--kernel VMLINUX] [--image NAME]... [--image-dir DIR]" >&2; exit 2; }
log() { echo "install-artifacts: $*" >&2; }
die() { echo "install-artifacts: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --data-dir) [ $# -ge 2 ] || usage; data=$2; shift 2 ;;
    --kernel) [ $# -ge 2 ] || usage; kernel=$2; shift 2 ;;
    --image-dir) [ $# -ge 2 ] || usage; image_dir=$2; shift 2 ;;
    --image) [ $# -ge 2 ] || usage; images+=("$2"); shift 2 ;;
    *) usage ;;
  esac
done

for name in ${images[@]+"${images[@]}"}; do
  [[ "$name" =~ ^[a-z0-9][a-z0-9_-]*$ ]] || die "bad image name '$name'"
done
[ -z "$image_dir" ] || [ ${#images[@]} -le 1 ] || die "--image-dir goes with one --image at most"

[ -n "$kernel" ] || kernel=$("$root/scripts/build-kernel.sh" | tail -n 1)
[ -f "$kernel" ] || die "kernel $kernel not found"

# The images to install: parallel lists of names and build-image.sh output directories.
image_names=()
image_dirs=()
if [ -n "$image_dir" ]; then
  image_names=("${images[0]:-minimal}")
  image_dirs=("$image_dir")
elif [ ${#images[@]} -gt 0 ]; then
  for name in "${images[@]}"; do
    image_names+=("$name")
    image_dirs+=("$("$root/scripts/build-image.sh" "$name" | tail -n 1)")
  done
else
  image_names=(minimal)
  image_dirs=("$("$root/scripts/build-image.sh" minimal | tail -n 1)")
  for recipe in "$root"/images/*/files "$root"/images/*/install.sh; do
    name=$(basename "$(dirname "$recipe")")
    [ "$name" != minimal ] || continue
    if dir=$("$root/scripts/build-image.sh" "$name" --cached 2>/dev/null | tail -n 1) && [ -n "$dir" ]; then
      image_names+=("$name")
      image_dirs+=("$dir")
    else
      log "image $name: not built for the current inputs, skipped (build it: scripts/build-image.sh $name, or make images)"
    fi
  done
fi
for dir in "${image_dirs[@]}"; do
  [ -f "$dir/rootfs.ext4" ] && [ -d "$dir/rootfs" ] \
    || die "$dir does not hold rootfs.ext4 and rootfs/ (an output of build-image.sh)"
done

# The identity of each artifact: its cache directory's name (the hash of its inputs), or,
# for a file from elsewhere, the hash of its content.
identity() {
  local dir; dir=$(basename "$(dirname "$1")")
  case "$dir" in *[!0-9a-f]*|'') sha256sum "$1" | cut -c1-16 ;; *) echo "$dir" ;; esac
}
kernel_id=$(identity "$kernel")

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

# --- images ---
for i in "${!image_names[@]}"; do
name=${image_names[$i]}
image_dir=${image_dirs[$i]}
image_id=$(identity "$image_dir/rootfs.ext4")
idir=$data/images/$name
mkdir -p "$idir"
if [ "$(cat "$idir/.installed" 2>/dev/null)" = "$image_id" ] \
    && [ -f "$idir/rootfs.ext4" ] && [ -d "$idir/rootfs" ]; then
  log "image $name $image_id: already installed"
else
  link_or_copy "$image_dir/rootfs.ext4" "$idir/rootfs.ext4"
  rm -rf "$idir/rootfs.new" "$idir/rootfs.old"
  cp -a "$image_dir/rootfs" "$idir/rootfs.new"
  # Two renames: a reader between them finds no rootfs/ (and fails) rather than a mixed one.
  if [ -d "$idir/rootfs" ]; then mv -T "$idir/rootfs" "$idir/rootfs.old"; fi
  mv -T "$idir/rootfs.new" "$idir/rootfs"
  rm -rf "$idir/rootfs.old"
  echo "$image_id" > "$idir/.installed.tmp.$$" && mv -f "$idir/.installed.tmp.$$" "$idir/.installed"
  log "image $name $image_id: installed $idir/{rootfs.ext4,rootfs/}"
fi
# What sandboxes of the image run at create (its start and ready commands), when it has any.
if [ -f "$image_dir/e2b.json" ]; then
  cp "$image_dir/e2b.json" "$idir/e2b.json.tmp.$$" && mv -f "$idir/e2b.json.tmp.$$" "$idir/e2b.json"
else
  rm -f "$idir/e2b.json"
fi
done
echo "$data"
