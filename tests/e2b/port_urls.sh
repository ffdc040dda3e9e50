#!/usr/bin/env bash
# HTTPS port URLs (`serve --domain`): the registry `e2b` Python SDK, unmodified, with
# E2B_DOMAIN and no E2B_SANDBOX_URL, so that envd and a sandbox's own port are reached at
# https://<port>-<sandboxID>.<domain> on port 443, as against E2B's cloud. The daemon gets a
# loopback address of its own (127.x.y.1, where port 443 is free), its names resolve
# through /etc/hosts lines the tests add and remove per sandbox, and its certificate is
# trusted through its CA (SSL_CERT_FILE for the SDK, an ssl context for httpx).
#
# Run by tests/e2b/run.sh; alone: needs what run.sh needs (root, runsc, the installed
# images). PY_SDK: the e2b version [default: run.sh's]; PYTEST_ARGS as in run.sh.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/tests/e2b"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sandcell/e2b-test"
PY_SDK=${PY_SDK:-$(sed -n 's/^PY_SDK=\([0-9.]*\)$/\1/p' "$HERE/run.sh")}
DOMAIN=sandcell-https.test

say() { echo "==> $*" >&2; }
die() { echo "tests/e2b/port_urls: $*" >&2; exit 1; }

# shellcheck source=tests/lib/daemon.sh
. "$ROOT/tests/lib/daemon.sh"
sc_require_gvisor
sc_e2b_venv "$CACHE/venv" "$PY_SDK"
sc_bin
sc_tmp sc-e2b-https
# The app in the sandbox is busybox `nc -ll -e` (test_port_urls.py): the minimal fixture has
# it; base's Debian netcat takes other flags.
SANDCELL_TEMPLATE=minimal-bash
sc_e2b_templates
SC_LISTEN_IP="127.$((RANDOM % 200 + 20)).$((RANDOM % 250 + 1)).1"
sc_serve --domain "$DOMAIN" --https-port 443
grep -q "port URLs on https://<port>-<sandboxID>.$DOMAIN:443$" "$TMP/serve.err" ||
    die "the daemon did not report its HTTPS port: $(cat "$TMP/serve.err")"
CA="$DATA/tls/ca.pem"
grep -q "trust $CA\$" "$TMP/serve.err" || die "the daemon did not say where its CA is"
[ "$(stat -c %a "$DATA/tls/ca.key")" = 600 ] || die "the CA key is not 0600"

status=0
[ -d "$DATA/images/desktop" ] || {
    echo "tests/e2b/port_urls: desktop is not installed in $INSTALLED (make images install)" >&2
    status=1
}
# One process per test: the SDK's resolver (pyqwest's, not the system's) reads /etc/hosts
# once, when its first request resolves a name, so a process sees the lines of its first
# sandbox only. test_novnc_browser.py: the desktop's stream in headless Chromium.
for file in test_port_urls.py test_novnc_browser.py; do
    for t in $(sed -n 's/^def \(test_[a-z_]*\)(.*/\1/p' "$HERE/$file"); do
        say "python: pytest tests/e2b/$file::$t (e2b $PY_SDK, https://*.$DOMAIN on $SC_LISTEN_IP:443)"
        # shellcheck disable=SC2086
        env -u E2B_SANDBOX_URL E2B_API_URL="$URL" E2B_DOMAIN="$DOMAIN" \
            E2B_API_KEY="$(cat "$DATA/admin.key")" SSL_CERT_FILE="$CA" SANDCELL_CA="$CA" \
            SANDCELL_HTTPS_IP="$SC_LISTEN_IP" "$CACHE/venv/bin/python" -m pytest -q \
            -p no:cacheprovider "$HERE/$file::$t" ${PYTEST_ARGS:-} || {
            # 5: PYTEST_ARGS (-k ...) selected none of this file
            rc=$?
            [ "$rc" = 5 ] || status=1
        }
    done
done
if [ "$status" != 0 ]; then sc_daemon_log; fi
exit "$status"
