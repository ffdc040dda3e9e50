//! The OCI bundle of a sandbox: `config.json` next to `rootfs/`.
//!
//! The process is the agent as PID 1, listening on a Unix socket in `/run/sandcell-host`, a
//! directory bind-mounted from the host; runsc's `--host-uds=create` lets the socket it
//! binds there be a real host socket we can connect to. The sandbox has its own pid, ipc,
//! uts, mount and network namespaces (`--network=none`: loopback only; or the sandbox's own
//! namespace from `sandcell-net` with `--network=sandbox`, see network.rs).

use crate::image::AGENT_PATH;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;

/// Where the host directory with the agent's socket appears inside the sandbox.
pub const HOST_DIR_IN_SANDBOX: &str = "/run/sandcell-host";
/// The agent's socket, inside that directory.
pub const AGENT_SOCKET: &str = "agent.sock";

/// Docker's default capability set: root in the sandbox can do the usual root things
/// (chown, setuid, bind low ports) and nothing that needs a host kernel's trust.
const CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

pub(crate) struct BundleSpec<'a> {
    pub rootfs: &'a Path,
    pub host_dir: &'a Path,
    pub env: &'a BTreeMap<String, String>,
    pub memory_mib: u32,
    pub vcpus: u8,
    pub cgroups_path: &'a str,
    pub hostname: &'a str,
    /// The network namespace to join (`--network=sandbox`); `None`: a new, empty one.
    pub netns: Option<&'a Path>,
}

pub(crate) fn config(spec: &BundleSpec<'_>) -> Value {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    env.insert(
        "PATH".into(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
    );
    env.insert("SANDCELL_RUNTIME".into(), "gvisor".into());
    env.extend(spec.env.iter().map(|(k, v)| (k.clone(), v.clone())));
    let env: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    let listen = format!("unix:{HOST_DIR_IN_SANDBOX}/{AGENT_SOCKET}");
    let memory = u64::from(spec.memory_mib) << 20;
    let network = match spec.netns {
        Some(path) => json!({"type": "network", "path": path}),
        None => json!({"type": "network"}),
    };
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            // runsc mounts /proc, /dev, /sys from the spec below; the agent's own PID-1
            // mounts would only fail (no CAP_SYS_ADMIN) or hide /run/sandcell-host.
            // `--sudo-service`: gVisor ignores setuid bits, so the agent serves sudo.
            "args": [
                AGENT_PATH, "--listen", listen, "--no-init-mounts", "--sudo-service",
                "--env-file", sandcell_proto::agent::ENV_FILE_PATH,
                "--trust-root", sandcell_proto::agent::TRUST_ROOT,
            ],
            "env": env,
            "cwd": "/",
            "capabilities": {
                "bounding": CAPABILITIES,
                "effective": CAPABILITIES,
                "permitted": CAPABILITIES,
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1_048_576u64, "soft": 1_048_576u64}],
        },
        "root": {"path": spec.rootfs, "readonly": false},
        "hostname": spec.hostname,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"]},
            {"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": HOST_DIR_IN_SANDBOX, "type": "bind", "source": spec.host_dir, "options": ["rbind", "rw", "nosuid", "nodev", "noexec"]},
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, network],
            "cgroupsPath": spec.cgroups_path,
            // The cgroup is made by us with these limits before runsc starts (see cgroup.rs);
            // they are repeated here for runsc, which reads them for the sandbox's view of
            // its own size.
            "resources": {
                "memory": {"limit": memory},
                "cpu": {"quota": u64::from(spec.vcpus.max(1)) * 100_000, "period": 100_000u64},
            },
        },
    })
}

/// Where X11 and ICE programs bind their sockets (`/tmp/.X11-unix/X0`,
/// `/tmp/.ICE-unix/PID`: xfce4-session, GTK programs). On a sandbox with a disk (or a host
/// layer), `/tmp` is bound from the host and reached through runsc's gofer, and runsc cannot
/// checkpoint a socket bound there ("Cannot save endpoint with bound host socket"): a
/// desktop could never be paused, forked or snapshotted. A small tmpfs of the sandbox's own
/// kernel on each keeps those sockets in its memory, where a checkpoint saves them.
pub const SOCKET_DIRS: &[&str] = &["tmp/.X11-unix", "tmp/.ICE-unix"];

/// The tmpfs mount of one of [`SOCKET_DIRS`] (sockets take no space: 1 MiB bounds a program
/// that writes files there).
pub(crate) fn socket_dir_mount(rel: &str) -> Value {
    json!({
        "destination": format!("/{rel}"), "type": "tmpfs", "source": "tmpfs",
        "options": ["nosuid", "nodev", "noexec", "mode=1777", "size=1m"],
    })
}

/// The OCI mount of a volume: its host directory bound at `bind.guest` through the gofer
/// (never a block device or image the host kernel would parse). The mount point is made in
/// the root without following a link there: the root's layers may come from a guest.
pub(crate) fn volume_mount(rootfs: &Path, bind: &crate::VolumeBind) -> crate::Result<Value> {
    let bad = |problem: String| crate::Error::InvalidSpec {
        runtime: super::RT,
        problem,
    };
    let rel = bind.guest_relative().map_err(bad)?;
    crate::nofollow::open_dir_in(rootfs, rel, true).map_err(|e| {
        crate::Error::io(
            super::RT,
            format!("creating volume mount point {}", bind.guest),
            e,
        )
    })?;
    Ok(json!({
        "destination": bind.guest, "type": "bind", "source": bind.host,
        "options": ["rbind", "rw", "nosuid", "nodev"],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_paths_must_be_plain_and_absolute() {
        let tmp = tempfile::tempdir().unwrap();
        let bind = |guest: &str| crate::VolumeBind {
            host: "/h".into(),
            guest: guest.into(),
        };
        let m = volume_mount(tmp.path(), &bind("/mnt/data")).unwrap();
        assert_eq!(m["destination"], "/mnt/data");
        assert_eq!(m["source"], "/h");
        assert!(tmp.path().join("mnt/data").is_dir());
        for bad in ["/", "mnt", "/mnt/../etc", ""] {
            assert!(volume_mount(tmp.path(), &bind(bad)).is_err(), "{bad}");
        }
        // A link planted in the root is not followed to make the mount point.
        std::os::unix::fs::symlink("/etc", tmp.path().join("evil")).unwrap();
        assert!(volume_mount(tmp.path(), &bind("/evil/x")).is_err());
    }

    #[test]
    fn agent_is_pid_one_listening_in_the_shared_dir() {
        let env = BTreeMap::from([("FOO".to_string(), "bar".to_string())]);
        let c = config(&BundleSpec {
            rootfs: Path::new("/r"),
            host_dir: Path::new("/h"),
            env: &env,
            memory_mib: 256,
            vcpus: 2,
            cgroups_path: "/sandcell/sc-1",
            hostname: "sc-1",
            netns: None,
        });
        assert_eq!(c["process"]["args"][0], AGENT_PATH);
        assert_eq!(
            c["process"]["args"][2],
            "unix:/run/sandcell-host/agent.sock"
        );
        assert!(
            c["process"]["env"]
                .as_array()
                .unwrap()
                .contains(&json!("FOO=bar"))
        );
        assert_eq!(c["linux"]["resources"]["memory"]["limit"], 256u64 << 20);
        assert_eq!(c["linux"]["resources"]["cpu"]["quota"], 200_000);
        assert_eq!(c["root"]["readonly"], false);
        let host = c["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == HOST_DIR_IN_SANDBOX)
            .unwrap();
        assert_eq!(host["source"], "/h");
    }
}
