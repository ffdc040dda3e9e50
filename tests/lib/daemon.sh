# shellcheck shell=bash
# What the suites that drive a real `sandcell serve` share (tests/e2b, tests/attacks,
# tests/mcp): the binary, a temp data and run dir with the installed images linked in, the
# daemon on a loopback port, and a cleanup that never removes a tree with a mount left in it.
#
# Source it after setting ROOT (the checkout) and defining `say` and `die`. It reads
# SANDCELL_BIN (default: `cargo build -p sandcell-cli`, debug, in $CARGO_TARGET_DIR or
# target/), SANDCELL_DATA_DIR (where the images are installed; default /var/lib/sandcell)
# and SANDCELL_SERVE_ARGS (extra `serve` flags, to run a suite against another setup).

INSTALLED="${SANDCELL_DATA_DIR:-/var/lib/sandcell}"
DAEMON_PID=
# Functions the cleanup calls first (a suite's own servers and namespaces).
SC_CLEANUP_HOOKS=()

# Root and runsc: every gvisor suite needs both.
sc_require_gvisor() {
    [ "$(id -u)" = 0 ] || die "needs root (the gvisor runtime: runsc, overlayfs, cgroups)"
    command -v runsc >/dev/null || die "runsc is needed on PATH (apt install runsc)"
    [ -x "$INSTALLED/images/minimal/rootfs/sbin/sandcell-agent" ] ||
        die "no installed minimal image in $INSTALLED/images (make images install)"
}

# The e2b Python SDK venv (with pytest, httpx, and the code interpreter's and the desktop's
# SDKs, which pin e2b ranges of their own) in $1, pinned to e2b==$2; made once.
E2B_CODE_INTERPRETER_SDK=2.11.5
E2B_DESKTOP_SDK=2.7.2
sc_e2b_venv() {
    local venv=$1 sdk=$2
    local pins="e2b==$sdk e2b-code-interpreter==$E2B_CODE_INTERPRETER_SDK e2b-desktop==$E2B_DESKTOP_SDK"
    if [ "$(cat "$venv/.sandcell-pins" 2>/dev/null)" != "$pins" ]; then
        say "python venv with $pins ($venv)"
        rm -rf "$venv"
        mkdir -p "$(dirname "$venv")"
        python3 -m venv "$venv"
        # shellcheck disable=SC2086
        "$venv/bin/pip" install -q $pins "pytest>=8,<10" "httpx"
        echo "$pins" >"$venv/.sandcell-pins"
    fi
}

# SANDCELL_BIN, built when not given.
sc_bin() {
    if [ -z "${SANDCELL_BIN:-}" ]; then
        say "cargo build -p sandcell-cli"
        (cd "$ROOT" && nice cargo build -q -p sandcell-cli)
        SANDCELL_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/debug/sandcell"
    fi
    export SANDCELL_BIN
}

sc_cleanup() {
    local hook
    if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
        kill -TERM "$DAEMON_PID" 2>/dev/null || true
        # A minute, as a service manager would give: the daemon's kills wait for a snapshot
        # under way (a template's first snapshot, taken in the background after its first
        # create, can take tens of seconds on a loaded host); killed before, it leaves that
        # sandbox's mounts for its next start to sweep, and this tree could not be removed.
        for _ in $(seq 600); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$DAEMON_PID" 2>/dev/null || true
    fi
    for hook in "${SC_CLEANUP_HOOKS[@]}"; do "$hook" || true; done
    # Never remove a tree that still has a sandbox's mount in it.
    if grep -q " $TMP/" /proc/mounts; then
        echo "$0: mounts left under $TMP; not removing it" >&2
    else
        rm -rf "$TMP"
    fi
}

# TMP (mktemp -d /tmp/$1.XXXXXX), DATA=$TMP/data with the installed minimal and base images
# and kernels linked in, SANDCELL_RUN_DIR=$TMP/run; the cleanup on exit.
sc_tmp() {
    TMP=$(mktemp -d "/tmp/$1.XXXXXX")
    DATA="$TMP/data"
    export SANDCELL_RUN_DIR="$TMP/run"
    trap sc_cleanup EXIT
    mkdir -p "$DATA/images"
    ln -s "$INSTALLED/images/minimal" "$DATA/images/minimal"
    if [ -d "$INSTALLED/kernels" ]; then ln -s "$INSTALLED/kernels" "$DATA/kernels"; fi
}

# Links the installed base image into DATA (when there is one).
sc_link_base() {
    if [ -d "$INSTALLED/images/base" ]; then ln -s "$INSTALLED/images/base" "$DATA/images/base"; fi
}

# Starts `sandcell serve` (gvisor, DATA, a free port on SC_LISTEN_IP, default 127.0.0.1)
# with "$@" and SANDCELL_SERVE_ARGS; URL once it listens, DAEMON_PID. Its output:
# $TMP/serve.{out,err}.
sc_serve() {
    say "sandcell serve (gvisor, data dir $DATA${SANDCELL_SERVE_ARGS:+, $SANDCELL_SERVE_ARGS})"
    # made here: the daemon's shell opens them after `&`, maybe after the first read below
    : >"$TMP/serve.out"
    : >"$TMP/serve.err"
    # shellcheck disable=SC2086
    "$SANDCELL_BIN" serve --data-dir "$DATA" --listen "${SC_LISTEN_IP:-127.0.0.1}:0" \
        --runtime gvisor --kill-on-exit \
        "$@" ${SANDCELL_SERVE_ARGS:-} >"$TMP/serve.out" 2>"$TMP/serve.err" &
    DAEMON_PID=$!
    URL=
    for _ in $(seq 300); do
        URL=$(sed -n 's/^sandcell serve: listening on //p' "$TMP/serve.out")
        [ -n "$URL" ] && break
        kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$TMP/serve.err" >&2; die "the daemon exited"; }
        sleep 0.1
    done
    [ -n "$URL" ] || die "the daemon did not report its address; stderr: $(cat "$TMP/serve.err")"
}

# A new API key named $1 (further `keys create` flags after it), printed.
sc_key() {
    "$SANDCELL_BIN" keys --data-dir "$DATA" create --name "$@" 2>/dev/null
}

# The end of the daemon's log, when a suite failed.
sc_daemon_log() {
    echo "---- daemon stderr (last 40 lines) ----" >&2
    tail -n 40 "$TMP/serve.err" >&2
}

# The templates the e2b SDK suites use, in DATA (after sc_tmp): the installed `base` (with
# SANDCELL_E2B_AGENT put in, when set), and `minimal-bash`, `minimal` with /bin/bash a shim
# to busybox sh (the SDK runs commands with `bash -l -c`). SANDCELL_TEMPLATE: the one to
# use (base when installed), unless set.
sc_e2b_templates() {
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
    # The code interpreter's and the desktop's templates (the e2b-code-interpreter and
    # e2b-desktop SDKs' defaults), as installed.
    for t in code-interpreter-v1 desktop; do
        if [ -d "$INSTALLED/images/$t" ]; then ln -s "$INSTALLED/images/$t" "$DATA/images/$t"; fi
    done
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
}
