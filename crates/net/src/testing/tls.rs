//! HTTPS upstreams in the fake internet (behind the `testing` feature, like the rest of
//! [`crate::testing`]): a test CA (rcgen) and Python `ssl` servers on an address of their
//! own, for the TLS interception tests and bench (crates/net/tests/egress_tls.rs,
//! crates/net/examples/bench_inject.rs). Each server answers every request with the head it
//! received (`Connection: close`), so a test sees what left the host.

use super::{INET_IF, NETNS, wait_listening};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The upstream: Python's ssl module, answering each request with the head it received.
const SERVER: &str = r#"
import socket, ssl, sys, threading
addr, cert, key = sys.argv[1:4]
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, 443))
s.listen(64)
def serve(c):
    try:
        t = ctx.wrap_socket(c, server_side=True)
        d = b""
        while b"\r\n\r\n" not in d:
            x = t.recv(4096)
            if not x:
                break
            d += x
        t.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(d) + d)
        t.close()
    except Exception:
        c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// A certificate authority of the test's own.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> Result<TestCa, String> {
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        let pem = p.self_signed(&key).map_err(|e| e.to_string())?.pem();
        Ok(TestCa {
            issuer: Issuer::new(p, key),
            pem,
        })
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> &str {
        &self.pem
    }
}

/// An HTTPS server on `ip`:443 of the fake internet; killed on drop (the address stays
/// until the [`super::Internet`] goes).
pub struct TlsUpstream {
    child: Child,
}

impl TlsUpstream {
    /// Starts one with a leaf of `ca` for `names`, its files in `dir`, and waits until it
    /// listens.
    pub fn start(dir: &Path, ca: &TestCa, ip: Ipv4Addr, names: &[&str]) -> Result<Self, String> {
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let leaf = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .and_then(|p| p.signed_by(&key, &ca.issuer))
            .map_err(|e| e.to_string())?;
        let cert: PathBuf = dir.join(format!("{ip}.pem"));
        let keyf: PathBuf = dir.join(format!("{ip}.key"));
        std::fs::write(&cert, leaf.pem()).map_err(|e| e.to_string())?;
        std::fs::write(&keyf, key.serialize_pem()).map_err(|e| e.to_string())?;
        let ok = Command::new("ip")
            .args([
                "-n",
                NETNS,
                "addr",
                "add",
                &format!("{ip}/24"),
                "dev",
                INET_IF,
            ])
            .status()
            .map_err(|e| format!("ip: {e}"))?;
        if !ok.success() {
            return Err(format!("adding {ip} to the fake internet"));
        }
        let child = Command::new("ip")
            .args(["netns", "exec", NETNS, "python3", "-c", SERVER])
            .arg(ip.to_string())
            .args([&cert, &keyf])
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| format!("python3: {e}"))?;
        let upstream = TlsUpstream { child };
        wait_listening(SocketAddr::from((ip, 443)))?;
        Ok(upstream)
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
