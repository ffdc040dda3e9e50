//! What a jailed VMM wrote, out of its reach: snapshot files and frozen layers are moved out
//! of its [`super::VMM_DIR`] (renamed first, into a directory of root's, then checked and handed
//! over through a descriptor, so the VMM can no longer swap what is checked), and never
//! through a link it may have planted (crate::nofollow).

use super::JailError;
use crate::nofollow;
use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// The error of `what` on `path`: [`JailError::NotAFile`] when it was refused as no
/// regular file (crate::nofollow::NotRegular), else [`JailError::Io`].
pub(super) fn io(
    what: &'static str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> JailError + use<> {
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
pub(in crate::microvm) fn vmm_dir(
    parent: &Path,
    name: &str,
    uid: u32,
) -> Result<PathBuf, JailError> {
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
pub(in crate::microvm) fn hand_over(file: &Path) -> Result<(), JailError> {
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
pub(in crate::microvm) fn private_dir(dir: &Path) -> Result<(), JailError> {
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
pub(in crate::microvm) fn is_fork_memory_link(target: &[u8], pid: u32) -> bool {
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
pub(in crate::microvm) fn move_out(
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
pub(in crate::microvm) fn take_layer(
    vmm_dir: &Path,
    name: &OsStr,
    into: &Path,
) -> Result<PathBuf, JailError> {
    let path = into.join(name);
    let src = nofollow::open_dir(vmm_dir).map_err(io("opening", vmm_dir))?;
    let dst = nofollow::open_dir(into).map_err(io("opening", into))?;
    let c = cstr(name, &path)?;
    rename_at(&src, &dst, &c).map_err(io("moving", &vmm_dir.join(name)))?;
    hand_over_at(&dst, into, name)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::super::{VMM_DIR, is_root};
    use super::*;
    use std::os::unix::fs::MetadataExt;

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
}
