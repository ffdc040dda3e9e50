//! Our runsc flags and OCI bundle do not weaken gVisor's sandbox (docs/security-model.md):
//! every flag combination the runtime can pass, and the bundle's mounts and capabilities.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::bundle::{self, BundleSpec, HOST_DIR_IN_SANDBOX};
use super::runsc::RunscInfo;
use super::sandbox_flags;

fn runsc(platform: &str, newer: bool) -> RunscInfo {
    RunscInfo {
        path: PathBuf::from("/usr/bin/runsc"),
        version: "runsc version test".into(),
        platforms: vec!["ptrace".into(), "systrap".into(), "kvm".into()],
        platform: platform.into(),
        overlay2: true,
        host_uds: true,
        net_disconnect_ok: newer,
        checkpoint_compression: newer,
    }
}

/// Flags that turn off or loosen part of gVisor's isolation.
fn weakening(flag: &str) -> bool {
    let f = flag.to_ascii_lowercase();
    f.starts_with("--testonly")
        || f.starts_with("--unsafe")
        || f.starts_with("--network=host")
        || f.starts_with("--host-uds=open")
        || f.starts_with("--host-uds=all")
        || f.starts_with("--rootless")
        || f.starts_with("--ignore-cgroups")
        || f.starts_with("--allow-flag-override")
        || f.starts_with("--nvproxy")
        || f.starts_with("--tpuproxy")
        || f.starts_with("--strace")
        || f.starts_with("--debug")
        || f.starts_with("--file-access=shared")
        || f.starts_with("--host-fifo")
        || f.starts_with("--host-settings")
}

#[test]
fn no_flag_weakens_the_sandbox_in_any_combination() {
    for platform in ["ptrace", "systrap"] {
        for newer in [false, true] {
            let info = runsc(platform, newer);
            for network in [false, true] {
                for host_writes in [false, true] {
                    let flags = sandbox_flags(&info, network, host_writes);
                    let bad: Vec<&String> = flags.iter().filter(|f| weakening(f)).collect();
                    assert!(bad.is_empty(), "weakening flags {bad:?} in {flags:?}");
                    assert!(
                        flags.contains(&format!("--platform={platform}")),
                        "the detected platform (with its filters) is used: {flags:?}"
                    );
                    let net = if network {
                        "--network=sandbox"
                    } else {
                        "--network=none"
                    };
                    assert!(flags.iter().any(|f| f == net), "{flags:?}");
                    assert!(flags.iter().any(|f| f == "--host-uds=create"), "{flags:?}");
                    let overlay = if host_writes {
                        "--overlay2=none"
                    } else {
                        "--overlay2=root:memory"
                    };
                    assert!(flags.iter().any(|f| f == overlay), "{flags:?}");
                }
            }
        }
    }
}

#[test]
fn the_weakening_check_catches_what_it_names() {
    for f in [
        "--TESTONLY-unsafe-nonroot",
        "--network=host",
        "--host-uds=all",
        "--unsafe-net",
    ] {
        assert!(weakening(f), "{f}");
    }
    assert!(!weakening("--network=sandbox"));
}

#[test]
fn the_agent_dir_is_the_only_writable_host_bind_and_no_admin_capabilities() {
    let env = BTreeMap::new();
    let c = bundle::config(&BundleSpec {
        rootfs: Path::new("/r"),
        host_dir: Path::new("/h"),
        env: &env,
        memory_mib: 256,
        vcpus: 1,
        cgroups_path: "/sandcell/sc-1",
        hostname: "sc-1",
        netns: None,
    });
    let mounts = c["mounts"].as_array().expect("mounts");
    let binds: Vec<_> = mounts.iter().filter(|m| m["type"] == "bind").collect();
    assert_eq!(binds.len(), 1, "one host bind mount only: {binds:?}");
    let agent = binds[0];
    assert_eq!(agent["destination"], HOST_DIR_IN_SANDBOX);
    assert_eq!(agent["source"], "/h");
    let opts: Vec<&str> = agent["options"]
        .as_array()
        .expect("options")
        .iter()
        .filter_map(|o| o.as_str())
        .collect();
    for o in ["nosuid", "nodev", "noexec"] {
        assert!(opts.contains(&o), "agent dir mount lacks {o}: {opts:?}");
    }
    // Everything else comes from the sandbox's own kernel (proc, sysfs read-only, tmpfs).
    let sys = mounts
        .iter()
        .find(|m| m["destination"] == "/sys")
        .expect("/sys");
    assert!(
        sys["options"]
            .as_array()
            .is_some_and(|o| o.contains(&"ro".into()))
    );
    // The root is the sandbox's overlay (sandbox.rs: the image tree is a lower layer, its
    // upper is this sandbox's own), not a host directory shared with anyone.
    assert_eq!(c["root"]["path"], "/r");
    let caps: Vec<&str> = c["process"]["capabilities"]["bounding"]
        .as_array()
        .expect("caps")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    for denied in [
        "CAP_SYS_ADMIN",
        "CAP_SYS_PTRACE",
        "CAP_NET_ADMIN",
        "CAP_SYS_MODULE",
        "CAP_SYS_RAWIO",
        "CAP_DAC_READ_SEARCH",
    ] {
        assert!(!caps.contains(&denied), "{denied} in {caps:?}");
    }
    let namespaces: Vec<&str> = c["linux"]["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .filter_map(|n| n["type"].as_str())
        .collect();
    for ns in ["pid", "ipc", "uts", "mount", "network"] {
        assert!(
            namespaces.contains(&ns),
            "no {ns} namespace: {namespaces:?}"
        );
    }
}
