//! `sandcell net ...` and the network flags of `sandcell create`, the real binary against a
//! real `sandcell serve` (gvisor runtime, networks on, own data and run dirs, the installed
//! `minimal` image linked in). Needs root, runsc, iproute2, nftables and `make images
//! install`; fails loudly without them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::Daemon;

/// Networks on, in a pool of their own; `--kill-on-exit`: SIGTERM kills the sandboxes.
fn start() -> Daemon {
    Daemon::start(
        "sc-clin",
        &["--kill-on-exit", "--net-pool", "10.204.0.0/16"],
    )
}

#[test]
fn net_commands_and_create_flags() {
    let d = start();
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
