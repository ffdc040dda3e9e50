#!/usr/bin/env bash
# What secrets injection (issue 17) adds to a request from a sandbox namespace. Plain HTTP:
# the domain rule alone (the Host/SNI proxy), the same with a `network.rules` transform
# (the inject relay, resolver answering at once), and the host straight to the server (the
# floor); HTTPS: the domain rule alone (SNI checked, TLS passed through: the peer
# reference) and with a transform (TLS intercepted with the egress CA, the host's own TLS to
# the upstream); p50/p90/p99 over alternating blocks (crates/net/examples/bench_inject.rs).
# Needs root, iproute2, nftables, dnsmasq and python3. Writes bench/net/inject-results.json.
#
#   bench/net/inject.sh [--runs N] [--debug]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=400 profile=release
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --debug) profile=debug; shift ;;
    *) echo "usage: $0 [--runs N] [--debug]" >&2; exit 2 ;;
  esac
done
cd "$root"
flag=--release; [ "$profile" = debug ] && flag=
cargo build $flag -q -p sandcell-net --example bench_inject
target=${CARGO_TARGET_DIR:-$root/target}
"$target/$profile/examples/bench_inject" --runs "$runs" | tee bench/net/inject-results.json
