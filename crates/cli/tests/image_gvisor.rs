//! `sandcell image` end to end: an image made here, pushed to a real local registry
//! (docker-registry on loopback), pulled by the real binary, then run on the gvisor runtime
//! (`sandcell run --image NAME`) and used by the daemon as a template (its Env, WorkingDir
//! and User applied). Needs root, runsc, docker-registry, skopeo, busybox-static and the
//! installed agent; fails loudly without them.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "../../image/tests/common/mod.rs"]
mod registry;

use common::{Daemon, require_root_and_runsc, text};
use registry::*;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};

/// A registry holding the layered test image as `test/layers:v1`, and a temp data dir.
struct Setup {
    registry: Registry,
    tmp: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        require_root_and_runsc();
        let registry = Registry::start(None);
        let tmp = tempfile::Builder::new()
            .prefix("sc-img")
            .tempdir_in("/tmp")
            .unwrap();
        let mut layout = Layout::new(&tmp.path().join("layout"));
        let desc = layout.image(&layered_image_layers(), "amd64", layered_image_config());
        layout.tag(desc, "v1");
        push(
            &layout.dir,
            "v1",
            &format!("{}/test/layers:v1", registry.host()),
            None,
        );
        Setup { registry, tmp }
    }

    fn data(&self) -> PathBuf {
        self.tmp.path().join("data")
    }

    fn sandcell(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandcell"));
        cmd.env("SANDCELL_DATA_DIR", self.data())
            .env("SANDCELL_RUN_DIR", self.tmp.path().join("run"))
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.sandcell(args).output().unwrap();
        assert!(
            out.status.success(),
            "sandcell {args:?}: {}: {}",
            out.status,
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    fn pull(&self, name: &str) -> serde_json::Value {
        let host = self.registry.host();
        let reference = format!("{host}/test/layers:v1");
        let agent = agent();
        let out = self.ok(&[
            "image",
            "pull",
            &reference,
            "--name",
            name,
            "--insecure-registry",
            &host,
            "--agent",
            agent.to_str().unwrap(),
            "--json",
        ]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("pull --json printed {out:?}: {e}"))
    }

    fn run(&self, image: &str, script: &str) -> Output {
        self.sandcell(&[
            "run",
            "--runtime",
            "gvisor",
            "--image",
            image,
            "--",
            "/bin/sh",
            "-c",
            script,
        ])
        .output()
        .unwrap()
    }
}

#[test]
fn a_pulled_image_runs_with_its_layers_intact() {
    let s = Setup::new();
    let report = s.pull("layers");
    assert_eq!(report["name"], "layers");
    assert_eq!(report["layers"], 2);

    let ls: serde_json::Value = serde_json::from_str(&s.ok(&["image", "ls", "--json"])).unwrap();
    let entry = ls
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "layers")
        .unwrap()
        .clone();
    assert_eq!(entry["config"]["workingDir"], "/data");
    assert!(
        entry["config"]["source"]
            .as_str()
            .unwrap()
            .ends_with("/test/layers:v1")
    );

    let script = "\
        test ! -e /data/removed.txt && echo file-whiteout-ok; \
        test ! -e /data/gone && echo dir-whiteout-ok; \
        echo opq: $(ls /opq); \
        cat /data/keep; echo; \
        stat -c 'suid %a %u %g' /suid/prog; \
        stat -c 'sgid %a %g' /suid/sgid; \
        stat -c 'sticky %a' /suid/sticky; \
        stat -c 'owned %u %g %a' /owned; \
        echo links $(stat -c %h /hl/orig) $(stat -c %i /hl/orig) $(stat -c %i /hl/link); \
        test -L /swap/was-dir && test -d /swap/was-file && echo swaps-ok";
    let out = s.run("layers", script);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "run: {}: {}{}",
        out.status,
        stdout,
        text(&out.stderr)
    );
    for expected in [
        "file-whiteout-ok",
        "dir-whiteout-ok",
        "opq: new\n",
        "kept\n",
        "suid 4755 0 0",
        "sgid 2775 1000",
        "sticky 1777",
        "owned 1000 1000 640",
        "swaps-ok",
    ] {
        assert!(
            stdout.contains(expected),
            "{expected:?} not in the sandbox's output:\n{stdout}"
        );
    }
    let links: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with("links "))
        .unwrap()
        .split(' ')
        .collect();
    assert_eq!(links[1], "2", "{stdout}");
    assert_eq!(
        links[2], links[3],
        "hard-linked files have one inode: {stdout}"
    );
}

#[test]
fn an_image_in_use_is_not_removed() {
    let s = Setup::new();
    s.pull("busy");
    // A sandbox that says when it is up, then lives until its --timeout.
    let mut run: Child = s
        .sandcell(&[
            "run",
            "--runtime",
            "gvisor",
            "--image",
            "busy",
            "--timeout",
            "20",
            "--",
            "/bin/sh",
            "-c",
            "echo up; sleep 60",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(run.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "up\n");
    let out = s.sandcell(&["image", "rm", "busy"]).output().unwrap();
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("in use"),
        "rm while running: {}: {stderr}",
        out.status
    );
    assert!(s.data().join("images/busy/rootfs/bin/busybox").is_file());
    // SAFETY: kill with a pid we own and a valid signal.
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let _ = run.wait();
    // The run command tears its sandbox down on SIGTERM; wait for the gofer to let go.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = s.sandcell(&["image", "rm", "busy"]).output().unwrap();
        if out.status.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "rm after the sandbox ended: {}",
            text(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert!(!s.data().join("images/busy").exists());
}

#[test]
fn the_daemon_applies_the_image_defaults() {
    let s = Setup::new();
    s.pull("withdefaults");
    let daemon = Daemon::start_on(&s.data(), &[]);
    let out = daemon.run(&[
        "create",
        "--template",
        "withdefaults",
        "--timeout",
        "60",
        "--env",
        "EXTRA=from-request",
    ]);
    assert!(out.status.success(), "create: {}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let out = daemon.run(&[
        "exec",
        &id,
        "--",
        "/bin/sh",
        "-c",
        "echo $GREETING; echo $EXTRA; pwd; id -un",
    ]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "exec: {}: {stdout}{}",
        out.status,
        text(&out.stderr)
    );
    assert_eq!(stdout, "hello from the image\nfrom-request\n/data\nuser\n");
}
