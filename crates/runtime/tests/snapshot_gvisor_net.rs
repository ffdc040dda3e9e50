//! Snapshots of gvisor sandboxes that have a network: the parent keeps its network across a
//! snapshot restored in place, and restores and fork children get networks of their own
//! (new namespace and address, the same egress policy) that obey the policy. Needs root,
//! runsc, the minimal image, nftables, dnsmasq and python3; fails loudly without them.

#![allow(clippy::unwrap_used)]

mod common;

use common::sh;

use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::net::testing::{HTTP6_A, HTTP6_B, Internet};
use sandcell_runtime::net::{EgressSpec, NetConfig};
use sandcell_runtime::snapshot::{RestoreSpec, SnapshotKind};
use sandcell_runtime::{Dirs, Image, NetworkSpec, Runtime, Sandbox, SandboxSpec, new_sandbox_id};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Whether an HTTP GET of `ip` from the sandbox reaches the fake internet's server there.
async fn reaches(sb: &Arc<dyn Sandbox>, ip: &str) -> bool {
    let script = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {ip} 80 | tail -n 1");
    sh(sb, &script).await.0.contains("hello-")
}

/// The same over IPv6 (the fake internet's `hello6-` servers).
async fn reaches6(sb: &Arc<dyn Sandbox>, ip: std::net::Ipv6Addr) -> bool {
    let script = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 3 {ip} 80 | tail -n 1");
    sh(sb, &script).await.0.contains("hello6-")
}

/// What both tests need: root, the fake internet (held for the test), a runtime in a temp
/// data dir swept on drop, and the network settings sandboxes get.
struct Fixture {
    // Dropped in this order: sandboxes swept before their dirs and the internet go.
    _sweep: common::SweepGuard,
    rt: GvisorRuntime,
    tmp: tempfile::TempDir,
    image: Image,
    network: NetworkSpec,
    _inet: Internet,
    _lock: sandcell_runtime::net::testing::InternetLock,
}

impl Fixture {
    async fn new(prefix: &str, pool: &str) -> Fixture {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "needs root");
        let lock = Internet::lock();
        let inet = Internet::start().unwrap();
        let data =
            std::env::var("SANDCELL_DATA_DIR").unwrap_or_else(|_| "/var/lib/sandcell".into());
        let image = Image::resolve(&Path::new(&data).join("images"), "minimal")
            .unwrap_or_else(|e| panic!("needs the minimal image (`make images install`): {e}"));
        let tmp = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in("/tmp")
            .unwrap();
        let dirs = Dirs::new(tmp.path().join("data"), tmp.path().join("run"));
        let sweep = common::SweepGuard { dirs: dirs.clone() };
        let rt = GvisorRuntime::new(dirs, sandcell_runtime::net::NetRegistry::new())
            .await
            .expect("runsc is needed");
        let network = NetworkSpec {
            egress: EgressSpec {
                allow_internet_access: true,
                allow_out: vec!["198.51.100.10/32".into(), format!("{HTTP6_A}/128")],
                deny_out: vec![],
                rules: Default::default(),
            },
            config: NetConfig {
                pool: pool.parse().unwrap(),
                upstream_dns: Internet::upstream_dns(),
                allow_private: Default::default(),
            },
        };
        Fixture {
            _sweep: sweep,
            rt,
            tmp,
            image,
            network,
            _inet: inet,
            _lock: lock,
        }
    }

    /// A started sandbox with the network, 256 MiB, and /root/before holding "kept".
    async fn start_parent(&self) -> Arc<dyn Sandbox> {
        let mut spec = SandboxSpec::new(new_sandbox_id().unwrap(), self.image.clone());
        spec.boot_timeout = Duration::from_secs(60);
        spec.memory_mib = 256;
        spec.network = Some(self.network.clone());
        let parent: Arc<dyn Sandbox> = Arc::from(self.rt.create(spec).await.unwrap());
        parent.start().await.unwrap();
        assert_eq!(sh(&parent, "echo kept > /root/before").await.1, 0);
        parent
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networked_sandboxes_snapshot_restore_and_fork_with_their_policy() {
    let f = Fixture::new("sc-snapnet", "10.202.0.0/16").await;
    let (rt, network, tmp) = (&f.rt, &f.network, &f.tmp);
    let parent = f.start_parent().await;
    // No TCP from the parent before its snapshots: runsc 20221219 cannot save connected
    // endpoints (checked at the end).

    if !rt.runsc().net_disconnect_ok {
        // runsc without --net-disconnect-ok cannot save TCP state: refused up front, and
        // the sandbox runs on untouched.
        let e = parent
            .snapshot(&tmp.path().join("refused"), SnapshotKind::Full)
            .await
            .expect_err("an old runsc checkpointed a sandbox with a network");
        assert!(e.to_string().contains("--net-disconnect-ok"), "{e}");
        assert_eq!(sh(&parent, "cat /root/before").await.0, "kept\n");
        assert!(reaches(&parent, "198.51.100.10").await);
        parent.destroy().await.unwrap();
        return;
    }

    // A snapshot restores the parent in place, with its network.
    let snap = match parent
        .snapshot(&tmp.path().join("snap"), SnapshotKind::Full)
        .await
    {
        Ok(s) => s,
        Err(e) => panic!(
            "snapshot: {e}; console:\n{}",
            common::console_of(parent.id())
        ),
    };

    // A restore with a network of its own: reaches what the policy allows, not the rest,
    // and its resolver is its own network's DNS server.
    let mut rs = RestoreSpec::new(new_sandbox_id().unwrap());
    rs.boot_timeout = Duration::from_secs(60);
    rs.network = Some(network.clone());
    let restored: Arc<dyn Sandbox> = Arc::from(rt.restore(&snap, rs).await.unwrap());
    assert_eq!(sh(&restored, "cat /root/before").await.0, "kept\n");
    assert!(
        reaches(&restored, "198.51.100.10").await,
        "restore has no network"
    );
    assert!(
        !reaches(&restored, "198.51.100.20").await,
        "restore ignores the policy"
    );
    let resolv = sh(&restored, "cat /etc/resolv.conf").await.0;
    let parent_resolv = sh(&parent, "cat /etc/resolv.conf").await.0;
    assert!(resolv.starts_with("nameserver 10.202."), "{resolv}");
    assert_ne!(
        resolv, parent_resolv,
        "the restore uses the parent's DNS server"
    );

    // Fork: the child gets the parent's network settings, in a namespace of its own.
    let children = parent.fork(1, &tmp.path().join("fork")).await.unwrap();
    let child: Arc<dyn Sandbox> = Arc::from(children.into_iter().next().unwrap());
    assert!(
        reaches(&child, "198.51.100.10").await,
        "fork child has no network"
    );
    assert!(
        !reaches(&child, "198.51.100.20").await,
        "fork child ignores the policy"
    );
    assert!(
        reaches(&parent, "198.51.100.10").await,
        "parent lost its network"
    );
    assert!(
        !reaches(&parent, "198.51.100.20").await,
        "parent's policy lost"
    );

    // Now the parent has a TCP endpoint in TIME_WAIT: --net-disconnect-ok saves it anyway
    // (it is reset), and the parent still reaches what it may.
    parent
        .snapshot(&tmp.path().join("again"), SnapshotKind::Full)
        .await
        .unwrap();
    assert_eq!(sh(&parent, "cat /root/before").await.0, "kept\n");
    assert!(
        reaches(&parent, "198.51.100.10").await,
        "parent lost its network"
    );
    // The parent was restored in place into its own namespace: gVisor had taken the
    // interface's addresses of both families; both must be back (IPv6 once was not).
    assert!(
        reaches6(&parent, HTTP6_A).await,
        "parent lost its IPv6 network"
    );

    let ids: Vec<String> = [&parent, &restored, &child]
        .iter()
        .map(|s| s.id().to_string())
        .collect();
    for sb in [&parent, &restored, &child] {
        sb.destroy().await.unwrap();
    }
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    for id in ids {
        assert!(!list.contains(&id), "the namespace of {id} outlived it");
    }
}

/// Pause to disk and resume under the same id, twice: each resume gets a network made new
/// from the same rules (the daemon's pause/resume cycle) and keeps its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn networked_pause_resume_cycles_keep_network_and_policy() {
    let f = Fixture::new("sc-pausenet", "10.203.0.0/16").await;
    let (rt, network, tmp) = (&f.rt, &f.network, &f.tmp);
    if !rt.runsc().net_disconnect_ok {
        // Covered by the refusal check of the test above.
        return;
    }
    let parent = f.start_parent().await;

    // Pause to disk and resume under the same id, twice: each resume gets a network made
    // new from the same rules (the daemon's pause/resume cycle).
    let mut parent = parent;
    for round in 0..2 {
        let id = parent.id().to_string();
        let snap = parent
            .pause_to_disk(&tmp.path().join(format!("pause{round}")))
            .await
            .unwrap_or_else(|e| panic!("pause {round}: {e}"));
        let mut rs = RestoreSpec::new(id);
        rs.boot_timeout = Duration::from_secs(60);
        rs.network = Some(network.clone());
        parent = Arc::from(
            rt.restore(&snap, rs)
                .await
                .unwrap_or_else(|e| panic!("resume {round}: {e}")),
        );
        assert_eq!(sh(&parent, "cat /root/before").await.0, "kept\n");
        assert!(
            reaches(&parent, "198.51.100.10").await,
            "resume {round} has no network"
        );
        assert!(
            !reaches(&parent, "198.51.100.20").await,
            "resume {round} ignores the policy"
        );
        // gVisor took the interface's addresses of both families at start; a resume must
        // get both back (it once got IPv4 only).
        assert!(
            reaches6(&parent, HTTP6_A).await,
            "resume {round} has no IPv6 network"
        );
        assert!(
            !reaches6(&parent, HTTP6_B).await,
            "resume {round} ignores the IPv6 policy"
        );
    }

    let id = parent.id().to_string();
    parent.destroy().await.unwrap();
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&list.stdout).contains(&id),
        "the namespace of {id} outlived it"
    );
}
