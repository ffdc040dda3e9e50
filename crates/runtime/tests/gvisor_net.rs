//! The gvisor runtime with a network (`SandboxSpec::network`): runsc `--network=sandbox` in
//! the sandbox's namespace, the egress policy and our DNS server from sandcell-net, against
//! the fake internet of `sandcell_net::testing`. Needs root, runsc, the minimal image,
//! nftables, dnsmasq and python3; fails loudly without them.

#![allow(clippy::unwrap_used)]

use sandcell_envd_client::{OutputKind, decode_data};
use sandcell_proto::agent::{Event, ProcessConfig, StartRequest};
use sandcell_runtime::cgroup::{self, SandboxCgroup};
use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::net::testing::Internet;
use sandcell_runtime::net::{EgressSpec, NetConfig};
use sandcell_runtime::{
    Dirs, Image, NetworkSpec, Runtime, Sandbox, SandboxSpec, agent_client, new_sandbox_id,
};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Removes what a failed test left: the network, the cgroup, the mount.
struct Guard {
    dirs: Dirs,
    id: String,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = sandcell_runtime::net::network::remove(&self.id);
        let run_dir = self.dirs.sandbox_run_dir(&self.id);
        if !run_dir.exists() {
            return;
        }
        if let Some(version) = cgroup::detect_version() {
            let _ = SandboxCgroup::of(version, &self.id).remove();
        }
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(run_dir.join("rootfs"))
            .status();
    }
}

/// Runs argv in the sandbox: stdout+stderr and the exit status.
async fn run(sb: &Arc<dyn Sandbox>, argv: &[&str]) -> (String, i32) {
    let client = agent_client(sb.clone());
    let req = StartRequest {
        process: ProcessConfig {
            cmd: argv[0].into(),
            args: argv[1..].iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        },
        ..Default::default()
    };
    let mut stream = client.start(&req).await.unwrap();
    let mut out = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev.unwrap().event {
            Event::Data(d) => match decode_data(&d).unwrap() {
                (OutputKind::Stderr, b) | (_, b) => out.extend(b),
            },
            Event::End(end) => {
                return (
                    String::from_utf8_lossy(&out).into_owned(),
                    end.shell_status(),
                );
            }
            _ => {}
        }
    }
    panic!("stream ended without an end event");
}

/// An HTTP GET with busybox nc (the minimal image's static busybox wget crashes in its
/// resolver code); the body's last line and the status.
async fn wget(sb: &Arc<dyn Sandbox>, url: &str) -> (String, i32) {
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    let script = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {host} 80 | tail -n 1");
    let (out, _) = run(sb, &["sh", "-c", &script]).await;
    let status = if out.contains("hello-") { 0 } else { 1 };
    (out, status)
}

#[tokio::test(flavor = "multi_thread")]
async fn sandbox_reaches_only_what_its_policy_allows() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "needs root");
    let _l = Internet::lock();
    let _inet = Internet::start().unwrap();
    let data = std::env::var("SANDCELL_DATA_DIR").unwrap_or_else(|_| "/var/lib/sandcell".into());
    let image = Image::resolve(&Path::new(&data).join("images"), "minimal")
        .unwrap_or_else(|e| panic!("needs the minimal image (`make images install`): {e}"));
    let tmp = tempfile::Builder::new()
        .prefix("sc-rtn")
        .tempdir_in("/tmp")
        .unwrap();
    let dirs = Dirs::new(tmp.path().join("data"), tmp.path().join("run"));
    let rt = GvisorRuntime::new(dirs.clone(), sandcell_runtime::net::NetRegistry::new())
        .await
        .expect("runsc is needed");

    let mut spec = SandboxSpec::new(new_sandbox_id().unwrap(), image);
    spec.boot_timeout = Duration::from_secs(60);
    spec.network = Some(NetworkSpec {
        egress: EgressSpec {
            allow_internet_access: true,
            allow_out: vec!["198.51.100.10/32".into()],
            deny_out: vec![],
            rules: Default::default(),
        },
        config: NetConfig {
            pool: "10.201.0.0/16".parse().unwrap(),
            upstream_dns: Internet::upstream_dns(),
            allow_private: Default::default(),
        },
    });
    let _guard = Guard {
        dirs: dirs.clone(),
        id: spec.id.clone(),
    };
    let sb: Arc<dyn Sandbox> = Arc::from(rt.create(spec).await.unwrap());
    sb.start().await.unwrap();

    let (out, status) = wget(&sb, "http://198.51.100.10/").await;
    assert_eq!((out.trim(), status), ("hello-10", 0));
    let (out, status) = wget(&sb, "http://198.51.100.20/").await;
    assert_ne!(status, 0, "a denied address answered: {out}");
    // our DNS server is the sandbox's resolver, and refuses names outside the rules
    let (out, _) = run(&sb, &["cat", "/etc/resolv.conf"]).await;
    assert!(out.starts_with("nameserver 10.201."), "{out}");
    let (out, _) = run(&sb, &["nslookup", "other.test"]).await;
    assert!(!out.contains("198.51.100.20"), "{out}");
    let (out, _) = run(&sb, &["nslookup", "other.test", "198.51.100.53"]).await;
    assert!(
        !out.contains("198.51.100.20"),
        "another resolver answered: {out}"
    );

    let netns = format!("sc-{}", sb.id());
    sb.destroy().await.unwrap();
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&list.stdout).contains(&netns),
        "the sandbox's namespace outlived it"
    );
}
