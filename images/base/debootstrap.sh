#!/usr/bin/env bash
# The expensive first stage of the `base` image: Debian bookworm by `debootstrap
# --variant=minbase` with the packages listed in ./packages, then ./setup-chroot.sh run
# inside it (the `user` account, clean-up). No agent, no files/: scripts/build-image.sh adds
# those in the cheap second stage, so a new agent does not redo this.
#
#   images/base/debootstrap.sh          build (or find cached); last stdout line = the dir
#   images/base/debootstrap.sh --key    print the cache key only (no root needed)
#
# Cached under ${SANDCELL_CACHE:-~/.cache/sandcell}/debootstrap/<key>/rootfs, where <key>
# covers this script, setup-chroot.sh, the package list, the suite and the mirror
# ($SANDCELL_DEBIAN_MIRROR, default deb.debian.org as this host's apt uses). Downloaded .debs
# are kept in .../debootstrap/debs so a changed package list fetches only what is new.
# Needs root: debootstrap chroots, creates device nodes and root-owned, setuid files.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cache=${SANDCELL_CACHE:-$HOME/.cache/sandcell}
suite=bookworm
mirror=${SANDCELL_DEBIAN_MIRROR:-http://deb.debian.org/debian}

log() { echo "build-image: base: $*" >&2; }
die() { echo "build-image: base: $*" >&2; exit 1; }

# The list without comments, blanks or order, so only a real change moves the key.
packages=$(sed 's/#.*//' "$here/packages" | tr -s ' \t' '\n\n' | grep -v '^$' | LC_ALL=C sort -u | paste -sd, -)
[ -n "$packages" ] || die "$here/packages lists no package"
key=$( {
  sha256sum "$here/debootstrap.sh" "$here/setup-chroot.sh" | cut -d' ' -f1
  echo "suite=$suite mirror=$mirror packages=$packages"
} | sha256sum | cut -c1-16)

if [ "${1:-}" = --key ]; then echo "$key"; exit 0; fi
[ $# -eq 0 ] || { echo "usage: $0 [--key]" >&2; exit 2; }

out=$cache/debootstrap/$key
if [ -d "$out/rootfs" ]; then
  log "debootstrap stage cached ($out)"
  echo "$out"
  exit 0
fi
[ "$(id -u)" = 0 ] || die "debootstrap needs root (chroot, device nodes, root-owned setuid files): run as root"
debootstrap=$(command -v debootstrap || echo /usr/sbin/debootstrap)
[ -x "$debootstrap" ] || die "debootstrap is missing: apt-get install debootstrap"

# debootstrap mounts /proc and /sys inside the target; a failed run can leave them there.
# Unmount before removing anything, and never let rm cross into another filesystem.
unmount_under() {
  local m
  awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | LC_ALL=C sort -r \
    | while IFS= read -r m; do umount -l "$m" || true; done
}
tmp=$out.tmp
cleanup() { unmount_under "$tmp"; rm -rf --one-file-system "$tmp"; }
trap cleanup EXIT
cleanup
mkdir -p "$tmp" "$cache/debootstrap/debs"

log "debootstrap $suite (minbase + ${packages//,/ }) from $mirror"
# Progress: the stage lines as they come; per-package lines condensed to a running count.
# (A shell loop, not awk: mawk reads its input in blocks, which would hold the lines back.)
progress() {
  local line verb
  local -A count=()
  while IFS= read -r line; do
    line=${line#I: }
    line=${line%"${line##*[! ]}"}
    verb=${line%% *}
    case "$line" in
      *" required "*|*" base "*|*" the "*|*" InRelease"|*" Release"|*" Packages") verb= ;;
    esac
    case "$verb" in
      Retrieving|Validating|Extracting|Unpacking|Configuring)
        count[$verb]=$(( ${count[$verb]:-0} + 1 ))
        if [ "${count[$verb]}" = 1 ] || [ $((count[$verb] % 25)) = 0 ]; then
          echo "build-image: base: debootstrap: $verb packages (${count[$verb]})" >&2
        fi ;;
      *) echo "build-image: base: debootstrap: $line" >&2; count=() ;;
    esac
  done
}
start=$SECONDS
nice "$debootstrap" --variant=minbase --include="$packages" --cache-dir="$cache/debootstrap/debs" \
    "$suite" "$tmp/rootfs" "$mirror" 2>&1 | tee "$tmp/debootstrap.log" | progress \
  || { cat "$tmp/debootstrap.log" "$tmp/rootfs/debootstrap/debootstrap.log" \
         > "$cache/debootstrap/failed.log" 2>/dev/null || true
       tail -n 30 "$cache/debootstrap/failed.log" >&2
       die "debootstrap failed (its logs: $cache/debootstrap/failed.log)"; }
log "debootstrap done in $((SECONDS - start)) s; setting up the user account and slimming"
install -m 0755 "$here/setup-chroot.sh" "$tmp/rootfs/setup-chroot.sh"
nice chroot "$tmp/rootfs" /bin/bash /setup-chroot.sh >&2 || die "setup-chroot.sh failed"
rm -f "$tmp/rootfs/setup-chroot.sh"
unmount_under "$tmp"
rm -f "$tmp/debootstrap.log"

trap - EXIT
rm -rf --one-file-system "$out"
mv "$tmp" "$out"
log "debootstrap stage: $(du -sh "$out/rootfs" | cut -f1) in $out"
echo "$out"
