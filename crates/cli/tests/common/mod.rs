//! What the CLI's end-to-end tests share: the host check (root, runsc, the installed
//! `minimal` image) and a real `sandcell serve` on loopback with its own data and run dirs.
//! Each test file uses part of it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// Where `make images install` put the images: `$SANDCELL_DATA_DIR` or /var/lib/sandcell.
pub fn installed_data_dir() -> PathBuf {
    std::env::var_os("SANDCELL_DATA_DIR")
        .map_or_else(|| PathBuf::from("/var/lib/sandcell"), PathBuf::from)
}

/// Fails loudly unless this host can run gvisor sandboxes: root, runsc on $PATH and the
/// installed `minimal` image. Returns that image's directory.
pub fn require_gvisor_host() -> PathBuf {
    require_root_and_runsc();
    let minimal = installed_data_dir().join("images/minimal");
    assert!(
        minimal.join("rootfs/sbin/sandcell-agent").is_file(),
        "the minimal image with the agent is needed at {} (run `make images install`)",
        minimal.display()
    );
    minimal
}

/// A data dir and run dir of their own under /tmp for the CLI's local commands (`template
/// build`, `run`), whose images dir links the installed `minimal` image; made after
/// [`require_gvisor_host`].
pub struct LocalDirs {
    pub tmp: tempfile::TempDir,
}

impl LocalDirs {
    pub fn new(prefix: &str) -> LocalDirs {
        let minimal = require_gvisor_host();
        let tmp = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/tmp")
            .unwrap();
        let images = tmp.path().join("data/images");
        std::fs::create_dir_all(&images).unwrap();
        std::os::unix::fs::symlink(&minimal, images.join("minimal")).unwrap();
        LocalDirs { tmp }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    /// `sandcell ARGS` on these dirs, its output.
    pub fn sandcell(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_sandcell"))
            .env("SANDCELL_DATA_DIR", self.path("data"))
            .env("SANDCELL_RUN_DIR", self.path("run"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }
}

/// Fails loudly unless this process is root and runsc is on $PATH.
pub fn require_root_and_runsc() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "these tests need root (the gvisor runtime: runsc, overlayfs, cgroups)"
    );
    assert!(
        Command::new("runsc")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "runsc is needed on $PATH (apt install runsc)"
    );
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Spawns `sandcell serve` (the given command, stdout piped) and returns it with the URL
/// from its first line, `sandcell serve: listening on URL`.
pub fn spawn_daemon(mut serve: Command) -> (Child, String) {
    let mut child = serve
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
    (child, url)
}

/// A `sandcell serve --runtime gvisor` on 127.0.0.1 with data and run dirs in its own temp
/// dir (the installed `minimal` image linked in). On drop, its sandboxes are killed, then
/// the daemon (a stopping daemon leaves sandboxes running for the next start to re-adopt;
/// they must not outlive the test).
pub struct Daemon {
    pub tmp: tempfile::TempDir,
    pub child: Child,
    pub url: String,
    data: PathBuf,
}

impl Daemon {
    /// `prefix` names the temp dir (to tell tests apart in /tmp); `serve_args` are added to
    /// `serve --listen 127.0.0.1:0 --runtime gvisor`.
    pub fn start(prefix: &str, serve_args: &[&str]) -> Daemon {
        let LocalDirs { tmp } = LocalDirs::new(prefix);
        let data = tmp.path().join("data");
        Self::serve(tmp, data, serve_args)
    }

    /// As `start`, on a data dir the test prepared (its own images); the temp dir holds the
    /// run dir and the client's home.
    pub fn start_on(data: &Path, serve_args: &[&str]) -> Daemon {
        require_root_and_runsc();
        let tmp = tempfile::Builder::new()
            .prefix("sc-clid")
            .tempdir_in("/tmp")
            .unwrap();
        Self::serve(tmp, data.to_path_buf(), serve_args)
    }

    fn serve(tmp: tempfile::TempDir, data: PathBuf, serve_args: &[&str]) -> Daemon {
        let mut serve = Command::new(env!("CARGO_BIN_EXE_sandcell"));
        serve
            .env("SANDCELL_RUN_DIR", tmp.path().join("run"))
            .arg("--data-dir")
            .arg(&data)
            .args(["serve", "--listen", "127.0.0.1:0", "--runtime", "gvisor"])
            .args(serve_args);
        let (child, url) = spawn_daemon(serve);
        Daemon {
            tmp,
            child,
            url,
            data,
        }
    }

    pub fn data(&self) -> PathBuf {
        self.data.clone()
    }

    /// `sandcell ARGS` as a client of this daemon, stdin empty, no user config: the key comes
    /// from the daemon's admin.key through `SANDCELL_DATA_DIR`.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandcell"));
        client_env(&mut cmd, &self.url, &self.data(), self.tmp.path());
        cmd.args(args).stdin(Stdio::null());
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Runs and asserts success; stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "sandcell {args:?} failed with {}: {}",
            out.status,
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        json(&self.ok(args))
    }

    /// Kills every sandbox the daemon lists (best effort: used on the way out).
    pub fn kill_all(&self) {
        let Ok(out) = self.cmd(&["ls", "--json"]).output() else {
            return;
        };
        let ids: Vec<String> = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|s| s["sandboxID"].as_str().map(str::to_string))
            .collect();
        if !ids.is_empty() {
            let mut args = vec!["kill"];
            args.extend(ids.iter().map(String::as_str));
            let _ = self.cmd(&args).output();
        }
    }
}

/// The environment of a CLI client of the daemon at `url`: no API key from the caller's
/// environment, `HOME` and `SANDCELL_CONFIG` inside `home` (no user config is read).
pub fn client_env(cmd: &mut Command, url: &str, data: &Path, home: &Path) {
    cmd.env_remove("SANDCELL_API_KEY")
        .env("SANDCELL_URL", url)
        .env("SANDCELL_DATA_DIR", data)
        .env("SANDCELL_CONFIG", home.join("no-config.toml"))
        .env("HOME", home);
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill_all();
            // SAFETY: kill with a pid we own and a valid signal.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
    }
}
