//! The warm pool (`serve --warm N`, server/src/sandboxes/warm.rs) through the real binary
//! against a real `sandcell serve` (gvisor runtime, networks on in a pool of their own, the
//! installed `minimal` image as the pool's template). Needs root, runsc, iproute2, nftables
//! and `make images install`; fails loudly without them.
//!
//! What must hold: a sandbox taken from the pool shares nothing with another (env, files,
//! processes, random state, network), pooled sandboxes are no one's (not listed, not
//! counted), an empty pool still serves creates, and a daemon restart neither leaks the
//! previous daemon's pooled sandboxes nor hands one out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{Daemon, spawn_daemon};

const POOL_FLAGS: [&str; 6] = [
    "--kill-on-exit",
    "--net-pool",
    "10.206.0.0/16",
    "--warm-template",
    "minimal",
    "--warm",
];

fn start(warm: &str) -> Daemon {
    let mut args = POOL_FLAGS.to_vec();
    args.push(warm);
    Daemon::start("sc-cliw", &args)
}

/// `GET /metrics` of the daemon at `url` (`http://127.0.0.1:PORT`).
fn metrics(url: &str) -> String {
    let addr = url.strip_prefix("http://").unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The value of an unlabelled series in the exposition text.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

/// Waits (at most two minutes: boots on a loaded 2-core host) for the pool to hold `n`.
fn wait_idle(url: &str, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let idle = metric(&metrics(url), "sandcell_warm_pool_idle");
        if idle >= n {
            return;
        }
        assert!(Instant::now() < deadline, "the pool holds {idle}, not {n}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn sh(d: &Daemon, id: &str, script: &str) -> String {
    d.ok(&["exec", id, "--", "sh", "-c", script])
}

#[test]
fn pooled_sandboxes_are_independent_and_no_ones() {
    let d = start("2");
    wait_idle(&d.url, 2);
    // Idle pooled sandboxes are no one's: not listed, not in the state gauge.
    let listed = d.json(&["ls", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 0, "{listed}");
    let m = metrics(&d.url);
    assert!(m.contains("sandcell_sandboxes{state=\"running\"} 0"), "{m}");

    let a = d.ok(&["create", "-t", "minimal", "-e", "WHO=a", "--timeout", "120"]);
    let b = d.ok(&["create", "-t", "minimal", "-e", "WHO=b", "--timeout", "120"]);
    let (a, b) = (a.trim(), b.trim());
    let m = metrics(&d.url);
    assert_eq!(metric(&m, "sandcell_warm_pool_hits_total"), 2, "{m}");

    // Each has its own identity: the id as hostname, its env only.
    assert_eq!(sh(&d, a, "echo $WHO $(hostname)").trim(), format!("a {a}"));
    assert_eq!(sh(&d, b, "echo $WHO $(hostname)").trim(), format!("b {b}"));
    // Files and processes of one are not in the other.
    sh(&d, a, "echo secret > /tmp/a-file; (sleep 600 &) ; true");
    assert_eq!(
        sh(&d, b, "cat /tmp/a-file 2>/dev/null || echo none").trim(),
        "none"
    );
    let procs = sh(&d, b, "ps -o args");
    assert!(!procs.contains("sleep 600"), "{procs}");
    assert!(sh(&d, a, "ps -o args").contains("sleep 600"));
    // Fresh random state each.
    let rand = |id: &str| sh(&d, id, "head -c 16 /dev/urandom | od -An -tx1");
    assert_ne!(rand(a), rand(b));
    // Networks of their own.
    let addr = |id: &str| sh(&d, id, "ip -4 -o addr show scope global");
    let (na, nb) = (addr(a), addr(b));
    assert!(na.contains("inet "), "{na}");
    assert_ne!(na, nb);

    // Listed now, as any create.
    let listed = d.json(&["ls", "--json"]);
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    d.ok(&["kill", a, b]);
}

#[test]
fn an_empty_pool_still_serves_creates() {
    let d = start("1");
    wait_idle(&d.url, 1);
    // Three at once against a pool of one: at least two find it empty and boot.
    let ids: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|i| {
                let d = &d;
                s.spawn(move || {
                    let env = format!("N={i}");
                    d.ok(&["create", "-t", "minimal", "-e", &env, "--timeout", "120"])
                        .trim()
                        .to_string()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let m = metrics(&d.url);
    assert_eq!(
        metric(&m, "sandcell_warm_pool_hits_total") + metric(&m, "sandcell_warm_pool_misses_total"),
        3,
        "{m}"
    );
    assert!(metric(&m, "sandcell_warm_pool_misses_total") >= 1, "{m}");
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(sh(&d, id, "echo $N").trim(), i.to_string());
    }
    let mut args = vec!["kill"];
    args.extend(ids.iter().map(String::as_str));
    d.ok(&args);
}

/// The sandbox directories in the daemon's run dir.
fn run_dirs(d: &Daemon) -> Vec<String> {
    std::fs::read_dir(d.tmp.path().join("run"))
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sc-"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_restart_neither_leaks_nor_hands_out_pooled_sandboxes() {
    let mut d = start("2");
    wait_idle(&d.url, 2);
    let pooled = run_dirs(&d);
    assert_eq!(pooled.len(), 2, "{pooled:?}");
    // A crash: no graceful stop drains the pool.
    d.child.kill().unwrap();
    d.child.wait().unwrap();

    // The next daemon on the same data and run dirs, with a pool of its own.
    let mut serve = Command::new(env!("CARGO_BIN_EXE_sandcell"));
    serve
        .env("SANDCELL_RUN_DIR", d.tmp.path().join("run"))
        .arg("--data-dir")
        .arg(d.data())
        .args(["serve", "--listen", "127.0.0.1:0", "--runtime", "gvisor"])
        .args(POOL_FLAGS)
        .arg("1");
    let (child, url) = spawn_daemon(serve);
    d.child = child;
    d.url = url;
    // Reconcile ran before the listener: the old pooled sandboxes are gone.
    let after = run_dirs(&d);
    assert!(
        pooled.iter().all(|p| !after.contains(p)),
        "left over: {pooled:?} in {after:?}"
    );
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    for p in &pooled {
        assert!(!ps.contains(p.as_str()), "{p} still runs:\n{ps}");
    }
    assert_eq!(d.json(&["ls", "--json"]).as_array().unwrap().len(), 0);
    // What the new pool hands out is its own.
    wait_idle(&d.url, 1);
    let id = d.ok(&["create", "-t", "minimal", "--timeout", "120"]);
    let id = id.trim();
    assert!(
        !pooled.iter().any(|p| p == id),
        "{id} is a stale pooled sandbox"
    );
    assert_eq!(metric(&metrics(&d.url), "sandcell_warm_pool_hits_total"), 1);
    d.ok(&["kill", id]);
}
