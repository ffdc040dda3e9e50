//! Throughput and round-trip time through a sandbox network (bench/net/run.sh): JSON on
//! stdout. A server in the fake internet (sandcell_net::testing, 198.51.100.20) is reached
//! by iperf3 and ping from two places:
//! - `sandbox`: a process in a sandbox's network namespace (open policy): its veth, the
//!   host's forwarding, the sandbox's nftables table (policy, conntrack, masquerade), then
//!   the fake internet's veth;
//! - `host`: the host's namespace straight to the fake internet's veth (the peer baseline:
//!   the same server and wire without our part).
//!
//! Reported per path: TCP throughput in Gbit/s (iperf3, one stream, sandbox to server)
//! over `--runs` runs of `--secs` seconds, each run's 0.5 s intervals as the samples, and
//! ping RTT in ms (`--pings` echoes per path). p50/p90/p99 of each.
//!
//!   bench_throughput [--runs N] [--secs S] [--pings N] [--pool CIDR]
//!   bench_throughput --hold    (only the fake internet: "ready" on stdout, up until stdin
//!                               closes; bench/net/run.sh measures a gVisor sandbox with it)
//!
//! Needs root, iproute2, nftables, dnsmasq, python3, iperf3 and ping
//! (`apt-get install iperf3 iputils-ping`). This measures the host side; a gVisor sandbox
//! adds its own netstack on top (not measured here).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell_net::testing::{HTTP_B, Internet, NETNS};
use sandcell_net::{EgressSpec, NetConfig, SandboxNet};
use std::process::{Command, Stdio};

const IPERF_PORT: &str = "5299";

fn stats(mut v: Vec<f64>) -> serde_json::Value {
    assert!(!v.is_empty(), "no samples");
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    serde_json::json!({"samples": v.len(), "p50": q(0.5), "p90": q(0.9), "p99": q(0.99),
        "min": v[0], "max": v[v.len() - 1]})
}

/// `cmd` run in namespace `netns` (None: the host's); its stdout. Panics with its stderr.
fn run_in(netns: Option<&str>, cmd: &[&str]) -> String {
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).args(cmd);
            c
        }
        None => {
            let mut c = Command::new(cmd[0]);
            c.args(&cmd[1..]);
            c
        }
    };
    let out = c
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (apt-get install iperf3 iputils-ping?)"));
    assert!(
        out.status.success(),
        "{cmd:?} in {netns:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Gbit/s of each 0.5 s interval of `runs` iperf3 runs.
fn throughput(netns: Option<&str>, runs: usize, secs: &str) -> Vec<f64> {
    let server = HTTP_B.to_string();
    let mut samples = Vec::new();
    for _ in 0..runs {
        let out = run_in(
            netns,
            &[
                "iperf3", "-c", &server, "-p", IPERF_PORT, "-t", secs, "-i", "0.5", "-J",
            ],
        );
        let v: serde_json::Value = serde_json::from_str(&out).expect("iperf3 -J output");
        for i in v["intervals"].as_array().expect("iperf3 intervals") {
            if let Some(bps) = i["sum"]["bits_per_second"].as_f64() {
                samples.push(bps / 1e9);
            }
        }
    }
    samples
}

/// RTTs in ms of `count` echoes.
fn rtts(netns: Option<&str>, count: usize) -> Vec<f64> {
    let out = run_in(
        netns,
        &[
            "ping",
            "-n",
            "-c",
            &count.to_string(),
            "-i",
            "0.05",
            &HTTP_B.to_string(),
        ],
    );
    out.lines()
        .filter_map(|l| l.split("time=").nth(1))
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str, default: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
            .unwrap_or_else(|| default.to_string())
    };
    let runs: usize = arg("--runs", "5").parse().expect("--runs N");
    let secs = arg("--secs", "3");
    let pings: usize = arg("--pings", "100").parse().expect("--pings N");
    let cfg = NetConfig {
        pool: arg("--pool", "10.252.0.0/16").parse().expect("--pool CIDR"),
        upstream_dns: Internet::upstream_dns(),
        allow_private: Default::default(),
    };
    let _lock = Internet::lock();
    let _inet = Internet::start().expect("the fake internet (root, ip, dnsmasq, python3?)");
    if args.iter().any(|a| a == "--hold") {
        println!("ready");
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        return;
    }
    let mut server = Command::new("ip")
        .args(["netns", "exec", NETNS, "iperf3", "-s", "-B"])
        .arg(HTTP_B.to_string())
        .args(["-p", IPERF_PORT])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("iperf3 -s (apt-get install iperf3)");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let net = SandboxNet::create(&cfg, "benchtp", &EgressSpec::default())
        .await
        .expect("creating a network (root, ip, nft?)");
    let ns = net.network().netns.clone();
    let result = std::panic::catch_unwind(|| {
        let sandbox_tp = throughput(Some(&ns), runs, &secs);
        let host_tp = throughput(None, runs, &secs);
        let sandbox_rtt = rtts(Some(&ns), pings);
        let host_rtt = rtts(None, pings);
        let ratio = |a: &[f64], b: &[f64]| {
            let p50 = |v: &[f64]| {
                let mut v = v.to_vec();
                v.sort_by(|x, y| x.total_cmp(y));
                v[v.len() / 2]
            };
            p50(a) / p50(b)
        };
        serde_json::json!({
            "tcp_gbit_s": {
                "sandbox": stats(sandbox_tp.clone()),
                "host": stats(host_tp.clone()),
                "sandbox_over_host_p50": ratio(&sandbox_tp, &host_tp),
            },
            "ping_rtt_ms": {
                "sandbox": stats(sandbox_rtt.clone()),
                "host": stats(host_rtt.clone()),
                "sandbox_over_host_p50": ratio(&sandbox_rtt, &host_rtt),
            },
            "runs": runs, "secs_per_run": secs.parse::<f64>().unwrap_or(0.0), "pings": pings,
        })
    });
    let _ = server.kill();
    let _ = server.wait();
    net.teardown().await.expect("teardown");
    match result {
        Ok(json) => println!("{}", serde_json::to_string_pretty(&json).unwrap()),
        Err(e) => std::panic::resume_unwind(e),
    }
}
