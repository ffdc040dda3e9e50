//! The jail each `sandcell-vmm` of this runtime enters (`--jail`, crates/vmm/src/jail/):
//! on wherever the host allows it (cgroup v2, a root pivot_root can leave), required with
//! `SANDCELL_VMM_JAIL=1`, off with `0` (docs/vmm.md "The jail").
//!
//! What the runtime does for it, per VMM, before the spawn:
//! - leases a uid (gid = uid) of its own from `SANDCELL_VMM_UID_BASE` (900000) upwards:
//!   never one another VMM of this daemon holds, nor one any running process has (a VMM
//!   left running by an earlier daemon keeps its uid);
//! - keeps the sandbox's run and state dirs root's (mode 0700) and gives the VMM one
//!   subdirectory of each, [`VMM_DIR`] (its uid, 0700), bound writable: its sockets, console
//!   log, disk tops and snapshot output go there, and nothing the daemon reads by path does
//!   (`owner.json`, `vmm.pid`, `vm.json` and `vmm.log` stay in the run dir itself). What the
//!   daemon does inside a [`VMM_DIR`] is fd-based and refuses links and non-regular files
//!   (crate::nofollow): a VMM taken over by its guest could put a link there to any host
//!   file. Kernel, base image, snapshot files and frozen layers are bound read-only;
//! - makes a cgroup v2 `sandcell/<id>` with memory.max (guest memory + [`MEMORY_OVERHEAD_MIB`]),
//!   pids.max (vCPUs + [`EXTRA_TASKS`]) and cpu.max (one core per vCPU), which the child
//!   joins between fork and exec, before it maps any guest memory (memory is charged to the
//!   cgroup it is first touched in, and never moves with the process);
//! - hands the sandbox's TAP, if any, to the uid (TUNSETOWNER): a process without
//!   CAP_NET_ADMIN may attach only to a TAP it owns.
//!
//! Snapshots are written by the VMM inside its [`VMM_DIR`] and moved out by the runtime
//! ([`move_out`]: renamed first, into a directory of root's, then checked and handed over
//! through a descriptor, so the VMM can no longer swap what is checked); their files are
//! then root's, mode 0644, in a 0700 directory, so the jails of restores (other uids) read
//! them through their binds and nobody else on the host can. A frozen disk top leaves the
//! [`VMM_DIR`] the same way ([`take_layer`]): its writer could otherwise replace it under
//! the restores that read it.
//!
//! The parts: [`policy`] (whether VMMs are jailed: the setting and what the host allows),
//! [`uids`] (a uid per VMM), [`handover`] (moving what a VMM wrote out of its reach), this
//! file (the jail itself: cgroup, binds, the TAP), [`pooled`] (an idle pooled VMM's jail).

use super::{RT, network};
use crate::cgroup::{CgroupVersion, SandboxCgroup};
use sandcell_proto::vmm::{JailBind, JailSpec};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

mod handover;
mod policy;
pub(super) mod pooled;
mod uids;

use handover::io;
pub(in crate::microvm) use handover::{
    hand_over, is_fork_memory_link, move_out, private_dir, take_layer, vmm_dir,
};
pub use policy::{HostSupport, JailPolicy, JailSetting};
use uids::{UidLease, lease_uid};

pub const ENABLE_ENV: &str = "SANDCELL_VMM_JAIL";
pub const UID_BASE_ENV: &str = "SANDCELL_VMM_UID_BASE";
pub const DEFAULT_UID_BASE: u32 = 900_000;
/// How many uids from the base a daemon may use (one per running VMM).
pub const UID_COUNT: u32 = 65_536;
/// The VMM's own memory beside the guest's: its binary, heap, device queues, the page cache
/// of the disk layers it reads and of the snapshot files it writes (reclaimable, but charged).
/// An idle VMM's RSS is ~4 MiB (docs/benchmarks.md); the rest is room for the page cache, so
/// that memory.max reclaims it before it kills.
pub const MEMORY_OVERHEAD_MIB: u32 = 128;
/// Tasks beside the vCPU threads: the main loop, the I/O and snapshot helpers, with room.
pub const EXTRA_TASKS: u64 = 32;
/// RLIMIT_NOFILE in the jail.
const MAX_OPEN_FILES: u64 = 4096;
/// Above the base image's size, what the disk's top may grow to (its own index included).
const DISK_GROWTH_BYTES: u64 = 64 << 30;
/// The VMM's own subdirectory of its sandbox's run dir and of its state dir: the only host
/// directories it can write to.
pub const VMM_DIR: &str = "vmm";

#[derive(Debug, thiserror::Error)]
pub enum JailError {
    #[error("{var}={value:?}: {why}")]
    BadSetting {
        var: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("no free VMM uid in {base}..{end}: each one is held by a running VMM")]
    NoFreeUid { base: u32, end: u64 },
    #[error("the VMM's cgroup needs cgroup v2 mounted on /sys/fs/cgroup (found: {found})")]
    NoCgroup2 { found: String },
    #[error("the VMM's cgroup: {0}")]
    Cgroup(#[source] Box<crate::Error>),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is {kind}, where the jailed VMM was to leave a regular file: refused")]
    NotAFile { path: PathBuf, kind: &'static str },
    #[error(
        "{path} is still open for writing (or mapped shared) by another process, likely the \
         VMM that wrote it: the snapshot is refused, since its writer could change it under \
         the restores that read it"
    )]
    StillWritable { path: PathBuf },
    #[error(
        "{path} links to {target:?}, not to a descriptor of the VMM that made it (pid \
         {owner:?}): refused"
    )]
    BadMemoryLink {
        path: PathBuf,
        target: String,
        owner: Option<u32>,
    },
    #[error("handing the TAP to uid {uid}: {what}: {source}")]
    Tap {
        uid: u32,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl From<JailError> for crate::Error {
    fn from(source: JailError) -> crate::Error {
        crate::Error::Jail {
            runtime: RT,
            source,
        }
    }
}

/// What a VMM's jail is made of, besides its uid.
pub(super) struct JailInputs<'a> {
    pub id: &'a str,
    pub run_dir: &'a Path,
    pub state_dir: &'a Path,
    /// Host paths the VMM opens read-only (kernel, base image, snapshot files, layers).
    pub reads: &'a [PathBuf],
    pub vcpus: u8,
    pub memory_mib: u32,
    /// The sandbox's network namespace, when it has a network (and so a TAP).
    pub netns: Option<&'a std::fs::File>,
}

/// A prepared jail: hold it while the VMM runs; dropping it frees the uid (after
/// [`VmmJail::release`] removed the cgroup).
pub(super) struct VmmJail {
    lease: UidLease,
    spec: JailSpec,
    cgroup: SandboxCgroup,
    procs: std::fs::File,
}

/// The cgroup of a jailed VMM this daemon did not start (adopted after a restart, or left
/// by a dead owner), if there is one: removed when that VMM is gone.
pub(super) fn leftover_cgroup(id: &str) -> Option<SandboxCgroup> {
    if crate::cgroup::detect_version() != Some(CgroupVersion::V2) {
        return None;
    }
    let cgroup = SandboxCgroup::of(CgroupVersion::V2, id);
    Path::new(crate::cgroup::CGROUP_ROOT)
        .join("sandcell")
        .join(id)
        .is_dir()
        .then_some(cgroup)
}

impl VmmJail {
    pub(super) fn prepare(policy: &JailPolicy, inputs: &JailInputs) -> Result<VmmJail, JailError> {
        // The cgroup first: it is the check most likely to fail on a host, and the
        // cheapest to undo.
        match crate::cgroup::detect_version() {
            Some(CgroupVersion::V2) => {}
            other => {
                return Err(JailError::NoCgroup2 {
                    found: other.map_or("nothing".into(), |v| format!("cgroup {v}")),
                });
            }
        }
        let lease = lease_uid(policy.uid_base)?;
        let uid = lease.uid();
        let cgroup = SandboxCgroup::create(
            CgroupVersion::V2,
            inputs.id,
            inputs.memory_mib.saturating_add(MEMORY_OVERHEAD_MIB),
            inputs.vcpus,
        )
        .map_err(|e| JailError::Cgroup(Box::new(e)))?;
        let made = (|| {
            cgroup
                .set_pids_max(u64::from(inputs.vcpus) + EXTRA_TASKS)
                .map_err(|e| JailError::Cgroup(Box::new(e)))?;
            let procs_path = cgroup.procs_file();
            let procs = std::fs::OpenOptions::new()
                .write(true)
                .open(&procs_path)
                .map_err(io("opening", &procs_path))?;
            let spec = jail_spec(uid, inputs)?;
            if let Some(netns) = inputs.netns {
                give_tap(netns, uid)?;
            }
            Ok((spec, procs))
        })();
        match made {
            Ok((spec, procs)) => {
                tracing::debug!(sandbox = %inputs.id, uid, "VMM jail prepared");
                Ok(VmmJail {
                    lease,
                    spec,
                    cgroup,
                    procs,
                })
            }
            Err(e) => {
                let _ = cgroup.remove();
                Err(e)
            }
        }
    }

    pub(super) fn uid(&self) -> u32 {
        self.lease.uid()
    }

    /// Adds `--jail` to `cmd`, and the move into the cgroup between fork and exec.
    pub(super) fn apply(&self, cmd: &mut tokio::process::Command) -> Result<(), JailError> {
        let json = serde_json::to_string(&self.spec).map_err(|e| JailError::Io {
            what: "encoding the jail",
            path: self.spec.root.clone(),
            source: e.into(),
        })?;
        cmd.arg("--jail").arg(json);
        let fd = self.procs.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec and makes one system call
        // (write, async-signal-safe) on a descriptor the parent keeps open (in `self`) until
        // the spawn returned. Writing "0" moves the writing process.
        unsafe {
            cmd.pre_exec(move || {
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(())
    }

    /// The VMM has ended: its cgroup goes (what is left in it is killed); the uid is freed
    /// when `self` drops.
    pub(super) fn release(self) -> crate::Result<()> {
        self.cgroup.remove()
    }
}

fn jail_spec(uid: u32, inputs: &JailInputs) -> Result<JailSpec, JailError> {
    let root = inputs.run_dir.join("jail");
    match std::fs::create_dir(&root) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("creating", &root)(e)),
    }
    // The run and state dirs stay root's (the daemon reads owner.json, vmm.pid, vmm.log
    // there by path); the VMM creates its sockets, console log, disk tops and snapshot
    // output in a subdirectory of each, its own.
    let mut binds = Vec::new();
    for dir in [inputs.run_dir, inputs.state_dir] {
        private_dir(dir)?;
        binds.push(JailBind {
            path: vmm_dir(dir, VMM_DIR, uid)?,
            writable: true,
        });
    }
    let mut biggest_read = 0u64;
    for path in inputs.reads {
        if binds.iter().any(|b| b.path == *path) {
            continue;
        }
        let meta = std::fs::metadata(path).map_err(io("stat", path))?;
        biggest_read = biggest_read.max(meta.len());
        binds.push(JailBind {
            path: path.clone(),
            writable: false,
        });
    }
    let mut devices = vec![PathBuf::from("/dev/kvm")];
    if inputs.netns.is_some() {
        devices.push(PathBuf::from("/dev/net/tun"));
    }
    let memory = u64::from(inputs.memory_mib) << 20;
    Ok(JailSpec {
        uid,
        gid: uid,
        root,
        binds,
        devices,
        max_open_files: MAX_OPEN_FILES,
        // The largest file the VMM writes: a memory snapshot (the guest memory) or the
        // disk's top, whose offsets follow the disk's (the base image's size and growth).
        max_file_bytes: memory.max(biggest_read.saturating_add(DISK_GROWTH_BYTES)),
        max_threads: u64::from(inputs.vcpus) + EXTRA_TASKS,
    })
}

/// TUNSETOWNER / TUNSETGROUP (`_IOW('T', 204 / 206, int)`).
const TUNSETOWNER: libc::c_ulong = 0x4004_54cc;
const TUNSETGROUP: libc::c_ulong = 0x4004_54ce;

/// Makes the sandbox's TAP (in namespace `netns`) attachable by `uid` without privileges.
fn give_tap(netns: &std::fs::File, uid: u32) -> Result<(), JailError> {
    let tap = |what, source| JailError::Tap { uid, what, source };
    // setns moves only the calling thread: a thread of its own, which ends right after, so
    // no task of the daemon ever runs in the sandbox's namespace.
    let joined = std::thread::scope(|s| {
        s.spawn(move || -> Result<(), JailError> {
            // With the flags the VMM attaches with (a vnet header), so its attach changes
            // nothing.
            let flags = libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR;
            let tun = network::attach_tap_in(netns, flags)
                .map_err(|e| tap("attaching it in the sandbox's namespace", e))?;
            for (request, what) in [(TUNSETOWNER, "TUNSETOWNER"), (TUNSETGROUP, "TUNSETGROUP")] {
                // SAFETY: both take the id as an integer argument; checked.
                if unsafe { libc::ioctl(tun.as_raw_fd(), request, libc::c_ulong::from(uid)) } < 0 {
                    return Err(tap(what, std::io::Error::last_os_error()));
                }
            }
            Ok(())
        })
        .join()
    });
    joined.unwrap_or_else(|_| Err(tap("the thread", std::io::Error::other("panicked"))))
}

#[cfg(test)]
fn is_root() -> bool {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::uids::HELD;
    use super::*;
    use sandcell_proto::sync::lock;
    use std::os::unix::fs::MetadataExt;

    /// Without cgroup v2 (this host's v1 hierarchy, or none) the jail is refused before it
    /// takes a uid or touches the sandbox's dirs; with it, the cgroup has the three limits.
    #[test]
    fn a_jail_needs_cgroup_v2_and_gets_its_limits() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (run, state) = (tmp.path().join("run"), tmp.path().join("state"));
        std::fs::create_dir_all(&run).expect("run dir");
        std::fs::create_dir_all(&state).expect("state dir");
        let id = format!("jailtest-{}", std::process::id());
        let inputs = JailInputs {
            id: &id,
            run_dir: &run,
            state_dir: &state,
            reads: &[],
            vcpus: 2,
            memory_mib: 256,
            netns: None,
        };
        let policy = JailPolicy {
            uid_base: 3_100_000_000,
        };
        match crate::cgroup::detect_version() {
            Some(CgroupVersion::V2) if is_root() => {
                let jail = VmmJail::prepare(&policy, &inputs).expect("a jail");
                let dir = Path::new(crate::cgroup::CGROUP_ROOT)
                    .join("sandcell")
                    .join(&id);
                let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect(f);
                assert_eq!(
                    read("memory.max").trim(),
                    ((256u64 + 128) << 20).to_string()
                );
                assert_eq!(read("pids.max").trim(), "34");
                assert_eq!(read("cpu.max").trim(), "200000 100000");
                // The run dir stays root's; the VMM's own is inside.
                let meta = std::fs::metadata(&run).expect("run dir");
                assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o700));
                let meta = std::fs::metadata(run.join(VMM_DIR)).expect("the VMM's dir");
                assert_eq!((meta.uid(), meta.mode() & 0o777), (jail.uid(), 0o700));
                jail.release().expect("release");
                assert!(!dir.exists());
            }
            _ => {
                let err = VmmJail::prepare(&policy, &inputs).err().expect("refused");
                assert!(matches!(err, JailError::NoCgroup2 { .. }), "{err}");
                assert!(crate::Error::from(err).to_string().contains("cgroup v2"));
                let meta = std::fs::metadata(&run).expect("run dir");
                assert_ne!(meta.mode() & 0o777, 0o700, "the dirs were touched");
            }
        }
        let base = policy.uid_base;
        assert!(
            !lock(&HELD)
                .iter()
                .any(|u| (base..base + UID_COUNT).contains(u)),
            "a uid is still held"
        );
    }
}
