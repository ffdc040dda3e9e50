#!/usr/bin/env bash
# The attack suite (issue 12): what a hostile tenant or a hostile guest would try against a
# real `sandcell serve` (gvisor runtime, loopback, temp data and run dirs), each attack
# asserting that it got nothing and that the daemon and another tenant's sandbox still work.
#
# Set up here, for the attacks (tests/attacks/test_*.py, fixtures in conftest.py):
#   - keys: the admin key, and two ordinary tenants A and B (`sandcell keys create`);
#   - a fake internet in netns sca-inet on TEST-NET-3 (203.0.113.0/24, behind veth sca-h):
#     HTTP "pub-ok" on 203.0.113.10:80 and :8080, dnsmasq on 203.0.113.53 (the daemon's
#     --net-dns) with zone bars.test: pub -> 203.0.113.10, loop -> 127.0.0.1,
#     meta -> 169.254.169.254, pool -> 10.213.0.2 (inside the daemon's --net-pool),
#     zero -> 0.0.0.0, host -> 203.0.113.1 (the host's own end of the veth); a recording
#     HTTP upstream on 203.0.113.20:80 and :8080 (names api and other: tests/attacks/
#     recorder.py, every request's headers in $ATTACK_RECORDS) for the secrets injection,
#     and its HTTPS side on :443 (a CA of its own, given to the daemon, which intercepts TLS
#     to rule domains by default);
#   - a canary: an HTTP service of the host on 0.0.0.0:$CANARY_PORT whose every answer holds
#     $CANARY. No sandbox may ever read it.
# Needs root, runsc, dnsmasq, the installed images (as tests/e2b/run.sh) and the e2b venv
# that tests/e2b/run.sh caches (made here when missing). Environment: SANDCELL_BIN (default:
# cargo build -p sandcell-cli, debug), PYTEST_ARGS. Prints `attacks: N tried, 0 got through`.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/tests/attacks"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sandcell/e2b-test"
PY_SDK=2.63.0
NETNS=sca-inet
HOST_IF=sca-h
INET_IF=sca-i

say() { echo "==> $*" >&2; }
die() { echo "tests/attacks: $*" >&2; exit 1; }

# shellcheck source=tests/lib/daemon.sh
. "$ROOT/tests/lib/daemon.sh"
sc_require_gvisor
command -v dnsmasq >/dev/null || die "dnsmasq is needed (apt install dnsmasq-base)"
[ -d "$INSTALLED/images/base/rootfs" ] || die "no installed base image in $INSTALLED/images (make images install)"
# One run per host at a time: the fake internet has fixed names and addresses.
exec 9>/run/sandcell-attacks.lock
flock 9

sc_e2b_venv "$CACHE/venv" "$PY_SDK"
sc_bin
sc_tmp sc-attacks
chmod 755 "$TMP"
PIDS=()
fake_internet_down() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    ip netns delete "$NETNS" 2>/dev/null || true
    ip link delete "$HOST_IF" 2>/dev/null || true
}
SC_CLEANUP_HOOKS+=(fake_internet_down)

# --- the fake internet ---
ip netns delete "$NETNS" 2>/dev/null || true
ip link delete "$HOST_IF" 2>/dev/null || true
ip netns add "$NETNS"
ip link add "$HOST_IF" type veth peer name "$INET_IF" netns "$NETNS"
ip addr add 203.0.113.1/24 dev "$HOST_IF"
ip link set "$HOST_IF" up
for a in 203.0.113.2 203.0.113.10 203.0.113.20 203.0.113.53; do ip -n "$NETNS" addr add "$a/24" dev "$INET_IF"; done
ip -n "$NETNS" link set "$INET_IF" up
ip -n "$NETNS" link set lo up
ip -n "$NETNS" route add default via 203.0.113.1
mkdir -p "$TMP/www"
echo pub-ok >"$TMP/www/index.html"
for port in 80 8080; do
    (cd "$TMP/www" && exec ip netns exec "$NETNS" python3 -m http.server --bind 203.0.113.10 "$port" \
        >/dev/null 2>&1) &
    PIDS+=($!)
done
RECORDS="$TMP/recorded.jsonl"
: >"$RECORDS"
for port in 80 8080; do
    ip netns exec "$NETNS" python3 "$HERE/recorder.py" 203.0.113.20 "$port" "$RECORDS" >/dev/null 2>&1 &
    PIDS+=($!)
done
# Its HTTPS side on :443, with a CA of its own that only the daemon is given
# (--egress-extra-ca): the sandbox trusts it not, so only TLS the daemon intercepts verifies.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=bars-test-upstream-ca -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$TMP/upstream-ca.key" -out "$TMP/upstream-ca.pem" 2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj /CN=api.bars.test -keyout "$TMP/upstream.key" -out "$TMP/upstream.csr" 2>/dev/null
printf 'subjectAltName=DNS:api.bars.test,DNS:other.bars.test\nextendedKeyUsage=serverAuth\n' \
    >"$TMP/upstream.ext"
openssl x509 -req -in "$TMP/upstream.csr" -CA "$TMP/upstream-ca.pem" -CAkey "$TMP/upstream-ca.key" \
    -CAcreateserial -days 2 -extfile "$TMP/upstream.ext" -out "$TMP/upstream.pem" 2>/dev/null
ip netns exec "$NETNS" python3 "$HERE/recorder.py" 203.0.113.20 443 "$RECORDS" \
    "$TMP/upstream.pem" "$TMP/upstream.key" >/dev/null 2>&1 &
PIDS+=($!)
ip netns exec "$NETNS" dnsmasq --keep-in-foreground --conf-file=/dev/null --no-resolv --no-hosts \
    --bind-interfaces --listen-address=203.0.113.53 --pid-file= --user=root --local-ttl=5 \
    --address=/pub.bars.test/203.0.113.10 --address=/loop.bars.test/127.0.0.1 \
    --address=/meta.bars.test/169.254.169.254 --address=/pool.bars.test/10.213.0.2 \
    --address=/zero.bars.test/0.0.0.0 --address=/host.bars.test/203.0.113.1 \
    --address=/api.bars.test/203.0.113.20 --address=/other.bars.test/203.0.113.20 \
    >/dev/null 2>&1 &
PIDS+=($!)

# --- the canary: a host service no sandbox may read ---
CANARY="canary-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
CANARY_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 - "$CANARY" "$CANARY_PORT" >/dev/null 2>&1 <<'PY' &
import http.server, sys
canary, port = sys.argv[1].encode(), int(sys.argv[2])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", str(len(canary))); self.end_headers()
        self.wfile.write(canary)
    do_POST = do_GET
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("0.0.0.0", port), H).serve_forever()
PY
PIDS+=($!)
for _ in $(seq 100); do
    curl -fsS "http://127.0.0.1:$CANARY_PORT/" 2>/dev/null | grep -q "$CANARY" && break
    sleep 0.1
done
curl -fsS "http://127.0.0.1:$CANARY_PORT/" | grep -q "$CANARY" || die "the canary service did not start"
for _ in $(seq 100); do
    ip netns exec "$NETNS" true && curl -fsS --max-time 1 http://203.0.113.10/ 2>/dev/null | grep -q pub-ok && break
    sleep 0.1
done
curl -fsS --max-time 2 http://203.0.113.10/ | grep -q pub-ok || die "the fake internet's HTTP server did not start"
for _ in $(seq 100); do
    curl -fsS --max-time 1 http://203.0.113.20:8080/ready >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS --max-time 2 http://203.0.113.20:8080/ready >/dev/null || die "the recording upstream did not start"
for _ in $(seq 100); do
    curl -fsS --max-time 1 --cacert "$TMP/upstream-ca.pem" --resolve api.bars.test:443:203.0.113.20 \
        https://api.bars.test/ready >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fsS --max-time 2 --cacert "$TMP/upstream-ca.pem" --resolve api.bars.test:443:203.0.113.20 \
    https://api.bars.test/ready >/dev/null || die "the recording upstream's HTTPS side did not start"

# --- the daemon ---
sc_link_base
sc_serve --disk-mib 1024 --build-disk-mib 512 --net-dns 203.0.113.53 --net-pool 10.213.0.0/16 \
    --egress-extra-ca "$TMP/upstream-ca.pem"

ADMIN_KEY=$(cat "$DATA/admin.key")
KEY_A=$(sc_key tenant-a)
KEY_B=$(sc_key tenant-b)
export ATTACK_URL="$URL" ATTACK_DATA_DIR="$DATA" ATTACK_RUN_DIR="$SANDCELL_RUN_DIR" \
    ATTACK_BIN="$SANDCELL_BIN" ATTACK_ADMIN_KEY="$ADMIN_KEY" ATTACK_KEY_A="$KEY_A" \
    ATTACK_KEY_B="$KEY_B" ATTACK_CANARY="$CANARY" ATTACK_CANARY_PORT="$CANARY_PORT" \
    ATTACK_TEMPLATE=base ATTACK_DAEMON_LOG="$TMP/serve.err" ATTACK_DAEMON_PID="$DAEMON_PID" \
    ATTACK_RECORDS="$RECORDS"
export E2B_API_URL="$URL" E2B_SANDBOX_URL="$URL" E2B_API_KEY="$KEY_A"

say "pytest tests/attacks"
status=0
"$CACHE/venv/bin/python" -m pytest -q -p no:cacheprovider "$HERE" ${PYTEST_ARGS:-} || status=1
if [ "$status" != 0 ]; then sc_daemon_log; fi
exit "$status"
