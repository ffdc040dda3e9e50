//! TLS interception end to end: a sandbox network with `network.rules` (real namespace,
//! nftables, our DNS server, the Host/SNI proxy), `curl` in the sandbox's namespace given
//! the egress CA with `--cacert`, and HTTPS upstreams in the fake internet
//! (sandcell_net::testing) run by Python's ssl module: one whose CA the interceptor trusts
//! as the operator's extra CA, one from a CA it does not know. The upstreams answer with
//! the request head they received, so the test sees what left the host. Needs root,
//! iproute2, nftables, dnsmasq, python3 and curl; fails loudly without them.

#![allow(clippy::unwrap_used)]

use sandcell_net::inject::InjectedHeader;
use sandcell_net::intercept::{Interceptor, set_interceptor};
use sandcell_net::rules::{Resolved, Resolver, Rule, Transform, set_resolver};
use sandcell_net::testing::{DNS, Internet, TestCa, TlsUpstream};
use sandcell_net::tls_ca::{CERT_FILE, EgressCa};
use sandcell_net::{EgressSpec, NetConfig, SandboxNet};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::sync::Arc;

const VALUE: &str = "Bearer REAL-VALUE-e2e";
const PLACEHOLDER: &str = "Bearer ${e2b.secrets.k}";
/// The trusted upstream (api.test, plain.test) and the one of an unknown CA (rogue.test).
const TRUSTED: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 30);
const ROGUE: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 31);

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

/// Removes the files even when the test fails (after the upstreams, dropped before it).
struct Cleanup {
    dir: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `curl` in the sandbox's namespace: its exit status and stdout (body, then the status
/// code on the last line).
fn curl(netns: &str, cacert: &Path, url_host: &str, ip: Ipv4Addr, extra: &[&str]) -> (i32, String) {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            netns,
            "curl",
            "-sS",
            "--noproxy",
            "*",
            "--max-time",
            "20",
        ])
        .arg("--cacert")
        .arg(cacert)
        .arg("--resolve")
        .arg(format!("{url_host}:443:{ip}"))
        .args(["-H", &format!("Authorization: {PLACEHOLDER}")])
        .args(["-w", "\n%{http_code}"])
        .args(extra)
        .arg(format!("https://{url_host}/v1/x"))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Resolves `name` through the sandbox's DNS server (what opens its address).
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

fn transform() -> Vec<Rule> {
    vec![Rule {
        transform: Some(Transform {
            headers: [("Authorization".to_string(), PLACEHOLDER.to_string())].into(),
        }),
    }]
}

#[tokio::test(flavor = "multi_thread")]
async fn https_to_a_rule_domain_is_intercepted_and_filled_and_nothing_else_is() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the network tests need root");
    let _l = Internet::lock();
    let inet = Internet::start().unwrap();
    let hex = sandcell_proto::random::hex(8).unwrap();
    let dir = std::env::temp_dir().join(format!("sc-egress-tls-{hex}"));
    std::fs::create_dir(&dir).unwrap();
    let cleanup = Cleanup { dir: dir.clone() };
    let trusted_ca = TestCa::new("upstream test CA").unwrap();
    let rogue_ca = TestCa::new("rogue CA").unwrap();
    let trusted =
        TlsUpstream::start(&dir, &trusted_ca, TRUSTED, &["api.test", "plain.test"]).unwrap();
    let rogue = TlsUpstream::start(&dir, &rogue_ca, ROGUE, &["rogue.test"]).unwrap();
    for (name, ip) in [
        ("api.test", TRUSTED),
        ("plain.test", TRUSTED),
        ("rogue.test", ROGUE),
    ] {
        inet.add_host(name, ip).unwrap();
    }
    let trusted_file = dir.join("upstream-ca.pem");
    std::fs::write(&trusted_file, trusted_ca.pem()).unwrap();

    let ca = EgressCa::load_or_create(&dir).unwrap();
    let extra = sandcell_net::intercept::read_extra_ca(&trusted_file).unwrap();
    set_interceptor(Arc::new(Interceptor::new(ca, extra).unwrap()));
    set_resolver(Arc::new(Fixed));
    let egress_pem = dir.join(CERT_FILE);

    let mut spec = EgressSpec {
        allow_internet_access: false,
        allow_out: ["api.test", "plain.test", "rogue.test"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        ..Default::default()
    };
    spec.rules.insert("api.test".into(), transform());
    spec.rules.insert("rogue.test".into(), transform());
    let config = NetConfig {
        pool: "10.202.0.0/16".parse().unwrap(),
        upstream_dns: vec![SocketAddr::from((DNS, 53))],
        allow_private: Default::default(),
    };
    let id = format!("t{}-tls", std::process::id());
    let net = SandboxNet::create(&config, &id, &spec).await.unwrap();
    let ns = net.network().netns.clone();
    let gw = net.network().gateway.to_string();
    let run = tokio::task::spawn_blocking(move || {
        for name in ["api.test", "plain.test", "rogue.test"] {
            resolve_inside(&ns, &gw, name);
        }
        let mut failures = Vec::new();
        let mut check = |what: &str, ok: bool, got: &str| {
            if !ok {
                failures.push(format!("{what}: {got}"));
            }
        };
        // The rule's domain: the sandbox trusts the egress CA's leaf; the upstream got
        // the value, never the placeholder.
        let (rc, out) = curl(&ns, &egress_pem, "api.test", TRUSTED, &[]);
        check(
            "api.test is filled",
            rc == 0
                && out.ends_with("\n200")
                && out.contains(&format!("Authorization: {VALUE}\r\n"))
                && !out.contains("${e2b"),
            &format!("rc {rc}: {out}"),
        );
        // ...and that leaf is not the upstream's: with the upstream's CA it is refused.
        let (rc, out) = curl(&ns, &trusted_file, "api.test", TRUSTED, &[]);
        check(
            "api.test's leaf is the egress CA's",
            rc == 60,
            &format!("rc {rc}: {out}"),
        );
        // Another Host inside the TLS of the rule's domain: 403, nothing sent.
        let (rc, out) = curl(
            &ns,
            &egress_pem,
            "api.test",
            TRUSTED,
            &["-H", "Host: evil.test"],
        );
        check(
            "another Host is refused",
            rc == 0 && out.ends_with("\n403") && !out.contains(VALUE),
            &format!("rc {rc}: {out}"),
        );
        // An SNI no rule allows, to the rule domain's address: refused, no handshake.
        let (rc, out) = curl(&ns, &egress_pem, "evil.test", TRUSTED, &[]);
        check(
            "another SNI is refused",
            rc != 0 && !out.contains(VALUE),
            &format!("rc {rc}: {out}"),
        );
        // A rule's upstream whose certificate the host does not trust: 502, nothing sent.
        let (rc, out) = curl(&ns, &egress_pem, "rogue.test", ROGUE, &[]);
        check(
            "an untrusted upstream is 502",
            rc == 0 && out.ends_with("\n502") && !out.contains(VALUE),
            &format!("rc {rc}: {out}"),
        );
        // A domain without a transform is never intercepted: the upstream's own
        // certificate, the placeholder as sent.
        let (rc, out) = curl(&ns, &trusted_file, "plain.test", TRUSTED, &[]);
        check(
            "plain.test passes through",
            rc == 0 && out.ends_with("\n200") && out.contains(PLACEHOLDER) && !out.contains(VALUE),
            &format!("rc {rc}: {out}"),
        );
        failures
    });
    let failures = run.await.unwrap();
    let log = net.denied().await.unwrap();
    net.teardown().await.unwrap();
    drop((trusted, rogue, cleanup));
    assert!(failures.is_empty(), "{failures:#?}");
    assert!(
        log.injections.iter().any(|i| i.domain == "api.test"),
        "the injection is in the audit log: {log:?}"
    );
}
