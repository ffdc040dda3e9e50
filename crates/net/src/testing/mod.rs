//! Test support for this crate's and the runtimes', daemon's and CLI's tests, behind the
//! `testing` feature that only their dev-dependencies enable (never a production build): a
//! fake "internet" in its own network namespace, reachable from the host through a veth, with
//! HTTP servers and a DNS server (dnsmasq) on TEST-NET-2 addresses (198.51.100.0/24) that
//! exist only inside the test. Everything is removed on drop, also when a test fails.
//!
//! ```text
//! host sct-h 198.51.100.1/24 ── veth ── sct-i (netns sct-inet): .2, .10 (HTTP "hello-10"),
//!                                                             .20 (HTTP "hello-20"), .53 (DNS)
//! DNS zone: allowed.test, *.wild.test -> .10; other.test -> .20 (TTL 60); names that must
//! lead nowhere: loop.test -> 127.0.0.1, meta.test -> 169.254.169.254, host.test -> the host's
//! 198.51.100.1; more with [`Internet::add_host`]
//! IPv6: host 2001:db8:100::1/64, HTTP on ::10 ("hello6-10") and ::20 ("hello6-20");
//! AAAA allowed.test -> 2001:db8:100::10
//! port 443 of .10 and .20: a TCP server answering "tls-10" / "tls-20" to anything
//! port 8443 of .10 and .20: the same, answering "tls-10-8443" / "tls-20-8443"
//! port 8080 of .10 and .20: HTTP answering "hello-10-8080" / "hello-20-8080" to any GET
//! port 2222 of .10 and .20: a server that speaks first ("banner-10" / "banner-20"), as SSH
//! port 5201 of .10 and .20: a sink that reads and discards what comes, then says how many bytes
//! ```
//!
//! HTTPS upstreams of a test CA on addresses of their own: [`TlsUpstream`] (tls.rs).
//!
//! Only one [`Internet`] can exist on a host at a time (fixed names and addresses): tests
//! using it take [`Internet::lock`] first.

mod socks;
mod tls;
pub use socks::Socks5Server;
pub use tls::{TestCa, TlsUpstream};

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const NETNS: &str = "sct-inet";
pub const HOST_IF: &str = "sct-h";
pub const INET_IF: &str = "sct-i";
pub const HTTP_A: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
pub const HTTP_B: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 20);
pub const DNS: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 53);
pub const HTTP6_A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x10);
pub const HTTP6_B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x20);

pub struct Internet {
    children: Vec<Child>,
    _dirs: Vec<std::path::PathBuf>,
    /// dnsmasq's extra hosts file ([`Internet::add_host`]) and its process id.
    hosts: std::path::PathBuf,
    dnsmasq: u32,
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Held while a test uses the fake internet: an exclusive `flock`, so that tests in other
/// processes (nextest runs each test in its own) wait too.
pub struct InternetLock(std::fs::File);

impl Drop for InternetLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor we own; closing it would release the lock too.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

impl Internet {
    /// Serializes the tests of this host that use the fake internet.
    pub fn lock() -> InternetLock {
        use std::os::fd::AsRawFd;
        let path = "/run/sandcell-test-internet.lock";
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .unwrap_or_else(|e| panic!("opening {path}: {e}"));
        // SAFETY: flock on a descriptor we own; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            panic!("locking {path}: {}", std::io::Error::last_os_error());
        }
        InternetLock(file)
    }

    /// Builds it (after removing a leftover of a killed test run). Fails loudly when `ip`,
    /// `dnsmasq` or `python3` are missing.
    pub fn start() -> Result<Internet, String> {
        let _ = sh(&["ip", "netns", "delete", NETNS]);
        let _ = sh(&["ip", "link", "delete", HOST_IF]);
        let hosts_dir = std::env::temp_dir().join(format!("sct-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&hosts_dir).map_err(|e| e.to_string())?;
        let hosts = hosts_dir.join("hosts");
        std::fs::write(&hosts, "").map_err(|e| e.to_string())?;
        let mut inet = Internet {
            children: Vec::new(),
            _dirs: vec![hosts_dir],
            hosts,
            dnsmasq: 0,
        };
        sh(&["ip", "netns", "add", NETNS])?;
        sh(&[
            "ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", INET_IF, "netns", NETNS,
        ])?;
        sh(&["ip", "addr", "add", "198.51.100.1/24", "dev", HOST_IF])?;
        sh(&["ip", "link", "set", HOST_IF, "up"])?;
        for a in [
            "198.51.100.2/24",
            "198.51.100.10/24",
            "198.51.100.20/24",
            "198.51.100.53/24",
        ] {
            sh(&["ip", "-n", NETNS, "addr", "add", a, "dev", INET_IF])?;
        }
        sh(&[
            "ip",
            "-6",
            "addr",
            "add",
            "2001:db8:100::1/64",
            "dev",
            HOST_IF,
            "nodad",
        ])?;
        for a in ["2001:db8:100::10/64", "2001:db8:100::20/64"] {
            sh(&[
                "ip", "-n", NETNS, "-6", "addr", "add", a, "dev", INET_IF, "nodad",
            ])?;
        }
        sh(&["ip", "-n", NETNS, "link", "set", INET_IF, "up"])?;
        sh(&["ip", "-n", NETNS, "link", "set", "lo", "up"])?;
        sh(&[
            "ip",
            "-n",
            NETNS,
            "route",
            "add",
            "default",
            "via",
            "198.51.100.1",
        ])?;
        sh(&[
            "ip",
            "-n",
            NETNS,
            "-6",
            "route",
            "add",
            "default",
            "via",
            "2001:db8:100::1",
        ])?;
        for (ip, body) in [(HTTP_A, "hello-10"), (HTTP_B, "hello-20")] {
            let dir = std::env::temp_dir().join(format!("sct-www-{}-{ip}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            std::fs::write(dir.join("index.html"), body).map_err(|e| e.to_string())?;
            let child = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    NETNS,
                    "python3",
                    "-m",
                    "http.server",
                    "--bind",
                ])
                .arg(ip.to_string())
                .arg("80")
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("python3 -m http.server: {e}"))?;
            inet.children.push(child);
            inet._dirs.push(dir);
        }
        // The other services, one Python process per address: "TLS" servers (TCP servers
        // that answer whatever comes with "tls-<n>": the proxy forwards bytes, no TLS stack
        // is needed to see where they go), a second HTTP port, a speak-first banner and a
        // byte sink (the throughput benchmark's far end).
        for (ip, ip6, n) in [(HTTP_A, HTTP6_A, "10"), (HTTP_B, HTTP6_B, "20")] {
            let script = format!(
                "import socket,threading\n\
                 def tls(c,p):\n c.recv(4096);c.sendall(b'tls-{n}'+p+b'\\n');c.close()\n\
                 def http(c,p):\n c.recv(4096);c.sendall(b'HTTP/1.0 200 OK\\r\\n\\r\\nhello-{n}-8080\\n');c.close()\n\
                 def http6(c,p):\n c.recv(4096);c.sendall(b'HTTP/1.0 200 OK\\r\\n\\r\\nhello6-{n}\\n');c.close()\n\
                 def banner(c,p):\n c.sendall(b'banner-{n}\\n');c.recv(4096);c.close()\n\
                 def sink(c,p):\n t=0\n while True:\n  d=c.recv(1<<16)\n  if not d: break\n  t+=len(d)\n c.sendall(str(t).encode());c.close()\n\
                 def serve(port,f,p,fam=socket.AF_INET,a='{ip}'):\n s=socket.socket(fam);s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n s.bind((a,port));s.listen(64)\n while True:\n  c,_=s.accept();threading.Thread(target=f,args=(c,p),daemon=True).start()\n\
                 for port,f,p in [(443,tls,b''),(8443,tls,b'-8443'),(8080,http,b''),(2222,banner,b''),(5201,sink,b'')]:\n threading.Thread(target=serve,args=(port,f,p)).start()\n\
                 threading.Thread(target=serve,args=(80,http6,b'',socket.AF_INET6,'{ip6}')).start()\n"
            );
            let child = Command::new("ip")
                .args(["netns", "exec", NETNS, "python3", "-c", &script])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("python3 (test services): {e}"))?;
            inet.children.push(child);
        }
        let child = Command::new("ip")
            .args(["netns", "exec", NETNS, "dnsmasq", "--keep-in-foreground"])
            .args([
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
            ])
            .args([
                "--listen-address=198.51.100.53",
                "--pid-file=",
                "--user=root",
            ])
            .args([
                "--address=/allowed.test/198.51.100.10",
                "--address=/allowed.test/2001:db8:100::10",
                "--address=/wild.test/198.51.100.10",
            ])
            .args(["--address=/other.test/198.51.100.20", "--local-ttl=60"])
            .args([
                "--address=/loop.test/127.0.0.1",
                "--address=/meta.test/169.254.169.254",
                "--address=/host.test/198.51.100.1",
            ])
            .arg(format!("--addn-hosts={}", inet.hosts.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("dnsmasq (apt install dnsmasq-base): {e}"))?;
        inet.dnsmasq = child.id();
        inet.children.push(child);
        for at in [HTTP6_A, HTTP6_B] {
            wait_listening(SocketAddr::from((at, 80)))?;
        }
        for (ip, port) in [
            (HTTP_A, 80),
            (HTTP_B, 80),
            (HTTP_A, 443),
            (HTTP_B, 443),
            (HTTP_A, 8443),
            (HTTP_A, 8080),
            (HTTP_A, 2222),
            (HTTP_B, 2222),
            (HTTP_A, 5201),
            (DNS, 53),
        ] {
            wait_listening(SocketAddr::from((ip, port)))?;
        }
        Ok(inet)
    }

    pub fn upstream_dns() -> Vec<SocketAddr> {
        vec![SocketAddr::from((DNS, 53))]
    }

    /// Makes the fake DNS answer `name` with `ip` (e.g. another sandbox's address), and
    /// waits until it does.
    pub fn add_host(&self, name: &str, ip: Ipv4Addr) -> Result<(), String> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.hosts)
            .map_err(|e| e.to_string())?;
        writeln!(f, "{ip} {name}").map_err(|e| e.to_string())?;
        let pid = libc::pid_t::try_from(self.dnsmasq).map_err(|e| e.to_string())?;
        // SAFETY: kill has no memory effects; the pid is our own dnsmasq child.
        unsafe { libc::kill(pid, libc::SIGHUP) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if resolve_a(name).as_deref() == Some(&[ip][..]) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(format!("the test DNS does not answer {name} with {ip}"))
    }
}

/// The A records the test DNS gives for `name` (asked from the host), if it answers.
fn resolve_a(name: &str) -> Option<Vec<Ipv4Addr>> {
    let q = crate::dns::wire::build_query(0x5151, name, crate::dns::wire::TYPE_A)?;
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .ok()?;
    sock.send_to(&q, (DNS, 53)).ok()?;
    let mut buf = [0u8; 1500];
    let n = sock.recv(&mut buf).ok()?;
    let a = crate::dns::wire::parse_answer(&buf[..n]).ok()?;
    Some(a.addresses.iter().map(|(ip, _)| *ip).collect())
}

fn wait_listening(at: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if TcpStream::connect_timeout(&at, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("nothing listens on {at} in the test internet"))
}

impl Drop for Internet {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = sh(&["ip", "netns", "delete", NETNS]);
        let _ = sh(&["ip", "link", "delete", HOST_IF]);
        for d in &self._dirs {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}
