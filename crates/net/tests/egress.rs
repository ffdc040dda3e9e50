//! Egress policy end to end: real namespaces, real nftables, our real DNS server, a fake
//! internet (sandcell_net::testing) and a "sandbox" that is a process in the sandbox's
//! namespace (tests/probe.py). Needs root, iproute2, nftables, dnsmasq and python3; fails
//! loudly without them.

#![allow(clippy::unwrap_used)]

use sandcell_net::testing::{DNS, HTTP_A, HTTP_B, Internet};
use sandcell_net::{EgressSpec, NetConfig, Network, SandboxNet};
use std::process::Command;

/// Removes the network even when the test fails (the DNS tasks die with the runtime).
struct Guard(Network);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.teardown();
    }
}

fn config() -> NetConfig {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "the network tests need root"
    );
    NetConfig {
        pool: "10.201.0.0/16".parse().unwrap(),
        upstream_dns: Internet::upstream_dns(),
        allow_private: Default::default(),
    }
}

fn spec(internet: bool, allow: &[&str], deny: &[&str]) -> EgressSpec {
    EgressSpec {
        allow_internet_access: internet,
        allow_out: allow.iter().map(|s| s.to_string()).collect(),
        deny_out: deny.iter().map(|s| s.to_string()).collect(),
        rules: Default::default(),
    }
}

fn test_id(name: &str) -> String {
    format!("t{}-{name}", std::process::id())
}

async fn create(id: &str, spec: &EgressSpec) -> (SandboxNet, Guard) {
    let net = SandboxNet::create(&config(), &test_id(id), spec)
        .await
        .unwrap();
    let guard = Guard(net.network().clone());
    (net, guard)
}

/// Runs probe.py inside the sandbox's namespace; its one line of output.
async fn probe(net: &SandboxNet, args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/probe.py");
    let out = tokio::process::Command::new("ip")
        .args(["netns", "exec", &net.network().netns, "python3", script])
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "probe {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

async fn http(net: &SandboxNet, ip: std::net::Ipv4Addr) -> String {
    probe(net, &["http", &format!("http://{ip}/")]).await
}

/// GET http://ip/ with another Host header.
async fn http_as(net: &SandboxNet, ip: std::net::Ipv4Addr, host: &str) -> String {
    probe(net, &["httphost", &ip.to_string(), host]).await
}

async fn dns(net: &SandboxNet, name: &str) -> String {
    probe(net, &["dns", name, &net.network().gateway.to_string()]).await
}

fn ok(body: &str) -> String {
    format!("OK 200 {body}")
}

#[tokio::test(flavor = "multi_thread")]
async fn open_by_default_then_deny_out_then_no_internet_live() {
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let (net, _g) = create("open", &EgressSpec::default()).await;

    assert_eq!(http(&net, HTTP_A).await, ok("hello-10"));
    assert_eq!(http(&net, HTTP_B).await, ok("hello-20"));
    assert_eq!(dns(&net, "other.test").await, "A 198.51.100.20");
    assert_eq!(
        probe(
            &net,
            &[
                "dns",
                "other.test",
                &net.network().gateway.to_string(),
                "tcp"
            ]
        )
        .await,
        "A 198.51.100.20"
    );

    // live: deny one address
    net.set_policy(&spec(true, &[], &["198.51.100.20/32"]))
        .await
        .unwrap();
    assert_eq!(http(&net, HTTP_A).await, ok("hello-10"));
    assert!(http(&net, HTTP_B).await.starts_with("ERR"));
    let log = net.denied().await.unwrap();
    assert!(
        log.flows
            .iter()
            .any(|f| f.dest == HTTP_B && f.port == 80 && f.protocol == "tcp"),
        "{log:?}"
    );
    assert!(log.packets > 0);

    // live: no internet at all, and no names either
    net.set_policy(&spec(false, &[], &[])).await.unwrap();
    assert!(http(&net, HTTP_A).await.starts_with("ERR"));
    assert_eq!(dns(&net, "allowed.test").await, "RCODE 3");
    net.teardown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn allow_cidr_only_and_allow_wins_over_deny() {
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let (net, _g) = create(
        "cidr",
        &spec(true, &["198.51.100.10/32"], &["198.51.100.0/24"]),
    )
    .await;
    assert_eq!(http(&net, HTTP_A).await, ok("hello-10"));
    assert!(http(&net, HTTP_B).await.starts_with("ERR"));
    // default deny without domain rules: no names resolve (no DNS tunnelling)
    assert_eq!(dns(&net, "other.test").await, "RCODE 3");
    net.teardown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn domain_rules_open_only_what_dns_answered() {
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let (net, _g) = create("dom", &spec(true, &["allowed.test", "*.wild.test"], &[])).await;

    // before any lookup the address is closed: DNS answers are what opens it
    assert!(
        http_as(&net, HTTP_A, "allowed.test")
            .await
            .starts_with("ERR")
    );
    assert_eq!(dns(&net, "allowed.test").await, "A 198.51.100.10");
    assert_eq!(http_as(&net, HTTP_A, "allowed.test").await, ok("hello-10"));
    assert_eq!(dns(&net, "a.wild.test").await, "A 198.51.100.10");

    // TCP to that address goes through the Host/SNI proxy: the name is checked
    // and the host connects to it itself; an IP literal or another name gets nothing
    assert_eq!(http_as(&net, HTTP_A, "b.wild.test").await, ok("hello-10"));
    let literal = http(&net, HTTP_A).await;
    assert!(
        literal.starts_with("OK 403") || literal.starts_with("ERR"),
        "{literal}"
    );
    let other = http_as(&net, HTTP_A, "other.test").await;
    assert!(
        other.starts_with("OK 403") || other.starts_with("ERR"),
        "{other}"
    );
    let ip = HTTP_A.to_string();
    assert_eq!(
        probe(&net, &["tls", &ip, "allowed.test"]).await,
        "OK tls-10"
    );
    assert!(
        probe(&net, &["tls", &ip, "other.test"])
            .await
            .starts_with("ERR")
    );
    assert!(probe(&net, &["tls", &ip, &ip]).await.starts_with("ERR"));

    // names outside the rules do not resolve, and their addresses stay closed
    assert_eq!(dns(&net, "other.test").await, "RCODE 3");
    assert_eq!(dns(&net, "wild.test").await, "RCODE 3");
    assert_eq!(dns(&net, "exfil-1234.other.test").await, "RCODE 3");
    assert!(http(&net, HTTP_B).await.starts_with("ERR"));

    // another resolver, even one that would answer, is unreachable (UDP and TCP)
    let other = probe(&net, &["dns", "other.test", &DNS.to_string()]).await;
    assert!(other.starts_with("ERR"), "{other}");
    let other = probe(&net, &["dns", "other.test", &DNS.to_string(), "tcp"]).await;
    assert!(other.starts_with("ERR"), "{other}");

    let log = net.denied().await.unwrap();
    assert!(log.names.iter().any(|n| n.name == "other.test"), "{log:?}");
    // the proxy's refusals are logged with the names (qtype 0)
    assert!(
        log.names
            .iter()
            .any(|n| n.name == "other.test" && n.qtype == 0),
        "{log:?}"
    );
    assert!(
        log.flows.iter().any(|f| f.dest == DNS && f.port == 53),
        "{log:?}"
    );
    assert!(
        log.flows.iter().any(|f| f.dest == HTTP_B && f.port == 80),
        "{log:?}"
    );

    // live: the rule goes, so does the name and (for new connections) its address
    net.set_policy(&spec(true, &["*.wild.test"], &[]))
        .await
        .unwrap();
    assert_eq!(dns(&net, "allowed.test").await, "RCODE 3");
    // a.wild.test learned the same address, which stays open under the new rules (for
    // the names they allow)
    assert_eq!(http_as(&net, HTTP_A, "a.wild.test").await, ok("hello-10"));
    let gone = http_as(&net, HTTP_A, "allowed.test").await;
    assert!(gone.starts_with("OK 403"), "{gone}");
    net.set_policy(&spec(true, &["203.0.113.1"], &[]))
        .await
        .unwrap();
    assert!(
        http_as(&net, HTTP_A, "a.wild.test")
            .await
            .starts_with("ERR")
    );
    net.teardown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn domain_rules_check_the_name_on_every_tcp_port() {
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let (net, _g) = create("ports", &spec(true, &["allowed.test"], &[])).await;
    assert_eq!(dns(&net, "allowed.test").await, "A 198.51.100.10");
    let ip = HTTP_A.to_string();

    // TLS and HTTP on ports other than 443 and 80: the name is checked there too
    assert_eq!(
        probe(&net, &["tls", &ip, "allowed.test", "8443"]).await,
        "OK tls-10-8443"
    );
    let forged = probe(&net, &["tls", &ip, "other.test", "8443"]).await;
    assert!(forged.starts_with("ERR"), "{forged}");
    assert_eq!(
        probe(&net, &["httphost", &ip, "allowed.test", "8080"]).await,
        "OK 200 hello-10-8080"
    );
    let other = probe(&net, &["httphost", &ip, "other.test", "8080"]).await;
    assert!(other.starts_with("OK 403"), "{other}");
    // a protocol that names no host (the server speaks first) is refused on a
    // domain-only address
    let banner = probe(&net, &["banner", &ip, "2222"]).await;
    assert!(banner.starts_with("ERR"), "{banner}");
    let log = net.denied().await.unwrap();
    assert!(
        log.names
            .iter()
            .any(|n| n.name == "other.test" && n.qtype == 0),
        "{log:?}"
    );

    // allowing the address itself opens it directly, for any protocol and name
    net.set_policy(&spec(true, &["allowed.test", "198.51.100.10"], &[]))
        .await
        .unwrap();
    assert_eq!(probe(&net, &["banner", &ip, "2222"]).await, "OK banner-10");
    assert_eq!(
        probe(&net, &["tls", &ip, "other.test", "8443"]).await,
        "OK tls-10-8443"
    );
    // .20 is neither allowed nor learned
    let b = probe(&net, &["banner", &HTTP_B.to_string(), "2222"]).await;
    assert!(b.starts_with("ERR"), "{b}");
    net.teardown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn ipv6_obeys_the_same_rules() {
    use sandcell_net::testing::{HTTP6_A, HTTP6_B};
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let (a6, b6) = (
        format!("http://[{HTTP6_A}]/"),
        format!("http://[{HTTP6_B}]/"),
    );
    let (net, _g) = create("v6", &EgressSpec::default()).await;
    // open: IPv6 is routed, AAAA answers pass
    assert_eq!(probe(&net, &["http", &a6]).await, ok("hello6-10"));
    assert_eq!(probe(&net, &["http", &b6]).await, ok("hello6-20"));
    let gw = net.network().gateway.to_string();
    assert_eq!(
        probe(&net, &["dns", "allowed.test", &gw, "aaaa"]).await,
        "AAAA 2001:db8:100::10"
    );
    // the host's own IPv6 addresses stay out of reach
    let listener = std::net::TcpListener::bind("[::]:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let gw6 = net.network().gateway6().to_string();
    let host = probe(&net, &["tcp", &gw6, &port]).await;
    assert!(host.starts_with("ERR"), "{host}");
    let host = probe(&net, &["tcp", "2001:db8:100::1", &port]).await;
    assert!(host.starts_with("ERR"), "{host}");

    // denyOut by IPv6 address
    net.set_policy(&spec(true, &[], &["2001:db8:100::20"]))
        .await
        .unwrap();
    assert_eq!(probe(&net, &["http", &a6]).await, ok("hello6-10"));
    assert!(probe(&net, &["http", &b6]).await.starts_with("ERR"));
    // allowOut by IPv6 CIDR: everything else denied, IPv4 too
    net.set_policy(&spec(true, &["2001:db8:100::10/128"], &[]))
        .await
        .unwrap();
    assert_eq!(probe(&net, &["http", &a6]).await, ok("hello6-10"));
    assert!(probe(&net, &["http", &b6]).await.starts_with("ERR"));
    assert!(http(&net, HTTP_A).await.starts_with("ERR"));
    // a domain rule opens no IPv6: no AAAA answer, the address stays closed
    net.set_policy(&spec(true, &["allowed.test"], &[]))
        .await
        .unwrap();
    let aaaa = probe(&net, &["dns", "allowed.test", &gw, "aaaa"]).await;
    assert_eq!(aaaa.trim(), "AAAA", "{aaaa}");
    assert_eq!(dns(&net, "allowed.test").await, "A 198.51.100.10");
    assert!(probe(&net, &["http", &a6]).await.starts_with("ERR"));
    // no internet: no IPv6 either
    net.set_policy(&spec(false, &[], &[])).await.unwrap();
    assert!(probe(&net, &["http", &a6]).await.starts_with("ERR"));

    // addresses gone from the sandbox's interface (what gVisor leaves behind for a
    // restore): readdress puts both families and their routes back
    net.set_policy(&EgressSpec::default()).await.unwrap();
    let n = net.network();
    let flushed = Command::new("ip")
        .args(["-n", &n.netns, "addr", "flush", "dev", &n.guest_if])
        .status()
        .unwrap();
    assert!(flushed.success());
    assert!(probe(&net, &["http", &a6]).await.starts_with("ERR"));
    n.readdress().unwrap();
    assert_eq!(probe(&net, &["http", &a6]).await, ok("hello6-10"));
    assert_eq!(http(&net, HTTP_A).await, ok("hello-10"));
    net.teardown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn metadata_host_and_other_sandboxes_are_refused_even_when_open() {
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let (net, _g) = create("meta", &EgressSpec::default()).await;
    let (other, _g2) = create("meta2", &EgressSpec::default()).await;

    // a host service on all addresses: the sandbox reaches none of them
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let gw = net.network().gateway.to_string();
    assert!(probe(&net, &["tcp", &gw, &port]).await.starts_with("ERR"));
    assert!(
        probe(&net, &["tcp", "198.51.100.1", &port])
            .await
            .starts_with("ERR")
    );

    // the metadata address and the other sandbox
    assert!(
        probe(&net, &["tcp", "169.254.169.254", "80"])
            .await
            .starts_with("ERR")
    );
    let peer = other.network().guest.to_string();
    assert!(probe(&net, &["tcp", &peer, "22"]).await.starts_with("ERR"));
    let log = net.denied().await.unwrap();
    assert!(
        log.flows
            .iter()
            .any(|f| f.dest.to_string() == "169.254.169.254" && f.port == 80),
        "{log:?}"
    );
    assert!(
        log.flows.iter().any(|f| f.dest.to_string() == peer),
        "{log:?}"
    );

    // no rule opens the metadata address or the pool: refused, the old rules stay
    for entry in ["169.254.169.254/32", "10.201.0.0/24", "127.0.0.1"] {
        let err = net
            .set_policy(&spec(true, &[entry, "0.0.0.0/0"], &[]))
            .await
            .unwrap_err();
        assert!(err.to_string().contains(entry), "{err}");
    }
    assert!(
        probe(&net, &["tcp", "169.254.169.254", "80"])
            .await
            .starts_with("ERR")
    );
    net.set_policy(&spec(true, &["0.0.0.0/0"], &[]))
        .await
        .unwrap();
    assert_eq!(http(&net, HTTP_A).await, ok("hello-10"));
    assert!(probe(&net, &["tcp", &peer, "22"]).await.starts_with("ERR"));
    other.teardown().await.unwrap();
    net.teardown().await.unwrap();
}

/// A one-line HTTP server on `addr` answering `body` to anything, in a thread; runs until
/// the test process ends.
fn http_server(addr: &str, body: &'static str) -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind(addr).unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = write!(c, "HTTP/1.0 200 OK\r\n\r\n{body}\n");
        }
    });
    port
}

/// The item of issue 12: the Host/SNI proxy connects from the host's namespace, so a name
/// (under an allowed domain rule) resolving to the host's loopback, the metadata address,
/// the host itself or another sandbox must reach nothing there. Before reserved.rs the
/// proxy connected to 127.0.0.1 with `allowOut: 127.0.0.0/8`, and to another sandbox with
/// `10.0.0.0/8` (explicit rules counted as "allowed"); the other sandbox's own table does not
/// see the host's connections (output, not forward).
#[tokio::test(flavor = "multi_thread")]
async fn names_never_lead_to_loopback_metadata_the_host_or_other_sandboxes() {
    let _l = Internet::lock();
    let inet = Internet::start().unwrap();
    let canary = http_server("127.0.0.1:0", "canary-loopback");
    let (victim, _gv) = create("victim", &EgressSpec::default()).await;
    // The victim's service, on its own address inside its namespace.
    let vip = victim.network().guest;
    let server = Command::new("ip")
        .args(["netns", "exec", &victim.network().netns, "python3", "-c"])
        .arg(format!(
            r#"
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('{vip}', {canary}))
s.listen(8)
while True:
    c, _ = s.accept()
    c.recv(4096)
    c.sendall(b'HTTP/1.0 200 OK\r\n\r\ncanary-victim\n')
    c.close()
"#
        ))
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _server = Kill(server);
    // The host reaches it (as the proxy would, from the host's namespace).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect((vip, canary)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the victim's server did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    inet.add_host("pool.test", vip).unwrap();

    // The API side first: such entries are refused, with the entry named.
    for bad in [
        "127.0.0.0/8",
        "169.254.169.254",
        "10.201.0.0/16",
        "198.51.100.1",
    ] {
        let err = SandboxNet::create(&config(), &test_id("bad"), &spec(true, &[bad], &[]))
            .await
            .err()
            .unwrap_or_else(|| panic!("{bad} accepted"));
        assert!(err.to_string().contains(bad), "{err}");
    }

    // The operator opened 10/8: that still leaves the pool (other sandboxes) closed.
    let mut cfg = config();
    cfg.allow_private = "10.0.0.0/8".parse().unwrap();
    let names = [
        "allowed.test",
        "loop.test",
        "meta.test",
        "host.test",
        "pool.test",
    ];
    let mut allow: Vec<&str> = names.to_vec();
    allow.push("10.0.0.0/8");
    let net = SandboxNet::create(&cfg, &test_id("names"), &spec(false, &allow, &[]))
        .await
        .unwrap();
    let _g = Guard(net.network().clone());
    assert!(
        dns(&net, "allowed.test")
            .await
            .starts_with("A 198.51.100.10")
    );
    // Every way through is tried; what got through is listed at the end.
    let mut leaks = Vec::new();
    // DNS: the reserved answers are refused (REFUSED = 5), never handed out.
    for name in ["loop.test", "meta.test", "host.test", "pool.test"] {
        let got = dns(&net, name).await;
        if got != "RCODE 5" {
            leaks.push(format!("DNS {name}: {got}"));
        }
    }
    // The proxy: a connection to an allowed address naming them reaches nothing.
    let port = canary.to_string();
    for name in ["loop.test", "meta.test", "host.test", "pool.test"] {
        let got = probe(&net, &["httphost", &HTTP_A.to_string(), name, &port]).await;
        if got.contains("canary") || !(got.contains("403") || got.starts_with("ERR")) {
            leaks.push(format!("proxy {name}: {got}"));
        }
    }
    // Directly: the victim stays unreachable under 10.0.0.0/8.
    let got = probe(&net, &["httphost", &vip.to_string(), "pool.test", &port]).await;
    if got.contains("canary") {
        leaks.push(format!("direct to {vip}: {got}"));
    }
    assert!(leaks.is_empty(), "got through: {leaks:#?}");
    // And what is allowed still works.
    assert_eq!(
        probe(&net, &["httphost", &HTTP_A.to_string(), "allowed.test"]).await,
        ok("hello-10")
    );
    net.teardown().await.unwrap();
    victim.teardown().await.unwrap();
}

/// Tightening the rules live cuts the connections they no longer allow (conntrack.rs), and
/// leaves the others open.
#[tokio::test(flavor = "multi_thread")]
async fn tightening_live_cuts_established_connections() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let (net, _g) = create("cut", &EgressSpec::default()).await;
    // Two connections to the byte sinks of .10 and .20; each sends again after a line on
    // stdin and says whether the connection survived.
    let script = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5201), timeout=5)
s.sendall(b'a' * 10)
print('CONNECTED', flush=True)
sys.stdin.readline()
try:
    for i in range(20):
        s.sendall(b'b' * 1000)
        time.sleep(0.05)
    s.shutdown(socket.SHUT_WR)
    print('OK', s.recv(100).decode(), flush=True)
except Exception as e:
    print('ERR', type(e).__name__, flush=True)
"#;
    let mut conns = Vec::new();
    for ip in [HTTP_A, HTTP_B] {
        let mut child = tokio::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &net.network().netns,
                "python3",
                "-c",
                script,
            ])
            .arg(ip.to_string())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        assert_eq!(out.next_line().await.unwrap().as_deref(), Some("CONNECTED"));
        conns.push((child, out));
    }
    net.set_policy(&spec(true, &[], &["198.51.100.20"]))
        .await
        .unwrap();
    let mut results = Vec::new();
    for (child, out) in &mut conns {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"go\n")
            .await
            .unwrap();
        results.push(out.next_line().await.unwrap().unwrap_or_default());
    }
    assert_eq!(
        results[0], "OK 20010",
        "the allowed connection: {results:?}"
    );
    assert!(
        results[1].starts_with("ERR"),
        "the now-denied one: {results:?}"
    );
    net.teardown().await.unwrap();
}

fn leftovers(net: &Network) -> Vec<String> {
    let mut found = Vec::new();
    let netns = String::from_utf8(
        Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    if netns.split_whitespace().any(|n| n == net.netns) {
        found.push(format!("netns {}", net.netns));
    }
    let tables = String::from_utf8(
        Command::new("nft")
            .args(["list", "tables"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    if tables
        .lines()
        .any(|l| l.trim() == format!("table inet sandcell_{}", net.slot))
    {
        found.push(format!("table sandcell_{}", net.slot));
    }
    if std::path::Path::new("/sys/class/net")
        .join(&net.host_if)
        .exists()
    {
        found.push(format!("link {}", net.host_if));
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn teardown_and_reconcile_leave_nothing() {
    let _l = Internet::lock();
    let (a, _ga) = create("tda", &EgressSpec::default()).await;
    let na = a.network().clone();
    assert_eq!(leftovers(&na).len(), 3, "the network was not all there");
    a.teardown().await.unwrap();
    assert_eq!(leftovers(&na), Vec::<String>::new());

    // a "crashed" owner: nothing torn down, then a reconcile that keeps everything else
    let (b, _gb) = create("tdb", &EgressSpec::default()).await;
    let nb = b.network().clone();
    std::mem::forget(b);
    let removed = sandcell_net::reconcile(&|id| id != nb.id).unwrap();
    assert!(removed.contains(&nb.id), "{removed:?}");
    assert_eq!(leftovers(&nb), Vec::<String>::new());
}
