#!/usr/bin/env bash
# `make run`'s port URLs on one machine (scripts/serve-local.sh, scripts/local-domain.sh):
# the daemon serves `--domain sandcell.localhost` on 127.0.0.1:443, the host resolves every
# name under it to 127.0.0.1 through dnsmasq and trusts the daemon's CA in its system store;
# then the stock `e2b` Python SDK, with E2B_DOMAIN and neither E2B_SANDBOX_URL nor
# SSL_CERT_FILE, runs a command over https://49983-<id>.sandcell.localhost; other names
# (the package registries') still resolve; and stopping the daemon undoes the host setup.
#
# Everything the setup edits (/etc/resolv.conf, the CA store) is this test's own copy: it runs
# in a mount namespace of its own (unshare -m) with those paths bound over. dnsmasq listens on
# a loopback address of its own. Run by tests/e2b/run.sh; needs root, runsc, the installed
# images, dnsmasq, and 127.0.0.1:443 and :3000 free.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/tests/e2b"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sandcell/e2b-test"
PY_SDK=${PY_SDK:-$(sed -n 's/^PY_SDK=\([0-9.]*\)$/\1/p' "$HERE/run.sh")}
DOMAIN=sandcell.localhost

say() { echo "==> $*" >&2; }
die() { echo "tests/e2b/local_domain: $*" >&2; exit 1; }

if [ -z "${SANDCELL_LOCAL_DOMAIN_INNER:-}" ]; then
  # shellcheck source=tests/lib/daemon.sh
  . "$ROOT/tests/lib/daemon.sh"
  sc_require_gvisor
  sc_e2b_venv "$CACHE/venv" "$PY_SDK"
  sc_bin
  for port in 443 3000; do
    ! ss -Hltn "sport = :$port" | grep -qE '(127\.0\.0\.1|0\.0\.0\.0|\*|\[::\]):'"$port"' ' ||
      die "127.0.0.1:$port is taken: this test needs it free"
  done
  exec env SANDCELL_LOCAL_DOMAIN_INNER=1 SANDCELL_BIN="$SANDCELL_BIN" INSTALLED="$INSTALLED" \
    unshare -m bash "$0"
fi

mount --make-rprivate /
TMP=$(mktemp -d /tmp/sc-local-domain.XXXXXX)
DATA=$TMP/data
export SANDCELL_LOCAL_STATE=$TMP/state SANDCELL_RUN_DIR=$TMP/run
# This namespace's own resolver config and CA store.
cp /etc/resolv.conf "$TMP/resolv.conf"
mount --bind "$TMP/resolv.conf" /etc/resolv.conf
mkdir -p "$TMP/ca" "$TMP/ssl"
mount --bind "$TMP/ca" /usr/local/share/ca-certificates
cp -a /etc/ssl/certs "$TMP/ssl/"
mount --bind "$TMP/ssl/certs" /etc/ssl/certs
resolv_before=$(cat /etc/resolv.conf)
mkdir -p "$DATA/images"
for i in minimal base; do
  [ -d "$INSTALLED/images/$i" ] && ln -s "$INSTALLED/images/$i" "$DATA/images/$i"
done
[ -d "$INSTALLED/kernels" ] && ln -s "$INSTALLED/kernels" "$DATA/kernels"
template=minimal
[ -d "$DATA/images/base" ] && template=base

say "scripts/serve-local.sh (sandcell serve --domain $DOMAIN on 127.0.0.1:443)"
setsid "$ROOT/scripts/serve-local.sh" "$SANDCELL_BIN" "$DATA" >"$TMP/out" 2>"$TMP/err" &
serve=$!
cleanup() {
  kill -TERM -- "-$serve" 2>/dev/null || true
  for _ in $(seq 300); do kill -0 "$serve" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$serve" 2>/dev/null || true
  "$ROOT/scripts/local-domain.sh" down "$DOMAIN" >/dev/null 2>&1 || true
  if grep -q " $TMP/" /proc/mounts; then
    echo "$0: mounts left under $TMP; not removing it" >&2
  else
    rm -rf "$TMP"
  fi
}
trap cleanup EXIT
for _ in $(seq 300); do
  grep -q "port URLs: https://" "$TMP/out" 2>/dev/null && break
  kill -0 "$serve" 2>/dev/null || { cat "$TMP/out" "$TMP/err" >&2; die "serve-local.sh exited"; }
  sleep 0.1
done
grep -q "port URLs: https://<port>-<sandboxID>.$DOMAIN" "$TMP/out" ||
  { cat "$TMP/out" "$TMP/err" >&2; die "no port URLs announced"; }
grep -q "E2B_DOMAIN=$DOMAIN" "$TMP/out" || die "the instructions do not name E2B_DOMAIN"
[ "$(getent ahostsv4 "49983-sc-0123.$DOMAIN" | awk 'NR==1 {print $1}')" = 127.0.0.1 ] ||
  die "names under $DOMAIN do not resolve to 127.0.0.1"
before_ip=$(getent ahostsv4 deb.debian.org | awk 'NR==1 {print $1}' || true)
[ -n "$before_ip" ] || die "deb.debian.org no longer resolves"

say "python: the stock e2b SDK over https://49983-<id>.$DOMAIN (system store, system resolver config)"
env -u SSL_CERT_FILE -u E2B_SANDBOX_URL E2B_API_URL=http://127.0.0.1:3000 E2B_DOMAIN="$DOMAIN" \
  E2B_API_KEY="$(cat "$DATA/admin.key")" SANDCELL_TEMPLATE="$template" \
  "$CACHE/venv/bin/python" - <<'PY'
import os
from e2b import Sandbox
sbx = Sandbox.create(template=os.environ["SANDCELL_TEMPLATE"], timeout=120)
try:
    assert sbx.sandbox_domain == "sandcell.localhost", sbx.sandbox_domain
    out = sbx.commands.run("echo over-the-port-url").stdout
    assert out == "over-the-port-url\n", out
    print("ok   a command over", f"https://49983-{sbx.sandbox_id}.sandcell.localhost")
finally:
    sbx.kill()
PY

say "stopping: the host setup is undone"
kill -TERM -- "-$serve"
for _ in $(seq 300); do kill -0 "$serve" 2>/dev/null || break; sleep 0.1; done
! kill -0 "$serve" 2>/dev/null || die "serve-local.sh did not stop"
[ "$(cat /etc/resolv.conf)" = "$resolv_before" ] || die "resolv.conf was not restored: $(cat /etc/resolv.conf)"
[ ! -e "/usr/local/share/ca-certificates/sandcell-$DOMAIN.crt" ] || die "the CA is still installed"
! ss -Hlun "src 127.77.0.53:53" | grep -q . || die "dnsmasq still listens"
echo "ok   resolv.conf, the CA store and dnsmasq as before"
