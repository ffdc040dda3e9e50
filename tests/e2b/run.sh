#!/usr/bin/env bash
# E2B SDK compatibility: the registry `e2b` packages (Python 2.63.0, npm 2.51.0), unmodified,
# against a real `sandcell serve` on loopback (gvisor runtime, temp data and run dirs).
#
# Needs root and runsc (as every gvisor test), the installed images (`make images install`,
# looked up in $SANDCELL_DATA_DIR or /var/lib/sandcell), python3 >= 3.11, node >= 20 and,
# the first time, the registries (venv and node_modules are cached under
# ~/.cache/sandcell/e2b-test/).
#
# The SDK runs commands as `/bin/bash -l -c CMD`. The template used is `base` when it is
# installed; otherwise a `minimal-bash` fixture made here from `minimal` with /bin/bash a
# two-line shim to busybox sh. Environment:
#   SANDCELL_BIN=PATH        the sandcell binary [default: cargo build -p sandcell-cli, debug]
#   SANDCELL_TEMPLATE=NAME   force a template
#   SANDCELL_E2B_AGENT=PATH  put this agent binary into the templates used (a `base` made from
#                            the installed one, else the `minimal-bash` fixture), to test an
#                            agent newer than the installed images'
#   PYTEST_ARGS="..."        extra pytest arguments (e.g. -k files)
# Exits non-zero when any test fails.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE="$ROOT/tests/e2b"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/sandcell/e2b-test"
PY_SDK=2.63.0
NPM_SDK=2.51.0
INSTALLED="${SANDCELL_DATA_DIR:-/var/lib/sandcell}"

say() { echo "==> $*" >&2; }
die() { echo "tests/e2b: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (the gvisor runtime: runsc, overlayfs, cgroups)"
command -v runsc >/dev/null || die "runsc is needed on PATH (apt install runsc)"
[ -x "$INSTALLED/images/minimal/rootfs/sbin/sandcell-agent" ] ||
    die "no installed minimal image in $INSTALLED/images (make images install)"

# --- the SDKs, cached ---
mkdir -p "$CACHE"
if [ "$(cat "$CACHE/venv/.sandcell-pins" 2>/dev/null)" != "e2b==$PY_SDK" ]; then
    say "python venv with e2b==$PY_SDK ($CACHE/venv)"
    rm -rf "$CACHE/venv"
    python3 -m venv "$CACHE/venv"
    "$CACHE/venv/bin/pip" install -q "e2b==$PY_SDK" "pytest>=8,<10" "httpx"
    echo "e2b==$PY_SDK" >"$CACHE/venv/.sandcell-pins"
fi
if [ "$(cat "$CACHE/node/.sandcell-pins" 2>/dev/null)" != "e2b@$NPM_SDK" ]; then
    say "node_modules with e2b@$NPM_SDK ($CACHE/node)"
    rm -rf "$CACHE/node"
    mkdir -p "$CACHE/node"
    (cd "$CACHE/node" && echo '{"private":true}' >package.json &&
        npm install --silent --no-audit --no-fund "e2b@$NPM_SDK" >/dev/null)
    echo "e2b@$NPM_SDK" >"$CACHE/node/.sandcell-pins"
fi

# --- the daemon ---
if [ -z "${SANDCELL_BIN:-}" ]; then
    say "cargo build -p sandcell-cli"
    (cd "$ROOT" && nice cargo build -q -p sandcell-cli)
    SANDCELL_BIN="$ROOT/target/debug/sandcell"
fi

TMP=$(mktemp -d /tmp/sc-e2b.XXXXXX)
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
        echo "tests/e2b: mounts left under $TMP; not removing it" >&2
    else
        rm -rf "$TMP"
    fi
}
trap cleanup EXIT

mkdir -p "$DATA/images"
ln -s "$INSTALLED/images/minimal" "$DATA/images/minimal"
[ -d "$INSTALLED/kernels" ] && ln -s "$INSTALLED/kernels" "$DATA/kernels"
if [ -d "$INSTALLED/images/base" ] && [ -n "${SANDCELL_E2B_AGENT:-}" ]; then
    # The installed base tree with this agent: hard links where the file system allows
    # (the gvisor runtime only ever reads the image tree: writes go to an overlay), and the
    # agent a new file, never written through a link.
    say "base fixture with agent $SANDCELL_E2B_AGENT"
    mkdir -p "$DATA/images/base"
    cp -al "$INSTALLED/images/base/rootfs" "$DATA/images/base/rootfs" 2>/dev/null ||
        cp -a "$INSTALLED/images/base/rootfs" "$DATA/images/base/rootfs"
    rm -f "$DATA/images/base/rootfs/sbin/sandcell-agent"
    install -m 755 "$SANDCELL_E2B_AGENT" "$DATA/images/base/rootfs/sbin/sandcell-agent"
elif [ -d "$INSTALLED/images/base" ]; then
    ln -s "$INSTALLED/images/base" "$DATA/images/base"
fi
FIXTURE="$DATA/images/minimal-bash"
mkdir -p "$FIXTURE"
cp -a "$INSTALLED/images/minimal/rootfs" "$FIXTURE/rootfs"
if [ ! -e "$FIXTURE/rootfs/bin/bash" ]; then
    printf '#!/bin/sh\nexec /bin/sh "$@"\n' >"$FIXTURE/rootfs/bin/bash"
    chmod 755 "$FIXTURE/rootfs/bin/bash"
fi
if [ -n "${SANDCELL_E2B_AGENT:-}" ]; then
    install -m 755 "$SANDCELL_E2B_AGENT" "$FIXTURE/rootfs/sbin/sandcell-agent"
fi
if [ -z "${SANDCELL_TEMPLATE:-}" ]; then
    if [ -d "$DATA/images/base" ]; then SANDCELL_TEMPLATE=base; else SANDCELL_TEMPLATE=minimal-bash; fi
fi
export SANDCELL_TEMPLATE

say "sandcell serve (gvisor, data dir $DATA, template $SANDCELL_TEMPLATE)"
"$SANDCELL_BIN" serve --data-dir "$DATA" --listen 127.0.0.1:0 --runtime gvisor --kill-on-exit ${SANDCELL_SERVE_ARGS:-} \
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

export E2B_API_URL="$URL" E2B_SANDBOX_URL="$URL"
E2B_API_KEY=$(cat "$DATA/admin.key")
export E2B_API_KEY
SANDCELL_LIMITED_KEY=$("$SANDCELL_BIN" keys --data-dir "$DATA" create --name limited --max-sandboxes 1 2>/dev/null)
SANDCELL_OTHER_KEY=$("$SANDCELL_BIN" keys --data-dir "$DATA" create --name other 2>/dev/null)
export SANDCELL_LIMITED_KEY SANDCELL_OTHER_KEY

status=0
# The snapshot suites restore gVisor checkpoints: now and then a restored sandbox's agent
# never answers (a runsc defect; the daemon retries restores, but not forever). They run a
# second time when the first run fails, and say so (FLAKY) in the log; two failures fail.
retry_once() {
    local what=$1; shift
    "$@" && return 0
    echo "==> FLAKY? $what failed once; running it again" >&2
    "$@"
}
say "python: pytest tests/e2b/test_sdk.py (e2b $PY_SDK)"
"$CACHE/venv/bin/python" -m pytest -q -p no:cacheprovider "$HERE/test_sdk.py" ${PYTEST_ARGS:-} || status=1
say "python: pytest tests/e2b/test_secrets.py (e2b $PY_SDK)"
"$CACHE/venv/bin/python" -m pytest -q -p no:cacheprovider "$HERE/test_secrets.py" ${PYTEST_ARGS:-} || status=1
say "python: pytest tests/e2b/test_template.py (e2b $PY_SDK)"
"$CACHE/venv/bin/python" -m pytest -q -p no:cacheprovider "$HERE/test_template.py" ${PYTEST_ARGS:-} || status=1
say "python: pytest tests/e2b/test_snapshots.py (e2b $PY_SDK)"
retry_once test_snapshots.py "$CACHE/venv/bin/python" -m pytest -q -p no:cacheprovider \
    "$HERE/test_snapshots.py" ${PYTEST_ARGS:-} || status=1
say "node: tests/e2b/sdk.cjs (e2b $NPM_SDK)"
NODE_PATH="$CACHE/node/node_modules" node "$HERE/sdk.cjs" || status=1
say "node: tests/e2b/secrets.cjs (e2b $NPM_SDK)"
NODE_PATH="$CACHE/node/node_modules" node "$HERE/secrets.cjs" || status=1
say "node: tests/e2b/template.cjs (e2b $NPM_SDK)"
NODE_PATH="$CACHE/node/node_modules" node "$HERE/template.cjs" || status=1
say "node: tests/e2b/snapshots.cjs (e2b $NPM_SDK)"
retry_once snapshots.cjs env NODE_PATH="$CACHE/node/node_modules" node "$HERE/snapshots.cjs" || status=1

# The secrets suites' values all start so: none may reach the daemon's log.
if grep -qE 'sk-(py|js)-' "$TMP/serve.err"; then
    echo "tests/e2b: a secret value is in the daemon's log" >&2
    status=1
fi
if [ "$status" != 0 ]; then
    echo "---- daemon stderr (last 40 lines) ----" >&2
    tail -n 40 "$TMP/serve.err" >&2
fi
exit "$status"
