//! What `egressProxy` adds to a TCP request (bench/net/egress-proxy.sh): JSON on stdout.
//! From a sandbox's namespace, one HTTP/1.1 GET a new connection to the fake internet's
//! 198.51.100.10:80 (an IP rule opens it), timed by the client (connect to last answer
//! byte):
//! - `direct_ms`: no proxy: nftables forwards the connection (the reference);
//! - `proxied_ms`: with a proxy: nftables DNATs it to the gateway's proxy, which dials
//!   pproxy (SOCKS5 with a login, in the fake internet) and pproxy the upstream;
//! - `host_via_socks_ms`: the host itself through pproxy (its own SOCKS5 handshake, same
//!   login), without our gateway proxy: what pproxy alone costs.
//!
//! Blocks of the variants alternate (the proxy set and removed between them), so that drift
//! on a shared machine hits all alike.
//!
//!   bench_egress_proxy [--runs N] [--pool CIDR]
//!
//! Needs root, iproute2, nftables, dnsmasq and python3 (pproxy from PyPI in a cached venv).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell_net::testing::{DNS, HTTP_A, Internet, NETNS, Socks5Server};
use sandcell_net::tunnel::EgressProxy;
use sandcell_net::{EgressSpec, NetConfig, SandboxNet};
use std::process::Command;

const PROXY: &str = "198.51.100.2:1084";
const USER: &str = "bench";
const PASS: &str = "bench-pw";

/// Timed requests on new connections, directly or (with a proxy argument) through a
/// SOCKS5 login and CONNECT; prints one JSON list of milliseconds.
const CLIENT: &str = r#"
import json, socket, sys, time
ip, n = sys.argv[1], int(sys.argv[2])
proxy = sys.argv[3] if len(sys.argv) > 3 else None
req = b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
def exact(s, k):
    b = b""
    while len(b) < k:
        c = s.recv(k - len(b))
        if not c:
            sys.exit("short read from the proxy")
        b += c
    return b
out = []
for _ in range(n):
    t = time.perf_counter()
    if proxy:
        ph, pp, user, pw = proxy.split(":")
        s = socket.create_connection((ph, int(pp)), timeout=10)
        s.sendall(b"\x05\x01\x02")
        assert exact(s, 2) == b"\x05\x02"
        s.sendall(bytes([1, len(user)]) + user.encode() + bytes([len(pw)]) + pw.encode())
        assert exact(s, 2)[1] == 0
        s.sendall(b"\x05\x01\x00\x01" + socket.inet_aton(ip) + (80).to_bytes(2, "big"))
        r = exact(s, 4)
        assert r[1] == 0, r
        exact(s, {1: 4, 4: 16}[r[3]] + 2)
    else:
        s = socket.create_connection((ip, 80), timeout=10)
    s.sendall(req)
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    s.close()
    if not got.startswith(b"HTTP/1.") or b" 200 " not in got.split(b"\r\n")[0]:
        sys.exit("bad answer: " + got[:100].decode("latin-1"))
    out.append((time.perf_counter() - t) * 1000)
print(json.dumps(out))
"#;

fn client(netns: Option<&str>, n: usize, proxy: Option<&str>) -> Vec<f64> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "python3"]);
            c
        }
        None => Command::new("python3"),
    };
    cmd.args(["-c", CLIENT, &HTTP_A.to_string(), &n.to_string()]);
    if let Some(p) = proxy {
        cmd.arg(p);
    }
    let out = cmd.output().expect("python3");
    assert!(
        out.status.success(),
        "client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the client's JSON")
}

fn stats(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    serde_json::json!({"runs": v.len(), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99),
        "min": v[0], "max": v[v.len() - 1]})
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_string())
    };
    let runs: usize = arg("--runs", "200").parse().expect("--runs N");
    let cfg = NetConfig {
        pool: arg("--pool", "10.252.0.0/16").parse().expect("--pool CIDR"),
        upstream_dns: Internet::upstream_dns(),
        allow_private: Default::default(),
    };
    let _lock = Internet::lock();
    let _inet = Internet::start().expect("the fake internet (root, ip, dnsmasq, python3?)");
    let mut pproxy = Socks5Server::start(
        PROXY.parse().expect("the proxy address"),
        Some((USER, PASS)),
        Some(NETNS),
        Some(DNS),
    )
    .expect("pproxy");
    let spec = EgressSpec {
        allow_out: vec![HTTP_A.to_string()],
        ..Default::default()
    };
    let proxy = EgressProxy {
        address: PROXY.into(),
        username: Some(USER.into()),
        password: Some(PASS.into()),
    };
    let net = SandboxNet::create(&cfg, "benchproxy", &spec)
        .await
        .expect("a sandbox network");
    let ns = net.network().netns.clone();
    let host_proxy = format!("{PROXY}:{USER}:{PASS}");
    let (mut direct, mut proxied, mut host) = (Vec::new(), Vec::new(), Vec::new());
    let blocks = 8;
    let block = (runs / blocks).max(1);
    for _ in 0..blocks {
        net.set_egress(&spec, None).await.unwrap();
        direct.extend(client(Some(&ns), block, None));
        net.set_egress(&spec, Some(&proxy)).await.unwrap();
        proxied.extend(client(Some(&ns), block, None));
        host.extend(client(None, block, Some(&host_proxy)));
    }
    let carried = pproxy
        .log()
        .lines()
        .filter(|l| l.contains(&format!("-> {HTTP_A}:80")))
        .count();
    assert!(
        carried >= 2 * block * blocks,
        "the proxied requests went through pproxy ({carried} logged)"
    );
    net.teardown().await.unwrap();
    pproxy.stop();
    println!(
        "{}",
        serde_json::json!({
            "what": "one HTTP/1.1 GET a new connection from a sandbox namespace to \
                     198.51.100.10:80, ms",
            "direct_ms": stats(direct),
            "proxied_ms": stats(proxied),
            "host_via_socks_ms": stats(host),
        })
    );
}
