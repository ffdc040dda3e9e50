#!/usr/bin/env bash
# What `egressProxy` (issue 17) adds to a TCP request from a sandbox namespace: an HTTP GET
# on a new connection to the fake internet, direct (nftables forwards it: the reference)
# and through the egress proxy path (nftables DNAT to the gateway proxy, which dials pproxy
# 2.7.9 with a SOCKS5 login), plus the host through pproxy alone; p50/p90/p99 over
# alternating blocks (crates/net/examples/bench_egress_proxy.rs). Needs root, iproute2,
# nftables, dnsmasq and python3. Writes bench/net/egress-proxy-results.json.
#
#   bench/net/egress-proxy.sh [--runs N] [--debug]
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
cargo build $flag -q -p sandcell-net --example bench_egress_proxy
target=${CARGO_TARGET_DIR:-$root/target}
"$target/$profile/examples/bench_egress_proxy" --runs "$runs" | tee bench/net/egress-proxy-results.json
