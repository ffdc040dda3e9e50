#!/bin/sh
# The real E2B Python SDK against a freshly built agent on 127.0.0.1:49983 (SDK debug mode).
# Needs network for `pip install e2b` the first time. Not part of `cargo test`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../../.." && pwd)
venv=${E2B_VENV:-/tmp/e2b-sdk-venv}
[ -x "$venv/bin/python" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q "e2b==${E2B_VERSION:-2.63.0}"; }
cargo build -q -p sandcell-agent --manifest-path "$root/Cargo.toml"
"$root/target/debug/sandcell-agent" --listen tcp:127.0.0.1:49983 &
agent=$!
trap 'kill $agent' EXIT
sleep 0.5
"$venv/bin/python" "$here/e2b_debug_smoke.py"
