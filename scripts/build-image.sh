#!/usr/bin/env bash
# Builds a Sandcell root image: a root tree and an ext4 image of it, without root and
# without mounting anything.
#
#   scripts/build-image.sh minimal|base|code-interpreter-v1|desktop [--agent PATH]
#
# minimal = Debian's static busybox with its applet symlinks, the files under
# images/minimal/files/ (passwd, group, hosts, ...), the empty mount points the agent
# expects, and the guest agent at /sbin/sandcell-agent (also /sbin/init).
#
# base = E2B's default template: Debian bookworm (debootstrap minbase) with the packages in
# images/base/packages and the `user` account, made (as root) by images/base/debootstrap.sh
# and cached apart by its own key; then the files under images/base/files/ and the agent are
# added here. Ownership and setuid bits come from that root-made tree as they are.
#
# code-interpreter-v1 = base plus E2B's code interpreter (images/code-interpreter-v1/: pinned
# Jupyter/numpy/pandas/matplotlib wheels and the server on port 49999, by its install.sh),
# and an e2b.json beside the image (its start and ready commands) for install-artifacts.sh.
#
# desktop = base plus E2B's desktop (images/desktop/: Xvfb, xfce4, xdotool, scrot, x11vnc,
# noVNC, apt-installed in the tree by its install.sh), with an e2b.json of its default size.
# Built by `make images`.
#
# The result is cached under ${SANDCELL_CACHE:-~/.cache/sandcell}/images/<hash>/ where
# <hash> covers this script, the busybox binary (minimal) or the debootstrap stage's key
# (base), the agent binary and every file under images/<name>/; it holds rootfs.ext4 and the unpacked tree rootfs/ (the gvisor runtime uses
# the tree). Progress goes to stderr; the last line on stdout is the output directory.
#
# Ownership: `mkfs.ext4 -d` copies the uid/gid of the source files, which belong to whoever
# runs this script. A debugfs pass afterwards sets every inode to root:root and /home/user
# to 1000:1000, so the image is the same whether built by root or not. The tree is chowned
# the same way when the script runs as root (it cannot be otherwise).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${SANDCELL_CACHE:-$HOME/.cache/sandcell}
busybox=${BUSYBOX:-/bin/busybox}
agent=$root/target/x86_64-unknown-linux-gnu/release/sandcell-agent
cached_only=
user_uid=1000

usage() { echo "usage: $0 minimal|base|code-interpreter-v1|desktop [--agent PATH] [--cached]" >&2; exit 2; }
log() { echo "build-image: $*" >&2; }
die() { echo "build-image: $*" >&2; exit 1; }

[ $# -ge 1 ] || usage
name=$1; shift
while [ $# -gt 0 ]; do
  case "$1" in
    --agent) [ $# -ge 2 ] || usage; agent=$2; shift 2 ;;
    --agent=*) agent=${1#--agent=}; shift ;;
    # Only look: print the output dir if this image is built for these inputs, else exit 3.
    --cached) cached_only=1; shift ;;
    *) usage ;;
  esac
done

recipe=$root/images/$name
# extra: what an image built on base adds to it (its own recipe directory), else empty.
extra=
case "$name" in
  minimal|base) [ -d "$recipe/files" ] || die "recipe $recipe/files is missing" ;;
  code-interpreter-v1|desktop)
    extra=$recipe
    recipe=$root/images/base
    [ -x "$extra/install.sh" ] || die "recipe $extra/install.sh is missing" ;;
  *) die "unknown image '$name' (known: minimal, base, code-interpreter-v1, desktop)" ;;
esac
# On base: the Debian tree (debootstrap stage, base's files, node) under it.
on_base=; [ "$name" = minimal ] || on_base=1
# A static ELF: ldd says so (it cannot load it); scripts are "not a dynamic executable" too,
# hence the magic check.
is_static_elf() {
  local out; out=$(LC_ALL=C ldd "$1" 2>&1 || true)
  [ "$(head -c 4 "$1" | tail -c 3)" = ELF ] && echo "$out" | grep -Eq 'not a dynamic executable|statically linked'
}
if [ "$name" = minimal ]; then
[ -x "$busybox" ] || die "$busybox not found; install Debian's busybox-static"
is_static_elf "$busybox" \
  || die "$busybox is not statically linked; install busybox-static (not busybox)"
fi
[ -f "$agent" ] || die "agent binary $agent not found; build it with:
  RUSTFLAGS=\"-C target-feature=+crt-static\" cargo build --release --target x86_64-unknown-linux-gnu -p sandcell-agent
or pass --agent PATH"
is_static_elf "$agent" \
  || die "agent binary $agent is not statically linked (build it with +crt-static)"
for tool in mkfs.ext4 debugfs sha256sum; do
  command -v "$tool" >/dev/null || die "'$tool' is missing; install e2fsprogs/coreutils"
done

# The key: this script, the two binaries, and the recipe files with their relative names.
if [ -n "$on_base" ]; then
# base: the debootstrap stage's key (suite, mirror, packages, its scripts) stands in for
# busybox.
stage_key=$("$recipe/debootstrap.sh" --key)
key=$( {
  sha256sum "$0" "$agent" | cut -d' ' -f1
  echo "debootstrap-stage=$stage_key"
  (cd "$recipe" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
  if [ -n "$extra" ]; then echo "on-base=$name"; (cd "$extra" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum); fi
} | sha256sum | cut -c1-16)
else
key=$( {
  sha256sum "$0" "$busybox" "$agent" | cut -d' ' -f1
  (cd "$recipe" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
} | sha256sum | cut -c1-16)
fi
out=$cache/images/$key
# One build per key at a time: two would assemble in the same $out.tmp (seen: "ln: File
# exists"). The second waits, then finds the first's result cached. (Locks live apart: the
# pruning below counts what is in images/.)
mkdir -p "$cache/locks"
exec 9>"$cache/locks/image-$key.lock"
flock 9
if [ -f "$out/rootfs.ext4" ] && [ -d "$out/rootfs" ]; then
  log "$name: cached ($out)"
  touch "$out"  # recently used: pruning goes by mtime
  echo "$out"
  exit 0
fi
[ -z "$cached_only" ] || { log "$name: not built for these inputs (would be $out)"; exit 3; }

# An install.sh killed mid-way (desktop's apt in a chroot) can leave mounts in the old tree:
# unmount them first, and never let rm cross into another filesystem.
awk -v d="$out.tmp/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | LC_ALL=C sort -r \
  | while IFS= read -r m; do umount -l "$m" || true; done
rm -rf --one-file-system "$out.tmp"
mkdir -p "$out.tmp"
tree=$out.tmp/rootfs
log "$name: assembling the root tree"
mkfs_opts=()
if [ -n "$on_base" ]; then
  [ "$(id -u)" = 0 ] || die "$name: needs root (root-owned, setuid files; debootstrap)"
  stage=$("$recipe/debootstrap.sh" | tail -n 1)
  # A copy, never links: nothing done to this tree may reach the cached stage.
  cp -a "$stage/rootfs" "$tree"
  cp -R "$recipe/files/." "$tree/"
  chmod 0644 "$tree/etc/hostname" "$tree/etc/hosts" "$tree/etc/resolv.conf" "$tree/etc/pip.conf"
  chmod 0440 "$tree/etc/sudoers.d/user"
  # Every command the SDKs run is `bash -l -c CMD`, so the login scripts run each time.
  # Debian's ask `$(id -u)` (/etc/profile) and run `mesg n` (root's ~/.profile): a fork and
  # an exec each, which cost 20-45 ms per command under gVisor (bash -l -c 'echo hi' as
  # `user`: 101 ms before, 57 ms after). bash knows its EUID; mesg only matters on a tty.
  sed -i 's/"$(id -u)"/"${EUID:-$(id -u)}"/g' "$tree/etc/profile"
  sed -i 's|^mesg n 2> /dev/null \|\| true$|if [ -t 0 ]; then mesg n 2> /dev/null \|\| true; fi|' \
    "$tree/root/.profile"
  grep -q 'EUID:-' "$tree/etc/profile" && ! grep -q '^mesg n' "$tree/root/.profile" \
    || die "$name: Debian's /etc/profile or /root/.profile changed: revisit the login-shell edits"
  install -m 0755 "$agent" "$tree/sbin/sandcell-agent"
  [ -e "$tree/sbin/init" ] || ln -s sandcell-agent "$tree/sbin/init"
  # sudo for `user` on gVisor (setuid cannot elevate there): the agent by the name `sudo`
  # asks the agent (PID 1) to run the command; where no such service runs (microVMs) it
  # executes /usr/bin/sudo. /usr/local/bin comes first in PATH and in secure_path.
  ln -sf /sbin/sandcell-agent "$tree/usr/local/bin/sudo"
  "$recipe/node.sh" "$tree"
  if [ -n "$extra" ]; then
    "$extra/install.sh" "$tree"
    cp "$extra/e2b.json" "$out.tmp/e2b.json"
  fi
  # No blocks reserved for root: the headroom is for whoever installs things.
  mkfs_opts=(-m 0)
else
# minimal: busybox, its applet links, the recipe files, the agent.

mkdir -p "$tree"
for d in bin sbin usr/bin usr/sbin usr/local/bin etc root home dev proc sys tmp run mnt var/tmp var/log; do
  mkdir -p "$tree/$d"
done
chmod 0755 "$tree"
chmod 0700 "$tree/root"
chmod 1777 "$tree/tmp" "$tree/var/tmp"

install -m 0755 "$busybox" "$tree/bin/busybox"
applets=0
while IFS= read -r applet; do
  [ -n "$applet" ] || continue
  [ -e "$tree/$applet" ] && continue
  mkdir -p "$tree/$(dirname "$applet")"
  ln -s /bin/busybox "$tree/$applet"
  applets=$((applets + 1))
done < <("$busybox" --list-full)
log "$name: busybox with $applets applet links"

cp -R "$recipe/files/." "$tree/"
chmod 0644 "$tree/etc/passwd" "$tree/etc/group" "$tree/etc/hostname" "$tree/etc/hosts" "$tree/etc/profile"
chmod 0640 "$tree/etc/shadow"

mkdir -p "$tree/home/user"
chmod 0755 "$tree/home/user"

install -m 0755 "$agent" "$tree/sbin/sandcell-agent"
# Busybox brings its own /sbin/init; the agent is PID 1 in every Sandcell guest.
rm -f "$tree/sbin/init"
ln -s sandcell-agent "$tree/sbin/init"

if [ "$(id -u)" = 0 ]; then
  chown -R -h 0:0 "$tree"
  chown -h "$user_uid:$user_uid" "$tree/home/user"
fi
fi

# Fixed timestamps: with them (and the fixed clock, UUID and hash seed below) the same
# inputs give a byte-identical image.
find "$tree" -exec touch -h -d @1700000000 {} +

# Size: the content plus headroom for the inode tables and a little room to write, at
# least 64 MiB (rounded up to whole MiB).
content_kib=$(du -sk --apparent-size "$tree" | cut -f1)
size_mib=$(( (content_kib * 3 / 2) / 1024 + 16 ))
[ "$size_mib" -ge 64 ] || size_mib=64
if [ -n "$on_base" ]; then
  # Blocks in use (small files take whole blocks), then room to pip/apt install things:
  # a quarter more, at least 512 MiB, plus the inode tables and journal.
  used_mib=$(( $(du -sk "$tree" | cut -f1) / 1024 ))
  free_mib=$(( used_mib / 4 )); [ "$free_mib" -ge 512 ] || free_mib=512
  size_mib=$(( used_mib + free_mib + used_mib / 16 + 64 ))
fi
log "$name: making a ${size_mib} MiB ext4 image (${content_kib} KiB of content)"
img=$out.tmp/rootfs.ext4
rm -f "$img"
# E2FSPROGS_FAKE_TIME and the fixed UUID/hash seed keep the build's clock and randomness out
# of the superblock.
E2FSPROGS_FAKE_TIME=1700000000 mkfs.ext4 -q -F -t ext4 \
  -U 5a9dce11-0000-4000-8000-000000000001 -L "${name:0:16}" \
  -E root_owner=0:0,hash_seed=5a9dce11-0000-4000-8000-000000000002 \
  ${mkfs_opts[@]+"${mkfs_opts[@]}"} -d "$tree" "$img" "${size_mib}M" >"$out.tmp/mkfs.log" 2>&1 \
  || { cat "$out.tmp/mkfs.log" >&2; die "mkfs.ext4 failed on $img"; }

# Ownership inside the image, independent of who built it; and the change/creation times,
# which mkfs copies from the tree (ctime: no unprivileged tool can set it; atime: reading the
# tree moves it).
cmds=$out.tmp/debugfs.cmds
# base: the tree was made by root with the ownership it needs (shadow, sudo, /home/user),
# which mkfs copied; only minimal, which may be built by anyone, is rewritten here.
if [ "$name" = minimal ]; then
(cd "$tree" && find . -mindepth 1 -print) | sed 's|^\.||' | while IFS= read -r path; do
  printf 'sif "%s" uid 0\nsif "%s" gid 0\n' "$path" "$path"
  printf 'sif "%s" ctime @1700000000\nsif "%s" crtime @1700000000\nsif "%s" atime @1700000000\n' "$path" "$path" "$path"
done > "$cmds"
printf 'sif "/home/user" uid %d\nsif "/home/user" gid %d\n' "$user_uid" "$user_uid" >> "$cmds"
E2FSPROGS_FAKE_TIME=1700000000 debugfs -w -f "$cmds" "$img" >"$out.tmp/debugfs.log" 2>&1 \
  || { tail -n 20 "$out.tmp/debugfs.log" >&2; die "debugfs failed on $img"; }
if grep -qiE 'error|not found|cannot' "$out.tmp/debugfs.log"; then
  grep -iE 'error|not found|cannot' "$out.tmp/debugfs.log" | head -n 5 >&2
  die "debugfs could not set ownership in $img"
fi
fi
e2fsck -fn "$img" >"$out.tmp/e2fsck.log" 2>&1 || { cat "$out.tmp/e2fsck.log" >&2; die "e2fsck found errors in $img"; }
rm -f "$cmds" "$out.tmp/mkfs.log" "$out.tmp/debugfs.log" "$out.tmp/e2fsck.log"

rm -rf "$out"
mv "$out.tmp" "$out"
# Minimal and base share the directory: keep enough for both and a previous version of each.
"$root/scripts/prune-cache.sh" "$cache/images" "*" 6
log "$name: built $out ($(du -h "$out/rootfs.ext4" | cut -f1) image)"
echo "$out"
