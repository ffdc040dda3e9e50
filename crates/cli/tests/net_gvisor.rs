//! `sandcell net ...` and the network flags of `sandcell create`, the real binary against a
//! real `sandcell serve` (gvisor runtime, networks on, own data and run dirs, the installed
//! `minimal` image linked in). Needs root, runsc, iproute2, nftables and `make images
//! install`; fails loudly without them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

struct Daemon {
    tmp: tempfile::TempDir,
    child: Child,
    url: String,
}

impl Daemon {
    fn start() -> Daemon {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "these tests need root");
        let data = std::env::var_os("SANDCELL_DATA_DIR")
            .map_or_else(|| "/var/lib/sandcell".into(), std::path::PathBuf::from);
        let minimal = data.join("images/minimal");
        assert!(
            minimal.join("rootfs/sbin/sandcell-agent").is_file(),
            "the minimal image is needed at {} (make images install)",
            minimal.display()
        );
        let tmp = tempfile::Builder::new()
            .prefix("sc-clin")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::create_dir_all(tmp.path().join("data/images")).unwrap();
        std::os::unix::fs::symlink(&minimal, tmp.path().join("data/images/minimal")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandcell"))
            .env("SANDCELL_RUN_DIR", tmp.path().join("run"))
            .arg("--data-dir")
            .arg(tmp.path().join("data"))
            .args(["serve", "--listen", "127.0.0.1:0", "--runtime", "gvisor"])
            .args(["--kill-on-exit", "--net-pool", "10.204.0.0/16"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("sandcell serve: listening on ")
            .unwrap_or_else(|| panic!("unexpected first line from the daemon: {line:?}"))
            .to_string();
        Daemon { tmp, child, url }
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_sandcell"))
            .env_remove("SANDCELL_API_KEY")
            .env("SANDCELL_URL", &self.url)
            .env("SANDCELL_DATA_DIR", self.tmp.path().join("data"))
            .env("SANDCELL_CONFIG", self.tmp.path().join("no-config.toml"))
            .env("HOME", self.tmp.path())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "sandcell {args:?} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill with a pid we own and a valid signal (--kill-on-exit: the daemon
        // kills its sandboxes first).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

#[test]
fn net_commands_and_create_flags() {
    let d = Daemon::start();
    assert_eq!(d.ok(&["net", "create", "team"]).trim(), "team");
    let again = d.run(&["net", "create", "team"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));

    let a = d.ok(&[
        "create",
        "-t",
        "minimal",
        "--no-internet",
        "--network",
        "team",
    ]);
    let a = a.trim();
    let b = d.ok(&["create", "-t", "minimal", "--allow-out", "198.51.100.10"]);
    let b = b.trim();

    // a refused attempt shows in the log
    let _ = d.run(&["exec", a, "--", "nc", "-w", "2", "169.254.169.254", "80"]);
    let log = d.json(&["net", "log", a, "--json"]);
    assert!(
        log["flows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["dest"] == "169.254.169.254" && f["port"] == 80),
        "{log}"
    );
    assert!(d.ok(&["net", "log", a]).contains("169.254.169.254"));

    d.ok(&["net", "join", b, "team"]);
    let nets = d.json(&["net", "ls", "--json"]);
    assert_eq!(nets[0]["members"].as_array().unwrap().len(), 2, "{nets}");
    assert!(d.ok(&["net", "ls"]).contains("team"));
    d.ok(&["net", "leave", b, "team"]);

    d.ok(&["net", "rules", b, "--allow-out", "1.2.3.4,*.example.com"]);
    let bad = d.run(&["net", "rules", b, "--deny-out", "example.com"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("example.com"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let bad = d.run(&["create", "-t", "minimal", "--allow-out", "10.0.0.1/8"]);
    assert_eq!(bad.status.code(), Some(1));

    assert_eq!(d.ok(&["net", "rm", "team"]).trim(), "team");
    assert_eq!(d.run(&["net", "rm", "team"]).status.code(), Some(1));
    d.ok(&["kill", a, b]);
}
