//! What header injection adds to a plain-HTTP request (bench/net/inject.sh): JSON on stdout.
//! From a sandbox's namespace, one request a new connection to allowed.test:80 of the fake
//! internet (sandcell_net::testing), timed by the client (connect to last answer byte):
//! - `host_check_ms`: the domain rule alone (the Host/SNI proxy: the peer reference);
//! - `injected_ms`: the same rule with a `network.rules` transform (the proxy hands the
//!   connection to the inject relay, which asks the resolver for the headers per request;
//!   here a resolver that answers at once, so the figure is the relay's own cost, not a
//!   secrets lookup);
//! - `direct_ms`: the host's namespace straight to the server (the floor).
//!
//! Blocks of the three alternate, so that drift on a shared machine hits all alike.
//!
//!   bench_inject [--runs N] [--pool CIDR]
//!
//! Needs root, iproute2, nftables, dnsmasq and python3.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell_net::inject::InjectedHeader;
use sandcell_net::rules::{Resolved, Resolver, Rule, Transform};
use sandcell_net::testing::{HTTP_A, Internet};
use sandcell_net::{EgressSpec, NetConfig, SandboxNet};
use std::future::Future;
use std::pin::Pin;
use std::process::Command;

/// Timed requests on new connections; prints one JSON list of milliseconds.
const CLIENT: &str = r#"
import json, socket, sys, time
ip, host, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
req = f"GET / HTTP/1.1\r\nHost: {host}\r\nAuthorization: placeholder\r\nConnection: close\r\n\r\n".encode()
out = []
for _ in range(n):
    t = time.perf_counter()
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

struct Fixed;

impl Resolver for Fixed {
    fn resolve<'a>(
        &'a self,
        _net_id: &'a str,
        _domain: &'a str,
        headers: &'a [(String, String)],
    ) -> Pin<Box<dyn Future<Output = Resolved> + Send + 'a>> {
        let filled = headers
            .iter()
            .map(|(name, _)| InjectedHeader {
                name: name.clone(),
                value: "Bearer bench-value".into(),
                secrets: vec![("bench".into(), 1)],
            })
            .collect();
        Box::pin(async move { Ok(filled) })
    }
}

fn client(netns: Option<&str>, n: usize) -> Vec<f64> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "python3"]);
            c
        }
        None => Command::new("python3"),
    };
    let out = cmd
        .args([
            "-c",
            CLIENT,
            &HTTP_A.to_string(),
            "allowed.test",
            &n.to_string(),
        ])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the client's JSON")
}

/// Asks the sandbox's DNS server for allowed.test from inside: the answer opens its
/// address (through the proxy) for the answer's TTL.
fn resolve_inside(ns: &str, gateway: &str) {
    let ok = Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c"])
        .arg(
            "import socket,sys\n\
             q=b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x07allowed\\x04test\\x00\\x00\\x01\\x00\\x01'\n\
             s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(5);s.sendto(q,(sys.argv[1],53));s.recv(512)",
        )
        .arg(gateway)
        .status()
        .expect("python3");
    assert!(ok.success(), "resolving allowed.test in the sandbox");
}

fn stats(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    serde_json::json!({"runs": v.len(), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99),
        "min": v[0], "max": v[v.len() - 1]})
}

fn spec(rules: bool) -> EgressSpec {
    let mut s = EgressSpec {
        allow_out: vec!["allowed.test".into()],
        ..Default::default()
    };
    if rules {
        let t = Transform {
            headers: [(
                "Authorization".to_string(),
                "${e2b.secrets.bench}".to_string(),
            )]
            .into(),
        };
        s.rules
            .insert("allowed.test".into(), vec![Rule { transform: Some(t) }]);
    }
    s
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
        pool: arg("--pool", "10.253.0.0/16").parse().expect("--pool CIDR"),
        upstream_dns: Internet::upstream_dns(),
        allow_private: Default::default(),
    };
    let _lock = Internet::lock();
    let _inet = Internet::start().expect("the fake internet (root, ip, dnsmasq, python3?)");
    sandcell_net::rules::set_resolver(std::sync::Arc::new(Fixed));
    let net = SandboxNet::create(&cfg, "benchinj", &spec(false))
        .await
        .expect("a sandbox network");
    let ns = net.network().netns.clone();
    // The proxy is reached only for addresses a DNS answer opened.
    let gw = net.network().gateway.to_string();
    let (mut plain, mut injected, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    let block = (runs / 4).max(1);
    for _ in 0..4 {
        resolve_inside(&ns, &gw);
        net.set_policy(&spec(false)).await.unwrap();
        plain.extend(client(Some(&ns), block));
        net.set_policy(&spec(true)).await.unwrap();
        injected.extend(client(Some(&ns), block));
        direct.extend(client(None, block));
    }
    let log = net.denied().await.unwrap();
    assert!(
        log.injections.len() >= block.min(256),
        "the injected requests went through the relay"
    );
    net.teardown().await.unwrap();
    println!(
        "{}",
        serde_json::json!({
            "what": "one HTTP/1.1 request a new connection from a sandbox namespace, ms",
            "host_check_ms": stats(plain),
            "injected_ms": stats(injected),
            "direct_ms": stats(direct),
        })
    );
}
