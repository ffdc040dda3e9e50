#!/usr/bin/env bash
# Sandbox networks: what a network costs and what it adds to a create.
#  - network: SandboxNet create/teardown (not pooled), a pooled take with the default
#    rules and with rules (crates/net/examples/bench_net.rs);
#  - create: POST /sandboxes until the sandbox answers, then DELETE, through a daemon with
#    --no-network and one with networks (warm pool of 2), p50/p90 over N sequential runs;
#  - throughput: iperf3 TCP (one stream) and ping RTT from a sandbox's namespace through
#    its veth and nftables to a server in the fake internet, and from the host's namespace
#    straight to it (the peer baseline), p50/p90/p99 (crates/net/examples/bench_throughput.rs);
#  - gvisor_throughput: the same path from inside a real gVisor sandbox of the daemon
#    (`base` image; runsc's netstack on top): a Python client sending 256 MiB to a byte
#    sink in the fake internet, timed inside; the host's namespace running the same client
#    to the same sink is the baseline (a Python sink: it caps both); ping where gVisor
#    allows it (runsc's default --net-raw=false does not: "unavailable").
# Needs root, runsc, iproute2, nftables, dnsmasq, python3, iperf3 and ping
# (apt-get install iperf3 iputils-ping) and the installed minimal and base images.
# Writes bench/net/results.json.
#
#   bench/net/run.sh [--runs N] [--debug] [--data-dir D]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=20 profile=release
data=${SANDCELL_DATA_DIR:-/var/lib/sandcell}
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --debug) profile=debug; shift ;;
    --data-dir) data=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N] [--debug] [--data-dir D]" >&2; exit 2 ;;
  esac
done
cd "$root"
flag=--release; [ "$profile" = debug ] && flag=
cargo build $flag -q -p sandcell-net --example bench_net --example bench_throughput
cargo build $flag -q -p sandcell-server --bin sandcell-serve
cargo build $flag -q -p sandcell-cli --bin sandcell
bin=target/$profile
tmp=$(mktemp -d /tmp/sc-bench-net.XXXXXX)
pids=()
hold_pid=
cleanup() {
  # The daemons first (they hold copies of fd 7), then the fake internet's holder, by
  # closing its stdin: it removes what it made.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  if [ -n "$hold_pid" ]; then exec 7>&-; wait "$hold_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
"$bin/examples/bench_net" --runs "$runs" > "$tmp/network.json"
"$bin/examples/bench_throughput" --runs "$(( runs < 5 ? runs : 5 ))" > "$tmp/throughput.json"
# The fake internet again, held up while the daemons run (for gvisor_throughput).
mkfifo "$tmp/hold"
"$bin/examples/bench_throughput" --hold < "$tmp/hold" > "$tmp/hold.out" &
hold_pid=$!
exec 7> "$tmp/hold" # the holder tears the fake internet down when this closes
for _ in $(seq 300); do grep -q ready "$tmp/hold.out" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$tmp/hold.out" || { echo "the fake internet did not come up" >&2; exit 1; }

# One daemon per mode, each with its own data dir (the image linked in).
start() { # name extra-args...
  local name=$1; shift
  mkdir -p "$tmp/$name/data/images"
  ln -s "$data/images/minimal" "$tmp/$name/data/images/minimal"
  ln -s "$data/images/base" "$tmp/$name/data/images/base"
  SANDCELL_RUN_DIR="$tmp/$name/run" "$bin/sandcell-serve" --data-dir "$tmp/$name/data" \
    --listen 127.0.0.1:0 --runtime gvisor --kill-on-exit "$@" > "$tmp/$name/out" 2> "$tmp/$name/err" &
  pids+=($!)
  for _ in $(seq 100); do grep -q listening "$tmp/$name/out" 2>/dev/null && break; sleep 0.1; done
}
start off --no-network
start on --net-pool 10.251.0.0/16
sleep 2 # the pool fills
python3 - "$tmp" "$runs" "$bin/sandcell" "$data/images/minimal/rootfs/bin/busybox" <<'PY' > bench/net/results.json
import json, os, subprocess, sys, time, urllib.request
tmp, runs, cli, busybox = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def daemon(name):
    url = open(f"{tmp}/{name}/out").read().split("listening on ")[1].split()[0]
    key = open(f"{tmp}/{name}/data/admin.key").read().strip()
    return url, key
def call(url, key, method, path, body=None):
    req = urllib.request.Request(url + path, method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"X-API-Key": key, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")
def stats(v):
    v = sorted(v)
    q = lambda p: v[round((len(v) - 1) * p)]
    return {"runs": len(v), "p50": q(0.5), "p90": q(0.9), "min": v[0], "max": v[-1]}
out = {"network": json.load(open(f"{tmp}/network.json")),
       "throughput": json.load(open(f"{tmp}/throughput.json"))}
for name, body in [("off", {}), ("on", {}), ("on_with_rules", {"network": {"allowOut": ["198.51.100.0/24", "example.com"]}})]:
    url, key = daemon("off" if name == "off" else "on")
    times = []
    for _ in range(runs):
        t = time.monotonic()
        s = call(url, key, "POST", "/sandboxes", dict(body, templateID="minimal"))
        times.append((time.monotonic() - t) * 1000)
        call(url, key, "DELETE", f"/sandboxes/{s['sandboxID']}")
        time.sleep(0.3)  # the pool refills between creates, as between real requests
    out[f"create_{name}_ms"] = stats(times)
out["create_network_adds_p50_ms"] = out["create_on_ms"]["p50"] - out["create_off_ms"]["p50"]

def pct(v):
    v = sorted(v)
    q = lambda p: v[round((len(v) - 1) * p)]
    return {"samples": len(v), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "min": v[0], "max": v[-1]}
SINK, MIB = "198.51.100.20", 256
SEND = ("import socket,time\n"
        f"s=socket.create_connection(('{SINK}',5201));b=bytes(1<<20);t=time.monotonic()\n"
        f"for _ in range({MIB}): s.sendall(b)\n"
        "s.shutdown(socket.SHUT_WR);n=int(s.recv(64));d=time.monotonic()-t\n"
        "print(n, d)\n")
def gbit(text):
    sent, secs = text.split()
    assert int(sent) == MIB << 20, text
    return int(sent) * 8 / float(secs) / 1e9
def rtts(text):
    return [float(l.split("time=")[1].split()[0]) for l in text.splitlines() if "time=" in l]
url, key = daemon("on")
s = call(url, key, "POST", "/sandboxes", {"templateID": "base", "timeout": 600})
env = dict(os.environ, SANDCELL_URL=url, SANDCELL_API_KEY=key)
def inside(*cmd, check=True):
    return subprocess.run([cli, "exec", "-u", "root", s["sandboxID"], "--", *cmd],
                          env=env, capture_output=True, text=True, timeout=120, check=check).stdout
def host(*cmd, check=True):
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=120,
                          check=check).stdout
n = min(runs, 5)
g = {"gvisor": [gbit(inside("python3", "-c", SEND)) for _ in range(n)],
     "host": [gbit(host("/usr/bin/python3", "-c", SEND)) for _ in range(n)]}
p = {"gvisor": rtts(inside("sh", "-c", f"ping -c 30 -i 0.05 {SINK} 2>&1", check=False)),
     "host": rtts(host(busybox, "ping", "-c", "30", "-i", "0.05", SINK))}
call(url, key, "DELETE", f"/sandboxes/{s['sandboxID']}")
out["gvisor_throughput"] = {
    "tcp_gbit_s": {k: pct(v) for k, v in g.items()},
    # No ICMP from gVisor (runsc's default --net-raw=false) gives "unavailable".
    "ping_rtt_ms": {k: pct(v) if v else "unavailable" for k, v in p.items()},
    "mib_per_transfer": MIB,
}
print(json.dumps(out, indent=2))
PY
cat bench/net/results.json
