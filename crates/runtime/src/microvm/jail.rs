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

use super::{RT, network};
use crate::cgroup::{CgroupVersion, SandboxCgroup};
use crate::nofollow;
use sandcell_proto::sync::lock;
use sandcell_proto::vmm::{JailBind, JailSpec};
use std::collections::BTreeSet;
use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

#[path = "jail_pooled.rs"]
pub(super) mod pooled;

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

/// Whether VMMs are jailed, and from which uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JailPolicy {
    pub uid_base: u32,
}

/// What `SANDCELL_VMM_JAIL` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JailSetting {
    /// `0`: no jail.
    Off,
    /// `1`: every VMM jailed; a create whose jail cannot be made fails.
    Required(JailPolicy),
    /// Unset or empty: jailed when the host can ([`JailSetting::resolve`]).
    Auto(JailPolicy),
}

/// What the jail needs of the host, as found at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSupport {
    /// cgroup v2 on /sys/fs/cgroup: the VMM's cgroup and its limits.
    pub cgroup_v2: bool,
    /// `/` is a mount with a parent: pivot_root (the jail's step 2) refuses a namespace's
    /// own root mount (an initramfs's rootfs when nothing was mounted over it).
    pub pivotable_root: bool,
}

impl HostSupport {
    pub fn probe() -> HostSupport {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        HostSupport {
            cgroup_v2: crate::cgroup::detect_version() == Some(CgroupVersion::V2),
            pivotable_root: root_has_parent(&mountinfo),
        }
    }
}

/// Whether `/` in `mountinfo` (proc(5)'s format) is a mount whose parent is another mount,
/// as pivot_root requires of the caller's root (the kernel's `mnt_has_parent`): not the
/// namespace's own root (its parent is itself), and a mount at all (a chroot into a plain
/// directory has none at `/`).
fn root_has_parent(mountinfo: &str) -> bool {
    mountinfo.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        matches!(fields.as_slice(), [id, parent, _, _, "/", ..] if id != parent)
    })
}

impl JailSetting {
    /// From `SANDCELL_VMM_JAIL` and `SANDCELL_VMM_UID_BASE`.
    pub fn from_env() -> Result<JailSetting, JailError> {
        let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        JailSetting::parse(var(ENABLE_ENV), var(UID_BASE_ENV))
    }

    fn parse(enable: Option<String>, base: Option<String>) -> Result<JailSetting, JailError> {
        let required = match enable.as_deref() {
            Some("0") => return Ok(JailSetting::Off),
            None => false,
            Some("1") => true,
            Some(other) => {
                return Err(JailError::BadSetting {
                    var: ENABLE_ENV,
                    value: other.into(),
                    why: "1 requires the jail, 0 turns it off, nothing jails wherever the host allows",
                });
            }
        };
        let policy = JailPolicy::parse_base(base)?;
        Ok(match required {
            true => JailSetting::Required(policy),
            false => JailSetting::Auto(policy),
        })
    }

    /// The policy the runtime runs with on `host`: `Auto` jails only where the host has
    /// what the jail needs, and says why not otherwise (the caller logs it).
    pub fn resolve(self, host: HostSupport) -> (Option<JailPolicy>, Option<&'static str>) {
        match self {
            JailSetting::Off => (None, Some("SANDCELL_VMM_JAIL=0")),
            JailSetting::Required(p) => (Some(p), None),
            JailSetting::Auto(_) if !host.cgroup_v2 => (
                None,
                Some("the host has no cgroup v2 on /sys/fs/cgroup (the jail's limits live there)"),
            ),
            JailSetting::Auto(_) if !host.pivotable_root => (
                None,
                Some("the root is an initramfs, which pivot_root cannot leave"),
            ),
            JailSetting::Auto(p) => (Some(p), None),
        }
    }
}

impl JailPolicy {
    fn parse_base(base: Option<String>) -> Result<JailPolicy, JailError> {
        let uid_base = match base {
            None => DEFAULT_UID_BASE,
            Some(v) => v
                .parse::<u32>()
                .ok()
                // Above the system's and the usual login users' ranges, and a whole range
                // below the 32-bit limit (u32::MAX is "no uid" to the kernel).
                .filter(|b| *b >= 10_000 && b.checked_add(UID_COUNT).is_some())
                .ok_or(JailError::BadSetting {
                    var: UID_BASE_ENV,
                    value: v,
                    why: "a uid of at least 10000 with 65536 free uids above it",
                })?,
        };
        Ok(JailPolicy { uid_base })
    }
}

/// Uids leased to VMMs of this process, freed when their lease drops.
static HELD: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());
/// Where the next search starts: leases rotate through the range, so a uid just freed is
/// the last to be leased again.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// One VMM's uid, held until dropped.
#[derive(Debug)]
pub(super) struct UidLease(u32);

impl UidLease {
    pub(super) fn uid(&self) -> u32 {
        self.0
    }
}

impl Drop for UidLease {
    fn drop(&mut self) {
        lock(&HELD).remove(&self.0);
    }
}

/// The first uid from offset `start` (wrapping in `base..base + count`) that `taken` refuses.
fn pick(base: u32, count: u32, start: u32, taken: impl Fn(u32) -> bool) -> Option<(u32, u32)> {
    (0..count)
        .map(|i| (start.wrapping_add(i)) % count)
        .find(|offset| !taken(base + offset))
        .map(|offset| (base + offset, offset))
}

/// The real uids of every running process (owners of `/proc/<pid>`).
fn running_uids() -> BTreeSet<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| e.metadata().ok().map(|m| m.uid()))
        .collect()
}

pub(super) fn lease_uid(base: u32) -> Result<UidLease, JailError> {
    let running = running_uids();
    let mut held = lock(&HELD);
    let start = NEXT.load(Ordering::Relaxed);
    let (uid, offset) = pick(base, UID_COUNT, start, |u| {
        held.contains(&u) || running.contains(&u)
    })
    .ok_or(JailError::NoFreeUid {
        base,
        end: u64::from(base) + u64::from(UID_COUNT),
    })?;
    held.insert(uid);
    NEXT.store((offset + 1) % UID_COUNT, Ordering::Relaxed);
    Ok(UidLease(uid))
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

/// The error of `what` on `path`: [`JailError::NotAFile`] when it was refused as no
/// regular file (crate::nofollow::NotRegular), else [`JailError::Io`].
fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> JailError + use<> {
    let path = path.to_path_buf();
    move |source| match nofollow::NotRegular::of(&source) {
        Some(refused) => JailError::NotAFile {
            path,
            kind: refused.kind,
        },
        None => JailError::Io { what, path, source },
    }
}

fn cstr(name: &OsStr, path: &Path) -> Result<CString, JailError> {
    CString::new(name.as_bytes()).map_err(|_| JailError::Io {
        what: "naming",
        path: path.to_path_buf(),
        source: std::io::ErrorKind::InvalidInput.into(),
    })
}

fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// fchown and fchmod of an open file or directory (`path` names it in errors).
fn set_owner(
    fd: &impl AsRawFd,
    uid: u32,
    mode: libc::mode_t,
    path: &Path,
) -> Result<(), JailError> {
    // SAFETY: fchown on a descriptor we hold open; no memory is passed.
    check(unsafe { libc::fchown(fd.as_raw_fd(), uid, uid) }).map_err(io("chown", path))?;
    // SAFETY: as above.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) }).map_err(io("chmod", path))
}

/// Directory `name` of the host's directory `parent`, the VMM's: made if missing, opened
/// without following a link (the VMM may have put one there since an earlier start), then
/// given to `uid`, mode 0700, through its descriptor.
pub(super) fn vmm_dir(parent: &Path, name: &str, uid: u32) -> Result<PathBuf, JailError> {
    let path = parent.join(name);
    let dir = nofollow::open_dir_in(parent, Path::new(name), true).map_err(io("opening", &path))?;
    set_owner(&dir, uid, 0o700, &path)?;
    Ok(path)
}

/// Hands file `name` of the open directory `dir` (at `dir_path`) over to root, mode 0644:
/// a file the VMM wrote that others will read (a snapshot's state and memory, a frozen
/// layer). Its writer can no longer change it; restores' uids can read it, inside a 0700
/// directory that keeps the host's other users out. Opened without following a link and
/// refused unless a regular file ([`JailError::NotAFile`]); chowned through the descriptor.
fn hand_over_at(dir: &OwnedFd, dir_path: &Path, name: &OsStr) -> Result<(), JailError> {
    let path = dir_path.join(name);
    let file = nofollow::open_regular_at(dir, name).map_err(io("opening", &path))?;
    set_owner(&file, 0, 0o644, &path)
}

/// [`hand_over_at`] of `file`, whose directory is the host's (a snapshot's, a state dir).
pub(super) fn hand_over(file: &Path) -> Result<(), JailError> {
    let (Some(parent), Some(name)) = (file.parent(), file.file_name()) else {
        return Err(JailError::NotAFile {
            path: file.to_path_buf(),
            kind: "no file name",
        });
    };
    let dir = nofollow::open_dir(parent).map_err(io("opening", parent))?;
    hand_over_at(&dir, parent, name)
}

/// Makes the host's directory `dir` root's only (mode 0700), through its descriptor.
pub(super) fn private_dir(dir: &Path) -> Result<(), JailError> {
    let fd = nofollow::open_dir(dir).map_err(io("opening", dir))?;
    // SAFETY: fchmod on a descriptor we hold open.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), 0o700) }).map_err(io("chmod", dir))
}

/// Renames `name` from `from` to `to` (the two open directories), never over an existing
/// name. The entry moves as it is: a link stays a link, nothing is followed.
fn rename_at(from: &OwnedFd, to: &OwnedFd, name: &CString) -> std::io::Result<()> {
    // SAFETY: two open directories and a NUL-terminated name that outlive the call.
    check(unsafe {
        libc::renameat2(
            from.as_raw_fd(),
            name.as_ptr(),
            to.as_raw_fd(),
            name.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    })
}

/// `lstat` of `name` in `dir`.
fn stat_at(dir: &OwnedFd, name: &CString) -> std::io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value for fstatat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: an open directory, a NUL-terminated name and a valid stat buffer.
    check(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

/// The target of link `name` in `dir`.
fn read_link_at(dir: &OwnedFd, name: &CString) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: an open directory, a NUL-terminated name, and a buffer of the length given.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// Whether `target` is what a fork snapshot's memory link of VMM `pid` is:
/// `/proc/<pid>/fd/<n>` (crates/vmm/src/snapshot/save.rs), and nothing else a VMM could
/// name (a host file, another process's descriptors).
pub(super) fn is_fork_memory_link(target: &[u8], pid: u32) -> bool {
    let prefix = format!("/proc/{pid}/fd/");
    target
        .strip_prefix(prefix.as_bytes())
        .is_some_and(|n| !n.is_empty() && n.len() <= 10 && n.iter().all(u8::is_ascii_digit))
}

/// Copies `name` from `from` to `to` (a rename across filesystems): a regular file's bytes
/// into a new file of ours, or a fork's memory link (checked against `link_owner`) as a new
/// link of ours. Anything else is refused.
fn copy_at(
    (from, from_path): (&OwnedFd, &Path),
    (to, to_path): (&OwnedFd, &Path),
    name: &CString,
    link_owner: Option<u32>,
) -> Result<(), JailError> {
    let src_path = from_path.join(OsStr::from_bytes(name.as_bytes()));
    let dst_path = to_path.join(OsStr::from_bytes(name.as_bytes()));
    let st = stat_at(from, name).map_err(io("stat", &src_path))?;
    if st.st_mode & libc::S_IFMT == libc::S_IFLNK
        && let Some(pid) = link_owner
    {
        let target = read_link_at(from, name).map_err(io("reading the link", &src_path))?;
        check_memory_link(&target, pid, &src_path)?;
        let c_target = CString::new(target).map_err(|_| JailError::NotAFile {
            path: src_path.clone(),
            kind: "a link with a NUL byte",
        })?;
        // SAFETY: two NUL-terminated strings and an open directory; symlinkat creates the
        // link itself and fails on an existing name.
        return check(unsafe { libc::symlinkat(c_target.as_ptr(), to.as_raw_fd(), name.as_ptr()) })
            .map_err(io("linking", &dst_path));
    }
    let mut src = nofollow::open_regular_at(from, OsStr::from_bytes(name.as_bytes()))
        .map_err(io("opening", &src_path))?;
    // SAFETY: an open directory and a NUL-terminated name; O_EXCL|O_NOFOLLOW create a new
    // file or fail, whatever is at the name. The descriptor is owned below.
    let fd = unsafe {
        libc::openat(
            to.as_raw_fd(),
            name.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    check(fd).map_err(io("creating", &dst_path))?;
    // SAFETY: just opened, owned by nobody else.
    let mut dst = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    std::io::copy(&mut src, &mut dst).map_err(io("copying", &src_path))?;
    Ok(())
}

fn check_memory_link(target: &[u8], pid: u32, path: &Path) -> Result<(), JailError> {
    if is_fork_memory_link(target, pid) {
        return Ok(());
    }
    Err(JailError::BadMemoryLink {
        path: path.to_path_buf(),
        target: String::from_utf8_lossy(target).into_owned(),
        owner: Some(pid),
    })
}

/// Moves the snapshot files `state` and `memory` that a jailed VMM wrote in `from` (a
/// directory inside its [`VMM_DIR`]) to the host's directory `dest`, then hands them over
/// to root.
///
/// Each name is renamed first (a copy across filesystems), as the entry it is, into `dest`,
/// where the VMM cannot reach it any more; only then is it looked at: a regular file is
/// opened without following a link and chowned and chmodded through its descriptor; a link
/// is kept only as the memory of a fork (`fork_owner`: the VMM's pid, the link must be
/// `/proc/<pid>/fd/<n>`, see [`is_fork_memory_link`]); anything else is refused
/// ([`JailError::NotAFile`], [`JailError::BadMemoryLink`]) and nothing it points to is
/// touched. The caller removes `dest` on an error.
pub(super) fn move_out(
    from: &Path,
    dest: &Path,
    state: &str,
    memory: &str,
    fork_owner: Option<u32>,
) -> Result<(), JailError> {
    let src = nofollow::open_dir(from).map_err(io("opening", from))?;
    let dst = nofollow::open_dir(dest).map_err(io("opening", dest))?;
    for (name, fork_owner) in [(state, None), (memory, fork_owner)] {
        let path = dest.join(name);
        let c = cstr(OsStr::new(name), &path)?;
        match rename_at(&src, &dst, &c) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                copy_at((&src, from), (&dst, dest), &c, fork_owner)?;
            }
            Err(e) => return Err(io("moving", &from.join(name))(e)),
        }
        let st = stat_at(&dst, &c).map_err(io("stat", &path))?;
        match (st.st_mode & libc::S_IFMT, fork_owner) {
            (libc::S_IFLNK, Some(pid)) => {
                let target = read_link_at(&dst, &c).map_err(io("reading the link", &path))?;
                check_memory_link(&target, pid, &path)?;
            }
            // Refuses what is not a regular file (a link without a fork) by itself.
            _ => {
                hand_over_at(&dst, dest, OsStr::new(name))?;
                no_writer_left(&dst, dest, OsStr::new(name))?;
            }
        }
    }
    // SAFETY: fchmod on a descriptor we hold open.
    check(unsafe { libc::fchmod(dst.as_raw_fd(), 0o700) }).map_err(io("chmod", dest))
}

/// Refuses file `name` of the open directory `dir` (at `dir_path`) while any process holds
/// it open for writing, a writable shared mapping included (a VMM taken over by its guest
/// could keep one on the snapshot it handed over): a write lease (`F_SETLEASE`, root's by
/// CAP_LEASE) is granted only when the inode has no writer but ours (none: opened
/// read-only), and is given back at once.
fn no_writer_left(dir: &OwnedFd, dir_path: &Path, name: &OsStr) -> Result<(), JailError> {
    let path = dir_path.join(name);
    let file = nofollow::open_regular_at(dir, name).map_err(io("opening", &path))?;
    // SAFETY: fcntl on a descriptor we hold open; no memory is passed.
    match check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_WRLCK) }) {
        Ok(()) => {
            // SAFETY: as above.
            check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) })
                .map_err(io("giving back the lease on", &path))
        }
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Err(JailError::StillWritable { path }),
        Err(e) => Err(io("taking a lease on", &path)(e)),
    }
}

/// Takes the frozen disk layer `name` out of the VMM's directory `vmm_dir` into the host's
/// directory `into` (a rename: the VMM keeps reading it through its open descriptor) and
/// hands it over to root ([`hand_over_at`]). Returns its new path. Left in `vmm_dir`, it
/// could be replaced by its writer under the restores that read it.
pub(super) fn take_layer(vmm_dir: &Path, name: &OsStr, into: &Path) -> Result<PathBuf, JailError> {
    let path = into.join(name);
    let src = nofollow::open_dir(vmm_dir).map_err(io("opening", vmm_dir))?;
    let dst = nofollow::open_dir(into).map_err(io("opening", into))?;
    let c = cstr(name, &path)?;
    rename_at(&src, &dst, &c).map_err(io("moving", &vmm_dir.join(name)))?;
    hand_over_at(&dst, into, name)?;
    Ok(path)
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

/// TUNSETOWNER / TUNSETGROUP (`_IOW('T', 204 / 206, int)`), and TUNSETIFF (202).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOWNER: libc::c_ulong = 0x4004_54cc;
const TUNSETGROUP: libc::c_ulong = 0x4004_54ce;

/// Makes the sandbox's TAP (in namespace `netns`) attachable by `uid` without privileges.
fn give_tap(netns: &std::fs::File, uid: u32) -> Result<(), JailError> {
    let tap = |what, source| JailError::Tap { uid, what, source };
    let fd = netns.as_raw_fd();
    // setns moves only the calling thread: a thread of its own, which ends right after, so
    // no task of the daemon ever runs in the sandbox's namespace.
    let joined = std::thread::scope(|s| {
        s.spawn(move || -> Result<(), JailError> {
            // SAFETY: setns with a namespace descriptor the caller keeps open; checked.
            if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                return Err(tap("setns", std::io::Error::last_os_error()));
            }
            let tun = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/net/tun")
                .map_err(|e| tap("opening /dev/net/tun", e))?;
            // SAFETY: ifreq is plain old data; all-zero is valid.
            let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
            for (d, s) in ifr.ifr_name.iter_mut().zip(network::TAP_NAME.as_bytes()) {
                *d = *s as libc::c_char;
            }
            // The flags the VMM attaches with (a vnet header), so its attach changes nothing.
            ifr.ifr_ifru.ifru_flags =
                (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
            // SAFETY: TUNSETIFF reads and writes the ifreq we own; checked.
            if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF, &mut ifr) } < 0 {
                return Err(tap("TUNSETIFF", std::io::Error::last_os_error()));
            }
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
mod tests {
    use super::*;

    #[test]
    fn the_jail_is_on_where_the_host_allows_unless_turned_off_and_bad_settings_are_refused() {
        let s = |v: &str| Some(v.to_string());
        let default = JailPolicy {
            uid_base: DEFAULT_UID_BASE,
        };
        assert_eq!(
            JailSetting::parse(None, None).unwrap(),
            JailSetting::Auto(default)
        );
        assert_eq!(
            JailSetting::parse(s("0"), s("junk")).unwrap(),
            JailSetting::Off
        );
        assert_eq!(
            JailSetting::parse(s("1"), None).unwrap(),
            JailSetting::Required(default)
        );
        assert_eq!(
            JailSetting::parse(s("1"), s("200000")).unwrap(),
            JailSetting::Required(JailPolicy { uid_base: 200_000 })
        );
        let able = HostSupport {
            cgroup_v2: true,
            pivotable_root: true,
        };
        let v1 = HostSupport {
            cgroup_v2: false,
            ..able
        };
        let initramfs = HostSupport {
            pivotable_root: false,
            ..able
        };
        assert_eq!(
            JailSetting::Auto(default).resolve(able),
            (Some(default), None)
        );
        for host in [v1, initramfs] {
            let (policy, why) = JailSetting::Auto(default).resolve(host);
            assert_eq!(policy, None);
            assert!(why.is_some());
        }
        // Required is required: its creates fail where the jail cannot be made.
        assert_eq!(JailSetting::Required(default).resolve(v1).0, Some(default));
        assert_eq!(JailSetting::Off.resolve(able).0, None);
        for (enable, base) in [
            ("yes", None),
            ("1", s("0")),
            ("1", s("4294967000")),
            ("1", s("x")),
        ] {
            let err = JailSetting::parse(s(enable), base).expect_err("refused");
            assert!(matches!(err, JailError::BadSetting { .. }), "{err}");
        }
    }

    #[test]
    fn an_initramfs_root_is_told_from_a_mounted_one() {
        let initramfs = "1 1 0:2 / / rw - rootfs rootfs rw\n20 1 0:19 / /proc rw - proc proc rw\n";
        assert!(!root_has_parent(initramfs));
        let disk = "25 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    40 25 0:5 / /run rw - tmpfs tmpfs rw\n";
        assert!(root_has_parent(disk));
        // Chrooted into a bind of the initramfs (the nested harness's L1): a mount with a
        // parent, which pivot_root accepts.
        assert!(root_has_parent("30 1 0:2 / / rw - rootfs rootfs rw\n"));
        // Chrooted into a plain directory: no mount at `/`.
        assert!(!root_has_parent("30 1 0:2 / /mnt rw - ext4 /dev/sda1 rw\n"));
        // This host.
        let here = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(root_has_parent(&here), "{here}");
    }

    #[test]
    fn uids_in_use_are_skipped_and_the_search_wraps() {
        assert_eq!(pick(100, 4, 0, |_| false), Some((100, 0)));
        assert_eq!(pick(100, 4, 1, |u| u == 101 || u == 102), Some((103, 3)));
        assert_eq!(pick(100, 4, 3, |u| u == 103), Some((100, 0)));
        assert_eq!(pick(100, 4, 0, |_| true), None);
    }

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

    /// A host file a VMM would like root to chown or chmod: owned by someone else (when we
    /// can), mode 0600. Returns its (uid, mode) to compare with afterwards.
    fn victim(path: &Path) -> (u32, u32) {
        std::fs::write(path, b"precious").expect("victim");
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .expect("chmod");
        if is_root() {
            std::os::unix::fs::chown(path, Some(4242), Some(4242)).expect("chown");
        }
        let meta = std::fs::metadata(path).expect("victim");
        (meta.uid(), meta.mode() & 0o7777)
    }

    fn untouched(path: &Path, before: (u32, u32)) {
        let meta = std::fs::metadata(path).expect("victim");
        assert_eq!(
            (meta.uid(), meta.mode() & 0o7777),
            before,
            "{}",
            path.display()
        );
        assert_eq!(std::fs::read(path).expect("victim"), b"precious");
    }

    /// A jailed VMM's snapshot dir (`from`) and the host's destination (`dest`) in `tmp`.
    fn snapshot_dirs(tmp: &Path) -> (PathBuf, PathBuf) {
        let (from, dest) = (tmp.join("vmm/snapshot.1"), tmp.join("dest"));
        std::fs::create_dir_all(&from).expect("from");
        std::fs::create_dir_all(&dest).expect("dest");
        (from, dest)
    }

    #[test]
    fn snapshot_files_move_out_as_roots_regular_files() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (from, dest) = snapshot_dirs(tmp.path());
        std::fs::write(from.join("vm.state"), b"state").expect("state");
        std::fs::write(from.join("vm.mem"), b"mem").expect("mem");
        move_out(&from, &dest, "vm.state", "vm.mem", None).expect("moved");
        for (name, bytes) in [("vm.state", &b"state"[..]), ("vm.mem", b"mem")] {
            let meta = std::fs::symlink_metadata(dest.join(name)).expect(name);
            assert!(meta.is_file());
            assert_eq!(meta.mode() & 0o7777, 0o644);
            if is_root() {
                assert_eq!(meta.uid(), 0);
            }
            assert_eq!(std::fs::read(dest.join(name)).expect(name), bytes);
            assert!(!from.join(name).exists());
        }
        let meta = std::fs::metadata(&dest).expect("dest");
        assert_eq!(meta.mode() & 0o777, 0o700);
    }

    /// The VMM swapped its state file for a link to a host file (or a FIFO): the move is
    /// refused with a typed error, and the host file keeps its owner, mode and bytes.
    #[test]
    fn a_snapshot_file_its_writer_still_holds_open_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (from, dest) = snapshot_dirs(tmp.path());
        std::fs::write(from.join("vm.state"), b"state").expect("state");
        std::fs::write(from.join("vm.mem"), b"mem").expect("mem");
        // The writer keeps a descriptor open for writing across the hand-over.
        let kept = std::fs::OpenOptions::new()
            .write(true)
            .open(from.join("vm.mem"))
            .expect("open for writing");
        let err = move_out(&from, &dest, "vm.state", "vm.mem", None).expect_err("kept a writer");
        assert!(matches!(err, JailError::StillWritable { .. }), "{err}");
        drop(kept);
        // Closed: the same files pass.
        let (from, dest) = (tmp.path().join("vmm/snapshot.2"), tmp.path().join("dest2"));
        for dir in [&from, &dest] {
            std::fs::create_dir_all(dir).expect("dir");
        }
        std::fs::write(from.join("vm.state"), b"state").expect("state");
        std::fs::write(from.join("vm.mem"), b"mem").expect("mem");
        move_out(&from, &dest, "vm.state", "vm.mem", None).expect("no writer left");
    }

    #[test]
    fn a_snapshot_file_swapped_for_a_link_or_a_fifo_is_refused_and_its_target_untouched() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let target = tmp.path().join("shadow");
        let before = victim(&target);
        let (from, dest) = snapshot_dirs(tmp.path());
        std::os::unix::fs::symlink(&target, from.join("vm.state")).expect("link");
        std::fs::write(from.join("vm.mem"), b"mem").expect("mem");
        let err = move_out(&from, &dest, "vm.state", "vm.mem", Some(std::process::id()))
            .expect_err("moved a link");
        assert!(
            matches!(
                err,
                JailError::NotAFile {
                    kind: "a symbolic link",
                    ..
                }
            ),
            "{err}"
        );
        untouched(&target, before);

        // The memory as a link: only a fork's, and only to its VMM's own descriptors.
        let (from, dest) = (tmp.path().join("vmm/snapshot.2"), tmp.path().join("dest2"));
        for dir in [&from, &dest] {
            std::fs::create_dir_all(dir).expect("dir");
        }
        std::fs::write(from.join("vm.state"), b"state").expect("state");
        std::os::unix::fs::symlink(&target, from.join("vm.mem")).expect("link");
        let err = move_out(&from, &dest, "vm.state", "vm.mem", Some(std::process::id()))
            .expect_err("kept a link to a host file");
        assert!(matches!(err, JailError::BadMemoryLink { .. }), "{err}");
        untouched(&target, before);

        // A FIFO: refused at once (the open does not wait for a writer).
        let (from, dest) = (tmp.path().join("vmm/snapshot.3"), tmp.path().join("dest3"));
        for dir in [&from, &dest] {
            std::fs::create_dir_all(dir).expect("dir");
        }
        let fifo = CString::new(from.join("vm.state").as_os_str().as_bytes()).expect("path");
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let err = move_out(&from, &dest, "vm.state", "vm.mem", None).expect_err("a FIFO");
        assert!(
            matches!(err, JailError::NotAFile { kind: "a FIFO", .. }),
            "{err}"
        );
    }

    #[test]
    fn a_forks_memory_link_is_kept_only_to_its_vmms_descriptors() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (from, dest) = snapshot_dirs(tmp.path());
        let pid = std::process::id();
        std::fs::write(from.join("vm.state"), b"state").expect("state");
        let target = format!("/proc/{pid}/fd/3");
        std::os::unix::fs::symlink(&target, from.join("vm.mem")).expect("link");
        move_out(&from, &dest, "vm.state", "vm.mem", Some(pid)).expect("a fork's memory");
        assert_eq!(
            std::fs::read_link(dest.join("vm.mem")).expect("link"),
            Path::new(&target)
        );
        assert!(is_fork_memory_link(b"/proc/12/fd/7", 12));
        for bad in [
            &b"/proc/13/fd/7"[..],
            b"/proc/12/fd/",
            b"/proc/12/fd/7/../../../../etc/shadow",
            b"/proc/12/root/etc/shadow",
            b"/etc/shadow",
        ] {
            assert!(
                !is_fork_memory_link(bad, 12),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// Across filesystems (the rename fails with EXDEV) the files are copied, with the same
    /// checks: a link to a host file is refused, a fork's memory link is made anew.
    #[test]
    fn snapshot_files_copied_across_filesystems_get_the_same_checks() {
        let (Ok(shm), Ok(tmp)) = (
            tempfile::tempdir_in("/dev/shm"),
            tempfile::tempdir_in(std::env::temp_dir()),
        ) else {
            return;
        };
        let dev = |p: &Path| std::fs::metadata(p).map(|m| m.dev()).unwrap_or(0);
        if dev(shm.path()) == dev(tmp.path()) {
            return; // one filesystem here: nothing to cross
        }
        let (from, _) = snapshot_dirs(shm.path());
        let dest = tmp.path().join("dest");
        std::fs::create_dir_all(&dest).expect("dest");
        let pid = std::process::id();
        std::fs::write(from.join("vm.state"), b"state").expect("state");
        let link = format!("/proc/{pid}/fd/3");
        std::os::unix::fs::symlink(&link, from.join("vm.mem")).expect("link");
        move_out(&from, &dest, "vm.state", "vm.mem", Some(pid)).expect("copied");
        assert_eq!(
            std::fs::read(dest.join("vm.state")).expect("state"),
            b"state"
        );
        let meta = std::fs::symlink_metadata(dest.join("vm.state")).expect("state");
        assert_eq!(meta.mode() & 0o7777, 0o644);
        assert_eq!(
            std::fs::read_link(dest.join("vm.mem")).expect("link"),
            Path::new(&link)
        );

        let target = tmp.path().join("shadow");
        let before = victim(&target);
        let from = shm.path().join("vmm/snapshot.2");
        let dest = tmp.path().join("dest2");
        for dir in [&from, &dest] {
            std::fs::create_dir_all(dir).expect("dir");
        }
        std::os::unix::fs::symlink(&target, from.join("vm.state")).expect("link");
        let err = move_out(&from, &dest, "vm.state", "vm.mem", None).expect_err("a link");
        assert!(matches!(err, JailError::NotAFile { .. }), "{err}");
        untouched(&target, before);
        assert!(!dest.join("vm.state").exists());
    }

    /// A frozen disk top swapped for a link: not handed over, its target untouched; a real
    /// one leaves the VMM's directory for the host's.
    #[test]
    fn frozen_layers_leave_the_vmm_dir_and_links_are_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (vmm, state) = (tmp.path().join("state/vmm"), tmp.path().join("state"));
        std::fs::create_dir_all(&vmm).expect("vmm dir");
        std::fs::write(vmm.join("disk.overlay"), b"layer").expect("layer");
        let moved = take_layer(&vmm, OsStr::new("disk.overlay"), &state).expect("taken");
        assert_eq!(moved, state.join("disk.overlay"));
        assert!(!vmm.join("disk.overlay").exists());
        let meta = std::fs::symlink_metadata(&moved).expect("layer");
        assert_eq!(meta.mode() & 0o7777, 0o644);

        let target = tmp.path().join("sandcell.db");
        let before = victim(&target);
        std::os::unix::fs::symlink(&target, vmm.join("disk.top.1")).expect("link");
        let err = take_layer(&vmm, OsStr::new("disk.top.1"), &state).expect_err("a link");
        assert!(matches!(err, JailError::NotAFile { .. }), "{err}");
        untouched(&target, before);
        let err = hand_over(&state.join("disk.top.1")).expect_err("a link");
        assert!(matches!(err, JailError::NotAFile { .. }), "{err}");
        untouched(&target, before);
    }

    /// The VMM's directories are made and given through descriptors: a link planted at the
    /// name (from an earlier start) is not followed to chown what it points to.
    #[test]
    fn a_vmm_dir_planted_as_a_link_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (run, outside) = (tmp.path().join("run"), tmp.path().join("etc"));
        std::fs::create_dir_all(&run).expect("run");
        std::fs::create_dir_all(&outside).expect("outside");
        let before = std::fs::metadata(&outside).expect("outside");
        std::os::unix::fs::symlink(&outside, run.join(VMM_DIR)).expect("link");
        assert!(vmm_dir(&run, VMM_DIR, 3_000_000_123).is_err());
        let after = std::fs::metadata(&outside).expect("outside");
        assert_eq!(
            (after.uid(), after.mode()),
            (before.uid(), before.mode()),
            "the link was followed"
        );
        if is_root() {
            let dir = vmm_dir(&run, "snapshot.1", 4242).expect("a fresh dir");
            let meta = std::fs::metadata(&dir).expect("dir");
            assert_eq!((meta.uid(), meta.mode() & 0o777), (4242, 0o700));
        }
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no arguments and cannot fail.
        unsafe { libc::geteuid() == 0 }
    }

    #[test]
    fn a_leased_uid_is_not_leased_again_until_dropped() {
        // A base no process runs as (the test's own uids are far below).
        let base = 3_000_000_000;
        let a = lease_uid(base).expect("a uid");
        let b = lease_uid(base).expect("another uid");
        assert_ne!(a.uid(), b.uid());
        let (ua, ub) = (a.uid(), b.uid());
        drop(a);
        assert!(!lock(&HELD).contains(&ua));
        assert!(lock(&HELD).contains(&ub));
    }
}
