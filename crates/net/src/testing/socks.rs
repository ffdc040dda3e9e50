//! A real SOCKS5 server for the `egressProxy` tests: pproxy from PyPI (pinned, [`PPROXY`]),
//! installed once into a venv cached under `~/.cache/sandcell/pproxy-venv` (as the e2b
//! tests cache theirs), run on loopback or inside the fake internet's namespace. Its `-v`
//! log names every connection it carried (`socks5 <client> -> <target>`) and every refused
//! login (`Unauthorized SOCKS ...`).

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The pinned package.
pub const PPROXY: &str = "pproxy==2.7.9";

pub struct Socks5Server {
    child: Option<Child>,
    log: PathBuf,
    dir: PathBuf,
    pub addr: SocketAddr,
}

/// The venv with pproxy, made (under a lock: tests run in parallel processes) if missing.
fn venv() -> Result<PathBuf, String> {
    let home = std::env::var_os("HOME").ok_or("HOME is not set")?;
    let cache = PathBuf::from(home).join(".cache/sandcell");
    std::fs::create_dir_all(&cache).map_err(|e| format!("{}: {e}", cache.display()))?;
    let venv = cache.join("pproxy-venv");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache.join("pproxy-venv.lock"))
        .map_err(|e| e.to_string())?;
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor we own (released when `lock` is closed).
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    }
    let pins = venv.join(".sandcell-pins");
    if std::fs::read_to_string(&pins).ok().as_deref() == Some(PPROXY) {
        return Ok(venv);
    }
    let _ = std::fs::remove_dir_all(&venv);
    let run = |cmd: &mut Command| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{cmd:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(())
    };
    run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    run(Command::new(venv.join("bin/pip")).args(["install", "-q", PPROXY]))?;
    std::fs::write(&pins, PPROXY).map_err(|e| e.to_string())?;
    Ok(venv)
}

impl Socks5Server {
    /// pproxy listening on `addr`, asking for `auth` (user, password) if given; in network
    /// namespace `netns` if given, resolving names there with `dns` (its own resolv.conf in
    /// a mount namespace of its own).
    pub fn start(
        addr: SocketAddr,
        auth: Option<(&str, &str)>,
        netns: Option<&str>,
        dns: Option<std::net::Ipv4Addr>,
    ) -> Result<Socks5Server, String> {
        let venv = venv()?;
        let dir =
            std::env::temp_dir().join(format!("sct-pproxy-{}-{}", std::process::id(), addr.port()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let log = dir.join("pproxy.log");
        let listen = match auth {
            Some((u, p)) => format!("socks5://{addr}#{u}:{p}"),
            None => format!("socks5://{addr}"),
        };
        let pproxy = venv.join("bin/pproxy");
        // `--auth -1`: every connection logs in (pproxy otherwise lets an address that
        // logged in once back in without credentials for 30 days).
        let mut inner = format!("exec {} -l '{listen}' --auth -1 -v", pproxy.display());
        if let Some(dns) = dns {
            let resolv = dir.join("resolv.conf");
            std::fs::write(&resolv, format!("nameserver {dns}\n")).map_err(|e| e.to_string())?;
            inner = format!(
                "mount --bind {} /etc/resolv.conf && {inner}",
                resolv.display()
            );
        }
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "unshare", "-m", "sh", "-c", &inner]);
                c
            }
            None => {
                let mut c = Command::new("sh");
                c.args(["-c", &inner]);
                c
            }
        };
        let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
        let err = file.try_clone().map_err(|e| e.to_string())?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("starting pproxy: {e}"))?;
        let mut server = Socks5Server {
            child: Some(child),
            log,
            dir,
            addr,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if Instant::now() > deadline {
                let log = server.log();
                server.stop();
                return Err(format!("pproxy did not listen on {addr}: {log}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(server)
    }

    /// What pproxy logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops it: its port refuses connections afterwards.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Socks5Server {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
