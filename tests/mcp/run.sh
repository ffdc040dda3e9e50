#!/usr/bin/env bash
# The MCP server (crates/mcp) with real MCP clients: the official Python SDK (PyPI `mcp`,
# pinned below) over stdio (`sandcell mcp`) and over streamable HTTP (the daemon's /mcp),
# then the MCP Inspector's CLI mode (npm @modelcontextprotocol/inspector, tests/mcp/
# inspector.sh), against a real `sandcell serve` on loopback (gvisor runtime, temp data and
# run dirs).
#
# Needs root and runsc (as every gvisor test), the installed images (`make images install`,
# looked up in $SANDCELL_DATA_DIR or /var/lib/sandcell), python3 >= 3.10, node >= 20 and,
# the first time, PyPI and npm (venv and node_modules are cached under
# ~/.cache/sandcell/mcp-test/, keyed by the pins).
# Environment:
#   SANDCELL_BIN=PATH        the sandcell binary [default: cargo build -p sandcell-cli, debug]
#   SANDCELL_TEMPLATE=NAME   the template [default: base, else minimal]
#   PYTEST_ARGS="..."        extra pytest arguments (e.g. -k cancel)
# Exits non-zero when any test fails.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/tests/mcp"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sandcell/mcp-test"
PINS="mcp==2.3.0 pytest==9.2.0"
NPM_PIN="@modelcontextprotocol/inspector@2.12.0"
INSTALLED="${SANDCELL_DATA_DIR:-/var/lib/sandcell}"

say() { echo "==> $*" >&2; }
die() { echo "tests/mcp: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (the gvisor runtime: runsc, overlayfs, cgroups)"
command -v runsc >/dev/null || die "runsc is needed on PATH (apt install runsc)"
[ -x "$INSTALLED/images/minimal/rootfs/sbin/sandcell-agent" ] ||
    die "no installed minimal image in $INSTALLED/images (make images install)"

# --- the client, cached ---
mkdir -p "$CACHE"
if [ "$(cat "$CACHE/venv/.sandcell-pins" 2>/dev/null)" != "$PINS" ]; then
    say "python venv with $PINS ($CACHE/venv)"
    rm -rf "$CACHE/venv"
    python3 -m venv "$CACHE/venv"
    # shellcheck disable=SC2086
    "$CACHE/venv/bin/pip" install -q $PINS
    echo "$PINS" >"$CACHE/venv/.sandcell-pins"
fi

if [ "$(cat "$CACHE/node/.sandcell-pins" 2>/dev/null)" != "$NPM_PIN" ]; then
    say "node_modules with $NPM_PIN ($CACHE/node)"
    rm -rf "$CACHE/node"
    mkdir -p "$CACHE/node"
    (cd "$CACHE/node" && echo '{"private":true}' >package.json &&
        npm install --silent --no-audit --no-fund "$NPM_PIN" >/dev/null)
    echo "$NPM_PIN" >"$CACHE/node/.sandcell-pins"
fi

# --- the daemon ---
if [ -z "${SANDCELL_BIN:-}" ]; then
    say "cargo build -p sandcell-cli"
    (cd "$ROOT" && nice cargo build -q -p sandcell-cli)
    SANDCELL_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/sandcell"
fi
export SANDCELL_BIN

TMP=$(mktemp -d /tmp/sc-mcp.XXXXXX)
DATA="$TMP/data"
export SANDCELL_RUN_DIR="$TMP/run"
DAEMON_PID=
cleanup() {
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -TERM "$DAEMON_PID" 2>/dev/null || true
        for _ in $(seq 100); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$DAEMON_PID" 2>/dev/null || true
    fi
    # Never remove a tree that still has a sandbox's mount in it.
    if grep -q " $TMP/" /proc/mounts; then
        echo "tests/mcp: mounts left under $TMP; not removing it" >&2
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT

mkdir -p "$DATA/images"
ln -s "$INSTALLED/images/minimal" "$DATA/images/minimal"
[ -d "$INSTALLED/kernels" ] && ln -s "$INSTALLED/kernels" "$DATA/kernels"
[ -d "$INSTALLED/images/base" ] && ln -s "$INSTALLED/images/base" "$DATA/images/base"
if [ -z "${SANDCELL_TEMPLATE:-}" ]; then
    if [ -d "$DATA/images/base" ]; then SANDCELL_TEMPLATE=base; else SANDCELL_TEMPLATE=minimal; fi
fi
export SANDCELL_TEMPLATE

say "sandcell serve (gvisor, data dir $DATA, template $SANDCELL_TEMPLATE)"
"$SANDCELL_BIN" serve --data-dir "$DATA" --listen 127.0.0.1:0 --runtime gvisor --kill-on-exit \
    >"$TMP/serve.out" 2>"$TMP/serve.err" &
DAEMON_PID=$!
URL=
for _ in $(seq 300); do
    URL=$(sed -n 's/^sandcell serve: listening on //p' "$TMP/serve.out")
    [ -n "$URL" ] && break
    kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$TMP/serve.err" >&2; die "the daemon exited"; }
    sleep 0.1
done
[ -n "$URL" ] || die "the daemon did not report its address; stderr: $(cat "$TMP/serve.err")"

export SANDCELL_URL="$URL"
SANDCELL_KEY_A=$("$SANDCELL_BIN" keys --data-dir "$DATA" create --name a 2>/dev/null)
SANDCELL_KEY_B=$("$SANDCELL_BIN" keys --data-dir "$DATA" create --name b 2>/dev/null)
export SANDCELL_KEY_A SANDCELL_KEY_B
# `sandcell mcp` must not fall back to the admin key of some other data dir.
export SANDCELL_DATA_DIR="$DATA"

status=0
say "python: pytest tests/mcp/test_mcp.py ($PINS)"
# shellcheck disable=SC2086
"$CACHE/venv/bin/python" -m pytest -q -p no:cacheprovider "$HERE/test_mcp.py" ${PYTEST_ARGS:-} || status=1
say "node: tests/mcp/inspector.sh ($NPM_PIN)"
INSPECTOR="$CACHE/node/node_modules/.bin/mcp-inspector" PY="$CACHE/venv/bin/python" \
    "$HERE/inspector.sh" || status=1

if [ "$status" != 0 ]; then
    echo "---- daemon stderr (last 40 lines) ----" >&2
    tail -n 40 "$TMP/serve.err" >&2
fi
exit "$status"
