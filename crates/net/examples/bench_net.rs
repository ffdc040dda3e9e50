//! The cost of a sandbox network (bench/net/run.sh): JSON on stdout.
//! - `create_ms`: SandboxNet::create (namespace, veth, nftables, DNS server), not pooled;
//! - `teardown_ms`: its teardown;
//! - `pooled_take_ms`: NetPool::take of a prepared one (the daemon's create path with the
//!   default policy), and `pooled_take_with_rules_ms` with an allowOut rule (one nft call).
//!
//!   bench_net [--runs N] [--pool CIDR]
//!
//! Needs root, iproute2 and nftables.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell_net::{EgressSpec, NetConfig, NetPool, SandboxNet};
use std::time::{Duration, Instant};

fn stats(mut v: Vec<f64>) -> serde_json::Value {
    v.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    serde_json::json!({"runs": v.len(), "p50": q(0.5), "p90": q(0.9), "min": v[0], "max": v[v.len() - 1]})
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
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
    let runs: usize = arg("--runs", "20").parse().expect("--runs N");
    let cfg = NetConfig {
        pool: arg("--pool", "10.250.0.0/16").parse().expect("--pool CIDR"),
        upstream_dns: vec![std::net::SocketAddr::from(([127, 0, 0, 1], 53))],
        allow_private: Default::default(),
    };
    let rules = EgressSpec {
        allow_out: vec!["198.51.100.0/24".into(), "example.com".into()],
        ..Default::default()
    };
    let (mut create, mut teardown) = (Vec::new(), Vec::new());
    for i in 0..runs {
        let t = Instant::now();
        let net = SandboxNet::create(&cfg, &format!("bench{i}"), &EgressSpec::default())
            .await
            .expect("creating a network (root, ip, nft?)");
        create.push(ms(t.elapsed()));
        let t = Instant::now();
        net.teardown().await.expect("teardown");
        teardown.push(ms(t.elapsed()));
    }
    let pool = NetPool::start(cfg.clone(), "benchpool", runs);
    let (mut take, mut take_rules) = (Vec::new(), Vec::new());
    let mut taken = Vec::new();
    for round in 0..2 {
        // Let the pool fill (not timed), then take one by one.
        tokio::time::sleep(Duration::from_millis(200 * runs as u64 + 500)).await;
        for _ in 0..runs / 2 {
            let t = Instant::now();
            let net = pool.take().await.expect("take");
            if round == 1 {
                net.set_policy(&rules).await.expect("rules");
                take_rules.push(ms(t.elapsed()));
            } else {
                take.push(ms(t.elapsed()));
            }
            taken.push(net);
        }
    }
    for n in taken {
        n.teardown().await.expect("teardown");
    }
    pool.drain().await;
    drop(pool);
    // The filler may have been making one more: remove whatever of ours is left.
    tokio::time::sleep(Duration::from_secs(1)).await;
    sandcell_net::reconcile(&|id| !id.starts_with("benchpool") && !id.starts_with("bench"))
        .expect("reconcile");
    let (in_process, program) = nft_apply(runs, &rules);
    let out = serde_json::json!({
        "nftables": if sandcell_net::nftlib::in_process() { "libnftables" } else { "nft program" },
        "nft_apply_in_process_ms": stats(in_process),
        "nft_apply_program_ms": stats(program),
        "create_ms": stats(create),
        "teardown_ms": stats(teardown),
        "pooled_take_ms": stats(take),
        "pooled_take_with_rules_ms": stats(take_rules),
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
}

/// One policy change, timed both ways on a table of its own (removed at the end).
fn nft_apply(runs: usize, rules: &EgressSpec) -> (Vec<f64>, Vec<f64>) {
    use sandcell_net::nft;
    use std::io::Write;
    let spec = nft::TableSpec {
        slot: 65000,
        host_if: "schbench".into(),
        gateway: "10.252.0.1".parse().unwrap(),
        guest: "10.252.0.2".parse().unwrap(),
        pool: "10.252.0.0/16".parse().unwrap(),
        gateway6: "fd5c:5c5c:0:fde8::1".parse().unwrap(),
        guest6: "fd5c:5c5c:0:fde8::2".parse().unwrap(),
    };
    let policy = sandcell_net::policy::Policy::from_spec(rules).expect("rules");
    nft::apply(&nft::create_script(&spec, &policy, &[])).expect("the bench table");
    let script = nft::policy_script(&spec, &policy, &[]);
    let (mut lib, mut prog) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        nft::apply(&script).expect("in process");
        lib.push(ms(t.elapsed()));
        let t = Instant::now();
        let mut child = std::process::Command::new("nft")
            .args(["-f", "-"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("nft");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(script.as_bytes())
            .expect("script");
        assert!(child.wait().expect("nft").success());
        prog.push(ms(t.elapsed()));
    }
    nft::delete_table(spec.slot).expect("removing the bench table");
    (lib, prog)
}
