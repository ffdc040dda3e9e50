#!/usr/bin/env bash
# Builds virtiofsd, the vhost-user virtio-fs daemon (the Rust one, crates.io `virtiofsd`), for
# sandcell-vmm's virtio-fs device: it serves a host directory to the guest over a vhost-user
# socket. Debian 12 has no package of it (neither bookworm nor bookworm-backports; Debian 13
# does), so it is built from crates.io with its own Cargo.lock (--locked), pinned here.
#
#   scripts/build-virtiofsd.sh
#
# Needs libseccomp-dev and libcap-ng-dev (.ci/install-deps); the binary links them
# dynamically. The result is cached under
# ${SANDCELL_CACHE:-~/.cache/sandcell}/virtiofsd-<version>/bin/virtiofsd, so a second run
# takes no time. Its build directory is a CARGO_TARGET_DIR of its own under the cache (never
# the workspace's target/), removed once the binary is installed. Prints the binary's path on
# its last line.
set -euo pipefail

VERSION=1.14.0
cache=${SANDCELL_CACHE:-$HOME/.cache/sandcell}
out=$cache/virtiofsd-$VERSION
bin=$out/bin/virtiofsd

log() { echo "build-virtiofsd: $*" >&2; }
die() { echo "build-virtiofsd: $*" >&2; exit 1; }

# One build at a time: a second run waits, then finds the first's binary.
mkdir -p "$cache/locks"
exec 9>"$cache/locks/virtiofsd-$VERSION.lock"
flock 9
if [ -x "$bin" ]; then
  log "cached ($bin)"
  touch "$out"  # recently used
  echo "$bin"
  exit 0
fi

command -v cargo >/dev/null || die "cargo is missing"
for lib in libseccomp libcap-ng; do
  pkg-config --exists "$lib" 2>/dev/null || [ -n "$(ls /usr/lib/*/"$lib".so /usr/lib/"$lib".so 2>/dev/null)" ] ||
    die "$lib is missing (Debian: $lib-dev); run .ci/install-deps"
done

log "cargo install virtiofsd $VERSION --locked (a few minutes on 2 cores)"
start=$(date +%s)
rm -rf "$out.tmp"
CARGO_TARGET_DIR=$cache/virtiofsd-build \
  cargo install --quiet virtiofsd --version "$VERSION" --locked --root "$out.tmp" >&2
rm -rf "$cache/virtiofsd-build"
"$out.tmp/bin/virtiofsd" --version >/dev/null || die "the built virtiofsd does not run"
rm -rf "$out" && mv "$out.tmp" "$out"
log "built in $(( $(date +%s) - start ))s ($("$bin" --version | head -n 1))"
echo "$bin"
