//! `egressProxy` at the network level: a sandbox network (real namespace, nftables, our DNS
//! server, the Host/SNI proxy with TLS interception) whose egress goes through pproxy
//! (PyPI, testing::Socks5Server) in the fake internet. What an IP rule allows goes through
//! it by address; HTTPS to a `network.rules` domain is intercepted, filled and sent through
//! it by name; with the proxy down both fail, and removing it goes direct again. Needs root,
//! iproute2, nftables, dnsmasq, python3 and curl; fails loudly without them.

#![allow(clippy::unwrap_used)]

use sandcell_net::inject::InjectedHeader;
use sandcell_net::intercept::{Interceptor, set_interceptor};
use sandcell_net::rules::{Resolved, Resolver, Rule, Transform, set_resolver};
use sandcell_net::testing::{DNS, Internet, NETNS, Socks5Server, TestCa, TlsUpstream};
use sandcell_net::tls_ca::{CERT_FILE, EgressCa};
use sandcell_net::tunnel::EgressProxy;
use sandcell_net::{EgressSpec, NetConfig, SandboxNet};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;

const VALUE: &str = "Bearer REAL-VALUE-proxy";
const PLACEHOLDER: &str = "Bearer ${e2b.secrets.k}";
const UPSTREAM: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 32);
const PROXY: &str = "198.51.100.2:1082";

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
                value: VALUE.into(),
                secrets: vec![("k".into(), 1)],
            })
            .collect();
        Box::pin(async move { Ok(filled) })
    }
}

/// `curl` in the sandbox's namespace: stdout (body, then the status code on the last line),
/// or "ERR <exit status>".
fn curl(netns: &str, cacert: &Path, url: &str, resolve: Option<&str>) -> String {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", netns, "curl", "-sS", "--noproxy", "*"])
        .args(["--max-time", "20", "--cacert"])
        .arg(cacert)
        .args(["-H", &format!("Authorization: {PLACEHOLDER}")])
        .args(["-w", "\n%{http_code}"]);
    if let Some(r) = resolve {
        c.args(["--resolve", r]);
    }
    let out = c.arg(url).output().unwrap();
    match out.status.code() {
        Some(0) => String::from_utf8_lossy(&out.stdout).into_owned(),
        rc => format!("ERR {rc:?}"),
    }
}

fn resolve_inside(netns: &str, gateway: &str, name: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/probe.py");
    let out = Command::new("ip")
        .args([
            "netns", "exec", netns, "python3", script, "dns", name, gateway,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("198.51.100."),
        "dns {name}: {text}"
    );
}

fn carried(p: &Socks5Server, target: &str) -> usize {
    p.log()
        .lines()
        .filter(|l| l.starts_with("socks5 198.51.100.1:") && l.ends_with(&format!("-> {target}")))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn ip_rules_and_intercepted_https_go_through_the_proxy_and_fail_closed() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the network tests need root");
    let _l = Internet::lock();
    let inet = Internet::start().unwrap();
    let hex = sandcell_proto::random::hex(8).unwrap();
    let dir = std::env::temp_dir().join(format!("sc-egress-proxy-{hex}"));
    std::fs::create_dir(&dir).unwrap();
    let upstream_ca = TestCa::new("upstream test CA").unwrap();
    let upstream = TlsUpstream::start(&dir, &upstream_ca, UPSTREAM, &["api.test"]).unwrap();
    inet.add_host("api.test", UPSTREAM).unwrap();
    let ca_file = dir.join("upstream-ca.pem");
    std::fs::write(&ca_file, upstream_ca.pem()).unwrap();
    let ca = EgressCa::load_or_create(&dir).unwrap();
    let extra = sandcell_net::intercept::read_extra_ca(&ca_file).unwrap();
    set_interceptor(Arc::new(Interceptor::new(ca, extra).unwrap()));
    set_resolver(Arc::new(Fixed));
    let egress_pem = dir.join(CERT_FILE);
    let mut proxy =
        Socks5Server::start(PROXY.parse().unwrap(), None, Some(NETNS), Some(DNS)).unwrap();

    let mut spec = EgressSpec {
        allow_out: vec!["api.test".into(), "198.51.100.10".into()],
        ..Default::default()
    };
    spec.rules.insert(
        "api.test".into(),
        vec![Rule {
            transform: Some(Transform {
                headers: [("Authorization".to_string(), PLACEHOLDER.to_string())].into(),
            }),
        }],
    );
    let config = NetConfig {
        pool: "10.216.0.0/16".parse().unwrap(),
        upstream_dns: vec![SocketAddr::from((DNS, 53))],
        allow_private: Default::default(),
    };
    let id = format!("t{}-proxy", std::process::id());
    let net = SandboxNet::create(&config, &id, &spec).await.unwrap();
    let with_proxy = EgressProxy {
        address: PROXY.into(),
        ..Default::default()
    };
    net.set_egress(&spec, Some(&with_proxy)).await.unwrap();
    assert_eq!(net.egress_proxy().await, Some(with_proxy.clone()));
    let ns = net.network().netns.clone();
    let gw = net.network().gateway.to_string();
    let api = format!("api.test:443:{UPSTREAM}");

    let (n, e, a) = (ns.clone(), egress_pem.clone(), api.clone());
    let (by_ip, https) = tokio::task::spawn_blocking(move || {
        resolve_inside(&n, &gw, "api.test");
        let by_ip = curl(&n, &e, "http://198.51.100.10/", None);
        let https = curl(&n, &e, "https://api.test/v1/x", Some(&a));
        (by_ip, https)
    })
    .await
    .unwrap();
    assert!(by_ip.starts_with("hello-10"), "{by_ip}");
    assert_eq!(carried(&proxy, "198.51.100.10:80"), 1, "{}", proxy.log());
    assert!(
        https.ends_with("\n200")
            && https.contains(&format!("Authorization: {VALUE}\r\n"))
            && !https.contains("${e2b"),
        "{https}"
    );
    assert_eq!(carried(&proxy, "api.test:443"), 1, "{}", proxy.log());

    // The proxy down: nothing gets out, neither way.
    proxy.stop();
    let (n, e, a) = (ns.clone(), egress_pem.clone(), api.clone());
    let (by_ip, https) = tokio::task::spawn_blocking(move || {
        (
            curl(&n, &e, "http://198.51.100.10/", None),
            curl(&n, &e, "https://api.test/v1/x", Some(&a)),
        )
    })
    .await
    .unwrap();
    assert!(by_ip.starts_with("ERR"), "{by_ip}");
    assert!(
        https.starts_with("ERR") || https.ends_with("\n502"),
        "{https}"
    );
    assert!(!https.contains(VALUE), "{https}");

    // Removed: direct again.
    net.set_egress(&spec, None).await.unwrap();
    assert_eq!(net.egress_proxy().await, None);
    let (n, e) = (ns.clone(), egress_pem.clone());
    let by_ip = tokio::task::spawn_blocking(move || curl(&n, &e, "http://198.51.100.10/", None))
        .await
        .unwrap();
    assert!(by_ip.starts_with("hello-10"), "{by_ip}");

    // A private address is refused at the net layer too, the setting unchanged.
    let private = EgressProxy {
        address: "192.168.7.7:1080".into(),
        ..Default::default()
    };
    let err = net.set_egress(&spec, Some(&private)).await.unwrap_err();
    assert!(err.to_string().contains("192.168.7.7"), "{err}");
    assert_eq!(net.egress_proxy().await, None);

    net.teardown().await.unwrap();
    drop(upstream);
    let _ = std::fs::remove_dir_all(&dir);
}
