#!/usr/bin/env bash
# Fetches the L1 kernel of the nested-KVM harness: vmlinuz, the KVM modules (irqbypass,
# kvm, kvm-amd) and tun (virtio-net's TAP; a module in the cloud kernel, no dependencies),
# and in net/ what a daemon's sandbox networks need (veth, nftables, tc's mirred redirect)
# with their dependencies, net/order listing them dependencies first, from Debian's
# linux-image-cloud-amd64, cached under
# ${SANDCELL_CACHE:-~/.cache/sandcell}/nested/l1-<hash>/ where <hash> covers the versioned
# package name, its version and this script. Prints that directory on its last line.
#
# L1_KERNEL_PKG=linux-image-6.1.0-NN-cloud-amd64 pins the package; otherwise the version the
# metapackage points at in the local apt lists is used. Without usable apt lists (offline),
# the most recent cached L1 kernel is used, said so on stderr.
set -euo pipefail

cache=${SANDCELL_CACHE:-$HOME/.cache/sandcell}/nested
log() { echo "l1-kernel: $*" >&2; }
die() { echo "l1-kernel: $*" >&2; exit 1; }

pkg=${L1_KERNEL_PKG:-$(apt-cache depends linux-image-cloud-amd64 2>/dev/null \
  | awk '/Depends: linux-image-[0-9]/ { print $2; exit }' || true)}
version=
[ -z "$pkg" ] || version=$(apt-cache show --no-all-versions "$pkg" 2>/dev/null | awk '/^Version:/ { print $2; exit }' || true)

if [ -z "$pkg" ] || [ -z "$version" ]; then
  newest=$(ls -1dt "$cache"/l1-*/ 2>/dev/null | head -n 1 || true)
  [ -n "$newest" ] && [ -f "$newest/vmlinuz" ] \
    || die "cannot resolve linux-image-cloud-amd64 (run apt-get update) and no cached L1 kernel"
  log "apt cannot resolve linux-image-cloud-amd64; using the cached ${newest%/}"
  echo "${newest%/}"
  exit 0
fi

key=$( { echo "$pkg=$version"; cat "$0"; } | sha256sum | cut -c1-16)
out=$cache/l1-$key
if [ -f "$out/vmlinuz" ] && [ -f "$out/kvm-amd.ko" ] && [ -f "$out/tun.ko" ] && [ -f "$out/net/order" ]; then
  log "cached $pkg $version ($out)"
  echo "$out"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/sandcell-l1.XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 0755 "$work"   # apt's download sandbox user must be able to write here
log "downloading $pkg $version"
(cd "$work" && apt-get download "$pkg=$version" 2>&1 | grep -v '^W: Download is performed unsandboxed' >&2) \
  || die "apt-get download $pkg=$version failed"
deb=$(ls "$work"/*.deb 2>/dev/null | head -n 1)
[ -n "$deb" ] || die "apt-get download $pkg=$version produced no .deb"
dpkg -x "$deb" "$work/x"

mkdir -p "$out.tmp"
vmlinuz=$(ls "$work"/x/boot/vmlinuz-* 2>/dev/null | head -n 1)
[ -n "$vmlinuz" ] || die "$deb has no /boot/vmlinuz-*"
cp "$vmlinuz" "$out.tmp/vmlinuz"
for mod in irqbypass kvm kvm-amd tun; do
  found=$(find "$work/x/lib/modules" -name "$mod.ko" -o -name "$mod.ko.xz" -o -name "$mod.ko.zst" | head -n 1)
  [ -n "$found" ] || die "$deb has no $mod.ko"
  case "$found" in
    *.ko) cp "$found" "$out.tmp/$mod.ko" ;;
    *.ko.xz) xz -dc "$found" > "$out.tmp/$mod.ko" ;;
    *.ko.zst) zstd -qdc "$found" > "$out.tmp/$mod.ko" ;;
  esac
done
# The daemon's networks (crates/net): veth pairs, nftables with the expressions its rules use
# (ct, nat, masquerade, redirect, reject, limit, log, named counters), conntrack's netlink (the
# conntrack tool), and the microvm runtime's tc ingress + u32 + mirred between TAP and veth.
NET_MODULES="veth nf_tables nft_ct nft_nat nft_chain_nat nft_masq nft_redir nft_reject_inet
  nft_limit nft_log nf_log_syslog nft_objref nf_conntrack_netlink sch_ingress cls_u32
  act_mirred"
mkdir -p "$out.tmp/net"
: > "$out.tmp/net/order"
# add_module NAME: its dependencies first (from the module's .modinfo), then itself, once.
add_module() {
  local name=$1 ko dep
  grep -qx "$name" "$out.tmp/net/order" && return 0
  [ "$name" = tun ] && return 0   # loaded by L1's init already
  ko=$(find "$work/x/lib/modules" -name "$name.ko" | head -n 1)
  [ -n "$ko" ] || die "$deb has no $name.ko (for the daemon's networks)"
  for dep in $(objcopy -O binary --only-section=.modinfo "$ko" /dev/stdout | tr '\0' '\n' \
      | sed -n 's/^depends=//p' | tr ',' ' '); do
    add_module "$dep"
  done
  cp "$ko" "$out.tmp/net/$name.ko"
  echo "$name" >> "$out.tmp/net/order"
}
# The desktop test's disk (run.sh attaches the desktop image to L1 as a virtio-blk disk on
# PCI); they go in the same directory and order file.
DISK_MODULES="virtio_pci virtio_blk"
for m in $NET_MODULES $DISK_MODULES; do add_module "$m"; done
log "network modules: $(wc -l < "$out.tmp/net/order") with dependencies"
echo "$pkg $version" > "$out.tmp/package"
rm -rf "$out" && mv "$out.tmp" "$out"
log "cached $pkg $version in $out"
echo "$out"
