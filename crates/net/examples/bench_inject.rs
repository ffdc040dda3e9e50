//! What header injection adds to a request (bench/net/inject.sh): JSON on stdout. From a
//! sandbox's namespace, one request a new connection, timed by the client (connect to last
//! answer byte), to the fake internet (sandcell_net::testing). Plain HTTP to
//! allowed.test:80:
//! - `host_check_ms`: the domain rule alone (the Host/SNI proxy: the peer reference);
//! - `injected_ms`: the same rule with a `network.rules` transform (the proxy hands the
//!   connection to the inject relay, which asks the resolver for the headers per request;
//!   here a resolver that answers at once, so the figure is the relay's own cost, not a
//!   secrets lookup);
//! - `direct_ms`: the host's namespace straight to the server (the floor).
//!
//! HTTPS to tls.test:443 (a Python `ssl` upstream of a test CA):
//! - `tls_sni_ms`: the domain rule alone: SNI checked, TLS passed through (the client
//!   trusts the upstream's CA; the peer reference);
//! - `tls_injected_ms`: with a transform: intercepted (the client's TLS ends on the host
//!   with a leaf of the egress CA, which it trusts; the relay; the host's own TLS to the
//!   upstream, verified against the test CA given as the operator's extra CA).
//!
//! Blocks of the variants alternate, so that drift on a shared machine hits all alike.
//!
//!   bench_inject [--runs N] [--pool CIDR]
//!
//! Needs root, iproute2, nftables, dnsmasq and python3.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell_net::inject::InjectedHeader;
use sandcell_net::intercept::{Interceptor, read_extra_ca, set_interceptor};
use sandcell_net::rules::{Resolved, Resolver, Rule, Transform};
use sandcell_net::testing::{HTTP_A, Internet, TestCa, TlsUpstream};
use sandcell_net::tls_ca::{CERT_FILE, EgressCa};
use sandcell_net::{EgressSpec, NetConfig, SandboxNet};
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::Path;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;

/// The HTTPS upstream's address and name.
const TLS_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 40);
const TLS_NAME: &str = "tls.test";

/// Timed HTTPS requests on new connections (each a full handshake, verified against the
/// CA file given); prints one JSON list of milliseconds.
const TLS_CLIENT: &str = r#"
import json, socket, ssl, sys, time
ip, host, n, ca = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ctx = ssl.create_default_context(cafile=ca)
ctx.set_alpn_protocols(["http/1.1"])
req = f"GET / HTTP/1.1\r\nHost: {host}\r\nAuthorization: placeholder\r\nConnection: close\r\n\r\n".encode()
out = []
for _ in range(n):
    t = time.perf_counter()
    s = ctx.wrap_socket(socket.create_connection((ip, 443), timeout=10), server_hostname=host)
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

fn tls_client(netns: &str, n: usize, ca: &Path) -> Vec<f64> {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "python3", "-c", TLS_CLIENT])
        .arg(TLS_IP.to_string())
        .arg(TLS_NAME)
        .arg(n.to_string())
        .arg(ca)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "TLS client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the client's JSON")
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

/// Asks the sandbox's DNS server for `name` from inside: the answer opens its address
/// (through the proxy) for the answer's TTL.
fn resolve_inside(ns: &str, gateway: &str, name: &str) {
    let ok = Command::new("ip")
        .args(["netns", "exec", ns, "python3", "-c"])
        .arg(
            "import socket,sys\n\
             q=b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00'\n\
             for l in sys.argv[2].split('.'): q+=bytes([len(l)])+l.encode()\n\
             q+=b'\\x00\\x00\\x01\\x00\\x01'\n\
             s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(5);s.sendto(q,(sys.argv[1],53));s.recv(512)",
        )
        .args([gateway, name])
        .status()
        .expect("python3");
    assert!(ok.success(), "resolving {name} in the sandbox");
}

fn stats(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    serde_json::json!({"runs": v.len(), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99),
        "min": v[0], "max": v[v.len() - 1]})
}

fn spec(rules: bool) -> EgressSpec {
    let mut s = EgressSpec {
        allow_out: vec!["allowed.test".into(), TLS_NAME.into()],
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
        let rule = vec![Rule { transform: Some(t) }];
        s.rules.insert("allowed.test".into(), rule.clone());
        s.rules.insert(TLS_NAME.into(), rule);
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
    let inet = Internet::start().expect("the fake internet (root, ip, dnsmasq, python3?)");
    sandcell_net::rules::set_resolver(Arc::new(Fixed));
    // HTTPS: an upstream of a test CA, which the interceptor trusts as the operator's extra
    // CA; the egress CA in a directory of the run's own.
    let dir = std::env::temp_dir().join(format!("sc-bench-inject-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let upstream_ca = TestCa::new("bench upstream CA").expect("a test CA");
    let _upstream =
        TlsUpstream::start(&dir, &upstream_ca, TLS_IP, &[TLS_NAME]).expect("the HTTPS upstream");
    inet.add_host(TLS_NAME, TLS_IP)
        .expect("tls.test in the test DNS");
    let upstream_ca_file = dir.join("upstream-ca.pem");
    std::fs::write(&upstream_ca_file, upstream_ca.pem()).expect("writing the CA");
    let egress_ca = EgressCa::load_or_create(&dir).expect("the egress CA");
    let extra = read_extra_ca(&upstream_ca_file).expect("the extra CA");
    set_interceptor(Arc::new(
        Interceptor::new(egress_ca, extra).expect("the interceptor"),
    ));
    let egress_ca_file = dir.join(CERT_FILE);
    let net = SandboxNet::create(&cfg, "benchinj", &spec(false))
        .await
        .expect("a sandbox network");
    let ns = net.network().netns.clone();
    // The proxy is reached only for addresses a DNS answer opened.
    let gw = net.network().gateway.to_string();
    let (mut plain, mut injected, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    let (mut tls_sni, mut tls_injected) = (Vec::new(), Vec::new());
    let block = (runs / 4).max(1);
    for _ in 0..4 {
        resolve_inside(&ns, &gw, "allowed.test");
        resolve_inside(&ns, &gw, TLS_NAME);
        net.set_policy(&spec(false)).await.unwrap();
        plain.extend(client(Some(&ns), block));
        tls_sni.extend(tls_client(&ns, block, &upstream_ca_file));
        net.set_policy(&spec(true)).await.unwrap();
        injected.extend(client(Some(&ns), block));
        tls_injected.extend(tls_client(&ns, block, &egress_ca_file));
        direct.extend(client(None, block));
    }
    let log = net.denied().await.unwrap();
    assert!(
        log.injections.len() >= block.min(256),
        "the injected requests went through the relay"
    );
    net.teardown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "{}",
        serde_json::json!({
            "what": "one HTTP/1.1 request a new connection from a sandbox namespace, ms",
            "host_check_ms": stats(plain),
            "injected_ms": stats(injected),
            "direct_ms": stats(direct),
            "tls_sni_ms": stats(tls_sni),
            "tls_injected_ms": stats(tls_injected),
        })
    );
}
