#!/usr/bin/env bash
# Adds E2B's desktop to a copy of the base tree: the packages in ./packages, installed by
# apt inside the tree (chroot; the .debs cached in
# ${SANDCELL_CACHE:-~/.cache/sandcell}/downloads/desktop-debs), and /opt/noVNC where the
# e2b-desktop SDK looks for it. The SDK starts Xvfb, the xfce4 session and the VNC stream
# itself, with the commands these packages provide. Needs root (chroot, mounts).
#
#   images/desktop/install.sh TREE
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
tree=$(cd "${1:?usage: install.sh TREE}" && pwd)
debs=${SANDCELL_CACHE:-$HOME/.cache/sandcell}/downloads/desktop-debs
log() { echo "build-image: desktop: $*" >&2; }
die() { echo "build-image: desktop: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (apt in a chroot)"
[ -x "$tree/usr/bin/apt-get" ] || die "$tree has no apt-get (not a base tree?)"
packages=$(sed 's/#.*//' "$here/packages" | tr -s ' \t' '\n\n' | grep -v '^$' | LC_ALL=C sort -u)
[ -n "$packages" ] || die "$here/packages lists no package"

mkdir -p "$debs/partial"
mounts=()
resolv_saved=
cleanup() {
  local m
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
  rm -f "$tree/usr/sbin/policy-rc.d"
  if [ -n "$resolv_saved" ]; then mv -f "$resolv_saved" "$tree/etc/resolv.conf"; fi
}
trap cleanup EXIT
bind() { mkdir -p "$tree$2"; mount --bind "$1" "$tree$2"; mounts+=("$tree$2"); }
# /proc for the maintainer scripts; the tree has its own /dev nodes (debootstrap's), so the
# host's /dev is never mounted into it. build-image.sh unmounts whatever a killed run left.
mount -t proc proc "$tree/proc"; mounts+=("$tree/proc")
bind "$debs" /var/cache/apt/archives
# The host's resolver for apt's downloads; the image's own file comes back afterwards.
resolv_saved=$tree/etc/.resolv.conf.sandcell
cp -a "$tree/etc/resolv.conf" "$resolv_saved"
cp /etc/resolv.conf "$tree/etc/resolv.conf"
# No service starts inside the build (dbus, x11vnc's): policy-rc.d says no to all.
printf '#!/bin/sh\nexit 101\n' >"$tree/usr/sbin/policy-rc.d"
chmod 0755 "$tree/usr/sbin/policy-rc.d"

in_tree() { chroot "$tree" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"; }
log "apt-get update"
in_tree apt-get -q update >/dev/null
# Progress: one line per 25 packages unpacked, as the base stage does.
log "apt-get install ($(echo "$packages" | wc -l) packages and their dependencies)"
apt_log=$(mktemp)
# shellcheck disable=SC2086
if ! in_tree apt-get -q -y --no-install-recommends -o Dpkg::Use-Pty=0 install $packages 2>&1 \
  | tee "$apt_log" \
  | awk '/^Unpacking /{n++; if (n == 1 || n % 25 == 0) { print "build-image: desktop: unpacking (" n ")"; fflush() } }' >&2
then
  tail -n 30 "$apt_log" >&2
  rm -f "$apt_log"
  die "apt-get install failed (its last lines above)"
fi
rm -f "$apt_log"
for tool in Xvfb xdpyinfo xrandr xprop xwininfo startxfce4 xfwm4 xfdesktop scrot xdotool x11vnc websockify netstat xdg-open gtk-launch chromium; do
  in_tree sh -c "command -v $tool" >/dev/null || die "$tool is missing after the install"
done
in_tree apt-get -q clean
rm -rf "$tree/var/lib/apt/lists/"*

# GLib's child spawning on gVisor: close_range.c says why. Built with the image's own gcc.
mkdir -p "$tree/usr/local/lib/sandcell"
cp "$here/close_range.c" "$tree/tmp/close_range.c"
in_tree gcc -shared -fPIC -O2 -Wall -Werror -o /usr/local/lib/sandcell/libcloserange.so /tmp/close_range.c
rm -f "$tree/tmp/close_range.c"
echo /usr/local/lib/sandcell/libcloserange.so >"$tree/etc/ld.so.preload"
chmod 0644 "$tree/etc/ld.so.preload"

# The session bus listens in /dev/shm (the sandbox's own tmpfs), not /tmp: on a sandbox
# with a disk /tmp is reached through runsc's gofer, and runsc cannot checkpoint a socket
# bound there (X11's and ICE's socket dirs get a tmpfs of their own: gvisor/bundle.rs).
sed -i 's|<listen>unix:tmpdir=/tmp</listen>|<listen>unix:dir=/dev/shm</listen>|' "$tree/usr/share/dbus-1/session.conf"
grep -q '<listen>unix:dir=/dev/shm</listen>' "$tree/usr/share/dbus-1/session.conf" ||
  die "the session bus's listen address was not changed"

# The start command (e2b.json) and the SDK's commands' wrappers for a restored started
# desktop: session.sh, Xvfb, xvfb-swap.sh, xdpyinfo and startxfce4 say why.
install -m 0755 "$here/session.sh" "$tree/usr/local/lib/sandcell/desktop-session.sh"
install -m 0644 "$here/xvfb-swap.sh" "$tree/usr/local/lib/sandcell/xvfb-swap.sh"
install -m 0755 "$here/Xvfb" "$tree/usr/local/bin/Xvfb"
install -m 0755 "$here/xdpyinfo" "$tree/usr/local/bin/xdpyinfo"
install -m 0755 "$here/startxfce4" "$tree/usr/local/bin/startxfce4"

# Chromium without its first-run page and default-browser question (an agent's first
# screenshot should show the page it opened); the default browser of xdg-open and xfce4.
cat >"$tree/etc/chromium.d/sandcell" <<'SH'
# The desktop template's Chromium flags (images/desktop/install.sh).
export CHROMIUM_FLAGS="$CHROMIUM_FLAGS --no-first-run --no-default-browser-check --disable-features=HighEfficiencyModeAvailable,MemorySaverModeAvailable"
SH
chmod 0644 "$tree/etc/chromium.d/sandcell"
in_tree update-alternatives --set x-www-browser /usr/bin/chromium >/dev/null 2>&1 || true
mkdir -p "$tree/etc/xdg"
printf '[Default Applications]\nx-scheme-handler/http=chromium.desktop\nx-scheme-handler/https=chromium.desktop\ntext/html=chromium.desktop\n' \
  >"$tree/etc/xdg/mimeapps.list"

# noVNC where the SDK runs it: `cd /opt/noVNC/utils && ./novnc_proxy --vnc ... --listen
# PORT --web /opt/noVNC`. Debian's package has the web files; its launcher is websockify.
ln -sfn /usr/share/novnc "$tree/opt/noVNC"
if [ ! -x "$tree/usr/share/novnc/utils/novnc_proxy" ]; then
  mkdir -p "$tree/usr/share/novnc/utils"
  cat >"$tree/usr/share/novnc/utils/novnc_proxy" <<'SH'
#!/bin/sh
# noVNC's launcher as the e2b-desktop SDK calls it: --vnc HOST:PORT --listen PORT --web DIR.
vnc=localhost:5900 listen=6080 web=/usr/share/novnc
while [ $# -gt 0 ]; do
  case "$1" in
    --vnc) vnc=$2; shift 2 ;;
    --listen) listen=$2; shift 2 ;;
    --web) web=$2; shift 2 ;;
    *) shift ;;
  esac
done
exec websockify --web "$web" "$listen" "$vnc"
SH
  chmod 0755 "$tree/usr/share/novnc/utils/novnc_proxy"
fi
[ -e "$tree/usr/share/novnc/vnc.html" ] || die "noVNC's vnc.html is missing"
log "installed"
