//! A real daemon (`sandcell-serve`, gvisor runtime) on an ephemeral loopback port, with its
//! own data and run dirs; the installed `minimal` image is linked in. Needs root, runsc and
//! `make images install` ($SANDCELL_DATA_DIR or /var/lib/sandcell): fails loudly without.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Incoming;
use sandcell_client::{Client, NewSandbox, Sandbox};
use sandcell_proto::agent::{Event, ProcessConfig, ProcessEvent, StartRequest, envelope};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Bounds every wait of the tests, so that a bug hangs nothing (not a speed check).
pub const GUARD: Duration = Duration::from_secs(60);

pub fn installed_data_dir() -> PathBuf {
    std::env::var_os("SANDCELL_DATA_DIR")
        .map_or_else(|| PathBuf::from("/var/lib/sandcell"), PathBuf::from)
}

pub struct Env {
    pub tmp: tempfile::TempDir,
}

impl Env {
    pub fn new() -> Env {
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
        let minimal = installed_data_dir().join("images/minimal");
        assert!(
            minimal.join("rootfs/sbin/sandcell-agent").is_file(),
            "the minimal image is needed at {} (make images install)",
            minimal.display()
        );
        let tmp = tempfile::Builder::new()
            .prefix("sc-srv")
            .tempdir_in("/tmp")
            .unwrap();
        std::fs::create_dir_all(tmp.path().join("data/images")).unwrap();
        std::os::unix::fs::symlink(&minimal, tmp.path().join("data/images/minimal")).unwrap();
        Env { tmp }
    }

    pub fn data(&self) -> PathBuf {
        self.tmp.path().join("data")
    }

    pub fn run_dir(&self) -> PathBuf {
        self.tmp.path().join("run")
    }

    /// A daemon that kills its sandboxes when stopped (so that tests leave nothing
    /// running); kill -9 still leaves them for the next daemon to adopt.
    pub fn start(&self, extra: &[&str]) -> Daemon {
        let mut args = vec!["--kill-on-exit"];
        args.extend_from_slice(extra);
        self.start_with(&args)
    }

    /// A daemon with exactly these extra options.
    pub fn start_with(&self, extra: &[&str]) -> Daemon {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandcell-serve"))
            .env("SANDCELL_RUN_DIR", self.run_dir())
            .arg("--data-dir")
            .arg(self.data())
            .args(["--listen", "127.0.0.1:0", "--runtime", "gvisor"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("sandcell serve: listening on ")
            .unwrap_or_else(|| panic!("unexpected first line from the daemon: {line:?}"))
            .to_string();
        let admin_key = std::fs::read_to_string(self.data().join("admin.key"))
            .unwrap()
            .trim()
            .to_string();
        Daemon {
            child,
            client: Client::new(&url, Some(admin_key.clone())).unwrap(),
            url,
            admin_key,
        }
    }

    /// A new API key, made in the daemon's database as `sandcell keys create` does.
    pub async fn key(&self, name: &str, max: Option<u32>) -> String {
        let db = sandcell_server::keys::open_db(&self.data()).await.unwrap();
        let key = sandcell_server::keys::create_key(&db, name, max, false)
            .await
            .unwrap();
        db.close().await;
        key.plaintext
    }

    /// What sandbox `id` left on the host: its run dir, runsc state, cgroup directories,
    /// mounts under its run dir, and host processes naming it on their command line.
    pub fn traces_of(&self, id: &str) -> Vec<String> {
        let mut found = Vec::new();
        let run_dir = self.run_dir().join(id);
        if run_dir.exists() {
            found.push(format!("run dir {}", run_dir.display()));
        }
        if let Ok(entries) = std::fs::read_dir(self.data().join("runsc")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with(id) {
                    found.push(format!("runsc state {name}"));
                }
            }
        }
        let mut cgroups = vec![PathBuf::from("/sys/fs/cgroup/sandcell").join(id)];
        if let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") {
            for c in controllers.flatten() {
                cgroups.push(c.path().join("sandcell").join(id));
            }
        }
        for cg in cgroups {
            if cg.exists() {
                found.push(format!("cgroup {}", cg.display()));
            }
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let run_dir_text = run_dir.to_string_lossy().into_owned();
        for line in mountinfo.lines() {
            if line.contains(&run_dir_text) {
                found.push(format!("mount {line}"));
            }
        }
        if let Ok(procs) = std::fs::read_dir("/proc") {
            for p in procs.flatten() {
                let Ok(cmdline) = std::fs::read(p.path().join("cmdline")) else {
                    continue;
                };
                let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                if cmdline.contains(id) {
                    found.push(format!(
                        "process {}: {cmdline}",
                        p.file_name().to_string_lossy()
                    ));
                }
            }
        }
        found
    }

    /// Sandbox files left on the host (run dirs).
    pub fn leftovers(&self) -> Vec<String> {
        match std::fs::read_dir(self.run_dir()) {
            Ok(entries) => entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

pub struct Daemon {
    pub child: Child,
    pub url: String,
    pub admin_key: String,
    pub client: Client,
}

impl Daemon {
    /// SIGTERM and wait: the daemon kills its sandboxes first.
    pub fn stop(mut self) {
        // SAFETY: kill with a pid we own and a valid signal.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap();
    }

    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: as in `stop`.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            let _ = self.child.wait();
        }
    }
}

pub fn minimal(timeout: Option<u64>) -> NewSandbox {
    NewSandbox {
        template_id: "minimal".into(),
        timeout,
        ..Default::default()
    }
}

/// A `process.Process/Start` request for `sh -c script`, as an SDK sends it.
pub fn start_request(script: &str) -> Request<Full<Bytes>> {
    let start = StartRequest {
        process: ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            ..Default::default()
        },
        stdin: Some(false),
        tag: None,
    };
    let body = envelope::encode(0, &serde_json::to_vec(&start).unwrap());
    Request::post("/process.Process/Start")
        .header("content-type", "application/connect+json")
        .header("content-length", body.len())
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

/// Reads a Start stream event by event, as it arrives.
pub struct EventStream {
    body: Incoming,
    decoder: envelope::Decoder,
}

impl EventStream {
    pub fn new(resp: hyper::Response<Incoming>) -> EventStream {
        assert!(
            resp.status().is_success(),
            "Start answered {}",
            resp.status()
        );
        EventStream {
            body: resp.into_body(),
            decoder: envelope::Decoder::new(1 << 20),
        }
    }

    /// The next event; `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(env) = self.decoder.next().unwrap() {
                if env.is_end() {
                    return None;
                }
                let ev: ProcessEvent = serde_json::from_slice(&env.message).unwrap();
                return Some(ev.event);
            }
            let frame = tokio::time::timeout(GUARD, self.body.frame())
                .await
                .expect("no event within the guard time")?
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.decoder.push(&data);
            }
        }
    }

    /// Collects stdout until `needle` appeared (or the stream ended); returns all of it.
    pub async fn stdout_until(&mut self, needle: &str) -> String {
        let mut out = String::new();
        while !out.contains(needle) {
            match self.next().await {
                Some(Event::Data(d)) => {
                    if let Some(b64) = d.stdout {
                        use base64::Engine;
                        let bytes = base64::engine::general_purpose::STANDARD
                            .decode(b64)
                            .unwrap();
                        out.push_str(&String::from_utf8_lossy(&bytes));
                    }
                }
                Some(_) => {}
                None => break,
            }
        }
        out
    }

    /// Skips to the end event; its exit code.
    pub async fn exit_code(&mut self) -> i32 {
        while let Some(ev) = self.next().await {
            if let Event::End(end) = ev {
                return end.exit_code;
            }
        }
        panic!("the stream ended without an end event")
    }
}

/// Runs `script` in the sandbox through the proxy and returns (stdout, exit code).
pub async fn run(client: &Client, sandbox: &Sandbox, script: &str) -> (String, i32) {
    use base64::Engine;
    let resp = client.envd(sandbox, start_request(script)).await.unwrap();
    let mut events = EventStream::new(resp);
    let mut out = Vec::new();
    while let Some(ev) = events.next().await {
        match ev {
            Event::Data(d) => {
                if let Some(b64) = d.stdout {
                    out.extend(
                        base64::engine::general_purpose::STANDARD
                            .decode(b64)
                            .unwrap(),
                    );
                }
            }
            Event::End(end) => return (String::from_utf8_lossy(&out).into_owned(), end.exit_code),
            _ => {}
        }
    }
    panic!("the stream ended without an end event")
}

/// An API call with a JSON body; the status and the JSON answer (`Null` if none).
pub async fn call(
    c: &Client,
    method: hyper::Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> (hyper::StatusCode, serde_json::Value) {
    let resp = c.api(method, path, body.as_ref()).await.unwrap();
    let json = serde_json::from_slice(&resp.body).unwrap_or(serde_json::Value::Null);
    (resp.status, json)
}

/// Polls template build `build`'s status until it ends; the last answer and every log
/// message.
pub async fn wait_build(c: &Client, name: &str, build: &str) -> (serde_json::Value, Vec<String>) {
    let started = std::time::Instant::now();
    let mut messages = Vec::new();
    loop {
        let path = format!(
            "/templates/{name}/builds/{build}/status?logsOffset={}",
            messages.len()
        );
        let (status, body) = call(c, hyper::Method::GET, &path, None).await;
        assert_eq!(status, hyper::StatusCode::OK, "{body}");
        let entries = body["logEntries"].as_array().unwrap();
        messages.extend(
            entries
                .iter()
                .map(|e| e["message"].as_str().unwrap().to_string()),
        );
        let state = body["status"].as_str().unwrap();
        if (state == "ready" || state == "error") && entries.is_empty() {
            return (body, messages);
        }
        assert!(started.elapsed() < GUARD * 5, "build {build} still {state}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
