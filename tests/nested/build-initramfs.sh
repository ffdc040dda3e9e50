#!/usr/bin/env bash
# Assembles the L1 initramfs of the nested-KVM harness (an uncompressed newc cpio: under TCG,
# decompressing in L1 would cost more than QEMU copying the bytes in), without root:
#
#   /init, /nested/{tests,snapshot,net,template,jail,attacks}.sh tests/nested/l1/
#   /bin/busybox + applet links       Debian's busybox-static
#   /lib/modules/*.ko                 irqbypass, kvm, kvm-amd, tun from the L1 kernel package
#   /lib/modules/net/                 the network modules a daemon's networks need, and their
#                                     load order (l1-kernel.sh)
#   /usr/bin/{sandcell-vmm,sandcell,nested-probe}
#   /usr/bin/{ip,tc,nft,conntrack}    this host's, with their libraries: the daemon's networks
#   /usr/bin/virtiofsd                --virtiofsd, with its libraries: the vhost-user daemon
#                                     behind sandcell-vmm's virtio-fs device
#   /var/lib/sandcell/                the guest kernel and the minimal image, laid out by
#                                     scripts/install-artifacts.sh
#
#   build-initramfs.sh --l1 DIR --kernel VMLINUX --image-dir DIR --probe BIN
#                      [--vmm BIN] [--cli BIN] [--virtiofsd BIN]
#
# A missing --vmm/--cli/--virtiofsd is left out (the tests that need it then fail, saying
# so). Binaries may be static or dynamic: the shared libraries `ldd` names are copied in
# beside them.
# Cached under ${SANDCELL_CACHE:-~/.cache/sandcell}/nested/initramfs-<hash>.cpio, <hash>
# covering every input; prints its path on the last line.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${SANDCELL_CACHE:-$HOME/.cache/sandcell}/nested
busybox=${BUSYBOX:-/bin/busybox}
l1= kernel= image_dir= probe= vmm= cli= virtiofsd=

usage() { echo "usage: $0 --l1 DIR --kernel VMLINUX --image-dir DIR --probe BIN [--vmm BIN] [--cli BIN] [--virtiofsd BIN]" >&2; exit 2; }
log() { echo "build-initramfs: $*" >&2; }
die() { echo "build-initramfs: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case "$1" in
    --l1) l1=$2 ;; --kernel) kernel=$2 ;; --image-dir) image_dir=$2 ;;
    --probe) probe=$2 ;; --vmm) vmm=$2 ;; --cli) cli=$2 ;; --virtiofsd) virtiofsd=$2 ;;
    *) usage ;;
  esac
  shift 2
done
[ -n "$l1" ] && [ -n "$kernel" ] && [ -n "$image_dir" ] && [ -n "$probe" ] || usage
for f in "$l1/irqbypass.ko" "$l1/kvm.ko" "$l1/kvm-amd.ko" "$l1/tun.ko" "$kernel" "$image_dir/rootfs.ext4" "$probe" "$busybox"; do
  [ -f "$f" ] || die "$f not found"
done
for f in "$vmm" "$cli" "$virtiofsd"; do
  [ -z "$f" ] || [ -f "$f" ] || die "$f not found"
done

# Big inputs are keyed by their cache directory (itself a hash of their inputs), the rest by
# content.
key=$( {
  echo "l1=$l1 kernel=$kernel image=$image_dir"
  sha256sum "$0" "$root/scripts/install-artifacts.sh" "$here"/l1/* "$probe" "$busybox" $vmm $cli \
    $virtiofsd $(command -v ip tc nft conntrack) | cut -d' ' -f1
  echo "vmm=${vmm:+yes} cli=${cli:+yes} virtiofsd=${virtiofsd:+yes}"
} | sha256sum | cut -c1-16)
out=$cache/initramfs-$key.cpio
if [ -f "$out" ]; then
  log "cached ($out)"
  touch "$out"  # recently used: pruning goes by mtime
  echo "$out"
  exit 0
fi

mkdir -p "$cache"
stage=$(mktemp -d "$cache/stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
log "assembling in $stage"

mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,lib/modules,proc,sys,dev,tmp,run,nested,etc}
install -m 0755 "$here/l1/init" "$stage/init"
install -m 0755 "$here/l1/tests.sh" "$stage/nested/tests.sh"
install -m 0644 "$here/l1/snapshot.sh" "$stage/nested/snapshot.sh"
install -m 0644 "$here/l1/net.sh" "$stage/nested/net.sh"
install -m 0644 "$here/l1/template.sh" "$stage/nested/template.sh"
install -m 0644 "$here/l1/attacks.sh" "$stage/nested/attacks.sh"
install -m 0644 "$here/l1/jail.sh" "$stage/nested/jail.sh"
install -m 0755 "$busybox" "$stage/bin/busybox"
while IFS= read -r applet; do
  [ -e "$stage/$applet" ] || { mkdir -p "$stage/$(dirname "$applet")"; ln -s /bin/busybox "$stage/$applet"; }
done < <("$busybox" --list-full)
cp "$l1/irqbypass.ko" "$l1/kvm.ko" "$l1/kvm-amd.ko" "$l1/tun.ko" "$stage/lib/modules/"
[ -f "$l1/net/order" ] || die "$l1 has no net/ modules (an L1 kernel cached by an older l1-kernel.sh)"
cp -r "$l1/net" "$stage/lib/modules/net"

# add_binary SRC NAME: /usr/bin/NAME, plus its shared libraries and loader if it has any.
add_binary() {
  install -m 0755 "$1" "$stage/usr/bin/$2"
  if ! (LC_ALL=C ldd "$1" 2>&1 || true) | grep -Eq 'not a dynamic executable|statically linked'; then
    ldd "$1" | grep -o '/[^ ]*' | while IFS= read -r lib; do
      [ -e "$stage$lib" ] || { mkdir -p "$stage$(dirname "$lib")"; cp -L "$lib" "$stage$lib"; }
    done
    log "$2 is dynamic: copied its libraries ($(ldd "$1" | grep -c '/'))"
  fi
}
add_binary "$probe" nested-probe
[ -z "$vmm" ] && log "no sandcell-vmm: the tests that need it will fail" || add_binary "$vmm" sandcell-vmm
[ -z "$cli" ] && log "no sandcell CLI: the tests that need it will fail" || add_binary "$cli" sandcell
[ -z "$virtiofsd" ] && log "no virtiofsd: the tests that need it will fail" || add_binary "$virtiofsd" virtiofsd
# The daemon's networks run these (crates/net, crates/runtime/src/microvm/network.rs); busybox's
# ip has no netns and no tuntap.
for tool in ip tc nft conntrack; do
  path=$(command -v "$tool") || die "$tool is missing on this host (Debian: iproute2, nftables, conntrack)"
  add_binary "$path" "$tool"
done

"$root/scripts/install-artifacts.sh" --data-dir "$stage/var/lib/sandcell" \
  --kernel "$kernel" --image-dir "$image_dir" >/dev/null
# L1 never runs gvisor: the unpacked tree would only take memory.
rm -rf "$stage/var/lib/sandcell/images/minimal/rootfs"
mkdir -p "$stage/var/lib/sandcell/images/minimal/rootfs"

(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) > "$out.tmp"
mv "$out.tmp" "$out"
"$here/../../scripts/prune-cache.sh" "$cache" "initramfs-*.cpio" 3
log "built $out ($(du -h "$out" | cut -f1))"
echo "$out"
