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

say() { echo "==> $*" >&2; }
die() { echo "tests/mcp: $*" >&2; exit 1; }

# shellcheck source=tests/lib/daemon.sh
. "$ROOT/tests/lib/daemon.sh"
sc_require_gvisor

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
sc_bin
sc_tmp sc-mcp
sc_link_base
# The computer tools' test drives a `desktop` sandbox (fails, saying so, when not installed).
if [ -d "$INSTALLED/images/desktop" ]; then ln -s "$INSTALLED/images/desktop" "$DATA/images/desktop"; fi
if [ -z "${SANDCELL_TEMPLATE:-}" ]; then
    if [ -d "$DATA/images/base" ]; then SANDCELL_TEMPLATE=base; else SANDCELL_TEMPLATE=minimal; fi
fi
export SANDCELL_TEMPLATE
sc_serve

export SANDCELL_URL="$URL"
SANDCELL_KEY_A=$(sc_key a)
SANDCELL_KEY_B=$(sc_key b)
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

if [ "$status" != 0 ]; then sc_daemon_log; fi
exit "$status"
