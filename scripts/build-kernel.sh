#!/usr/bin/env bash
# Builds the Sandcell guest kernel from Debian's linux-source (6.1): tinyconfig plus
# images/kernel/config.fragment, everything built in, an ELF vmlinux.
#
# The result is cached under ${SANDCELL_CACHE:-~/.cache/sandcell}/kernel/<hash>/vmlinux where
# <hash> covers the source tarball, the fragment and this script, so a rebuild with the same
# inputs takes seconds. Prints the path of the vmlinux on its last line.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${SANDCELL_CACHE:-$HOME/.cache/sandcell}
tarball=${LINUX_SOURCE_TARBALL:-$(ls /usr/src/linux-source-6.1.tar.xz 2>/dev/null || true)}
fragment=$root/images/kernel/config.fragment
jobs=${JOBS:-$(nproc)}

if [ -z "$tarball" ] || [ ! -f "$tarball" ]; then
  echo "build-kernel: /usr/src/linux-source-6.1.tar.xz not found; install it with: apt-get install linux-source" >&2
  exit 1
fi
for tool in flex bison bc make gcc; do
  command -v "$tool" >/dev/null || { echo "build-kernel: '$tool' is missing; run .ci/install-deps" >&2; exit 1; }
done

# The hash of the inputs: the tarball's identity (name, size, mtime: hashing 130 MB each
# time would cost seconds), the fragment and this script.
key=$( { stat -c '%n %s %Y' "$tarball"; cat "$fragment" "$0"; } | sha256sum | cut -c1-16)
out=$cache/kernel/$key
if [ -f "$out/vmlinux" ]; then
  echo "kernel: cached ($out/vmlinux)" >&2
  touch "$out"  # recently used: pruning goes by mtime
  echo "$out/vmlinux"
  exit 0
fi

work=$cache/kernel-build/$key
mkdir -p "$work"
src=$work/linux
if [ ! -f "$src/Makefile" ]; then
  echo "kernel: unpacking $tarball" >&2
  rm -rf "$src.tmp" && mkdir -p "$src.tmp"
  tar -xJf "$tarball" -C "$src.tmp" --strip-components=1
  mv "$src.tmp" "$src"
fi

cd "$src"
make -s ARCH=x86_64 tinyconfig >/dev/null
scripts/kconfig/merge_config.sh -m -O . .config "$fragment" >/dev/null
make -s ARCH=x86_64 olddefconfig >/dev/null

# Every option the fragment asks for must have survived dependency resolution; a silently
# dropped option (a missing menu gate) would otherwise show up as a guest that cannot boot.
missing=0
while IFS= read -r line; do
  case "$line" in CONFIG_*=y) ;; *) continue ;; esac
  grep -qx "$line" .config || { echo "build-kernel: $line did not survive olddefconfig" >&2; missing=1; }
done < "$fragment"
[ "$missing" = 0 ] || exit 1

# Progress: the number of objects compiled so far against the count from the last build of
# this configuration (a fresh tree has about 1500).
total=$(cat "$work/objects" 2>/dev/null || echo 1500)
echo "kernel: building vmlinux with -j$jobs (about 12 minutes on 2 cores from scratch)" >&2
count=0
start=$(date +%s)
make ARCH=x86_64 -j"$jobs" vmlinux 2>"$work/build.err" | while IFS= read -r l; do
  case "$l" in *" CC "*|*" AS "*|*" LD "*|*" AR "*)
    count=$((count + 1))
    if [ -t 2 ] || [ $((count % 100)) = 0 ]; then
      pct=$((count * 100 / total)); [ "$pct" -gt 99 ] && pct=99
      printf '\rkernel: [%-40s] %3d%% %5d objects %4ds' "$(printf '#%.0s' $(seq 1 $((pct * 40 / 100 + 1))) | cut -c1-40)" "$pct" "$count" "$(( $(date +%s) - start ))" >&2
      [ -t 2 ] || printf '\n' >&2
    fi
    echo "$count" > "$work/objects.partial" ;;
  esac
done
status=${PIPESTATUS[0]}
printf '\n' >&2
if [ "$status" != 0 ]; then
  echo "build-kernel: make failed; last errors:" >&2
  tail -n 30 "$work/build.err" >&2
  exit 1
fi
mv -f "$work/objects.partial" "$work/objects" 2>/dev/null || true

mkdir -p "$out.tmp"
cp vmlinux "$out.tmp/vmlinux"
cp .config "$out.tmp/config"
rm -rf "$out" && mv "$out.tmp" "$out"
# Older kernels and build trees (3 GB each) go; the last three kernels stay for bisecting.
"$root/scripts/prune-cache.sh" "$cache/kernel" "*" 3
"$root/scripts/prune-cache.sh" "$cache/kernel-build" "*" 1
echo "kernel: built in $(( $(date +%s) - start ))s ($(du -h "$out/vmlinux" | cut -f1))" >&2
echo "$out/vmlinux"
