//! Flattening overlayfs layers into one: what a gVisor snapshot records of a sandbox's root.
//!
//! A sandbox restored from a snapshot runs on `[its own upper, the snapshot's upper, image
//! tree]`. A snapshot (or pause, or fork) of it must not depend on the snapshot below it,
//! which may be deleted (and a pause recorded only its own upper: issue 12, the resume failed
//! with "no such file or directory"). So a checkpoint merges every layer above the image into
//! the new snapshot's `upper/`, the way overlayfs would show them, and every snapshot is
//! always `[its upper, image tree]`:
//!
//! - a whiteout (a character device 0/0) removes what deeper layers have at its name and
//!   stays a whiteout (the image may have that name);
//! - an opaque directory (`trusted.overlay.opaque=y`) replaces what deeper layers have and
//!   stays opaque (it hides the image's directory);
//! - a plain directory merges into a deeper one; over a deeper file or whiteout it becomes
//!   opaque (overlayfs stops merging there, so the image's directory must stay hidden);
//! - anything else replaces what deeper layers have.
//!
//! The layers are guest data (written through runsc's gofer), read by the host as root:
//! every name is opened relative to its directory's descriptor with `O_NOFOLLOW`
//! (crate::nofollow's rule), links are copied as links, device nodes other than whiteouts
//! are skipped, overlayfs's own bookkeeping xattrs are dropped (redirects and metacopy,
//! which a flattened copy cannot honour, are refused; the host overlay is mounted without
//! them), and the copy is bounded in depth and bytes. Hard links are copied as separate
//! files.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Deepest directory nesting copied (each level holds three descriptors while it is copied).
pub const MAX_DEPTH: usize = 200;
/// The xattr that makes a directory opaque.
const OPAQUE: &str = "trusted.overlay.opaque";
/// overlayfs's own xattrs: not copied (the flattened layer has no origin, index or
/// redirect of its own).
const OVERLAY_PREFIX: &str = "trusted.overlay.";
/// Longest symlink target read (Linux: PATH_MAX).
const MAX_LINK: usize = 4096;
/// Largest xattr value copied (Linux: XATTR_SIZE_MAX).
const MAX_XATTR: usize = 65536;

#[derive(Debug, thiserror::Error)]
pub enum FlattenError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: directories nested deeper than {MAX_DEPTH}")]
    TooDeep { path: PathBuf },
    #[error("the layers hold more than {limit} bytes of files (the snapshot's limit)")]
    TooLarge { limit: u64 },
    #[error(
        "{path}: overlayfs {xattr} (a layer made with redirect_dir or metacopy) cannot be flattened"
    )]
    Unsupported { path: PathBuf, xattr: String },
}

/// What a flatten copied.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    pub entries: u64,
    pub bytes: u64,
}

/// Merges `layers` (top first, each an overlayfs upper dir) into `dest`, a new directory
/// (it must not exist), copying at most `max_bytes` of file data.
pub fn flatten(layers: &[&Path], dest: &Path, max_bytes: u64) -> Result<Copied, FlattenError> {
    let mut job = Job {
        copied: Copied::default(),
        max_bytes,
    };
    let c = cpath(dest)?;
    // SAFETY: `c` is a valid NUL-terminated string; mkdir does not follow a final link.
    cvt(unsafe { libc::mkdir(c.as_ptr(), 0o755) }).map_err(io_err("creating", dest))?;
    let dst = crate::nofollow::open_dir(dest).map_err(io_err("opening", dest))?;
    // Deepest first: each layer goes over what is below it.
    for layer in layers.iter().rev() {
        let src = crate::nofollow::open_dir(layer).map_err(io_err("opening", layer))?;
        let mut at = layer.to_path_buf();
        job.merge_dir(&src, &dst, &mut at, 0)?;
        // The root directory's own attributes are the top layer's.
        copy_meta(&src, &dst, &at)?;
    }
    Ok(job.copied)
}

struct Job {
    copied: Copied,
    max_bytes: u64,
}

impl Job {
    /// Merges directory `src` (at `at`, for messages) into directory `dst`.
    fn merge_dir(
        &mut self,
        src: &OwnedFd,
        dst: &OwnedFd,
        at: &mut PathBuf,
        depth: usize,
    ) -> Result<(), FlattenError> {
        if depth >= MAX_DEPTH {
            return Err(FlattenError::TooDeep { path: at.clone() });
        }
        for name in list_dir(src, at)? {
            at.push(&name);
            let result = self.merge_entry(src, dst, &name, at, depth);
            at.pop();
            result?;
        }
        Ok(())
    }

    fn merge_entry(
        &mut self,
        src: &OwnedFd,
        dst: &OwnedFd,
        name: &OsStr,
        at: &mut PathBuf,
        depth: usize,
    ) -> Result<(), FlattenError> {
        let c = cstr(name, at)?;
        let st = stat_at(src, &c).map_err(io_err("stat", at))?;
        self.copied.entries += 1;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                let s = open_at(src, &c, libc::O_DIRECTORY).map_err(io_err("opening", at))?;
                refuse_redirects(&s, at)?;
                let opaque = get_xattr(&s, OPAQUE).map_err(io_err("reading xattrs of", at))?
                    == Some(b"y".to_vec());
                let below = stat_at(dst, &c).ok().map(|b| b.st_mode & libc::S_IFMT);
                let mark_opaque = match below {
                    Some(libc::S_IFDIR) if !opaque => false,
                    Some(_) => {
                        remove_at(dst, &c, depth).map_err(io_err("removing", at))?;
                        true
                    }
                    None => opaque,
                };
                if below != Some(libc::S_IFDIR) || opaque {
                    // SAFETY: `dst` is an open directory and `c` a valid NUL-terminated string.
                    cvt(unsafe { libc::mkdirat(dst.as_raw_fd(), c.as_ptr(), 0o700) })
                        .map_err(io_err("creating", at))?;
                }
                let d = open_at(dst, &c, libc::O_DIRECTORY).map_err(io_err("opening", at))?;
                if mark_opaque {
                    set_xattr(&d, OPAQUE, b"y").map_err(io_err("marking opaque", at))?;
                }
                self.merge_dir(&s, &d, at, depth + 1)?;
                // After its entries, whose creation changed its times.
                copy_meta(&s, &d, at)
            }
            libc::S_IFREG => {
                remove_at(dst, &c, depth).map_err(io_err("removing", at))?;
                let s = open_at(src, &c, libc::O_RDONLY).map_err(io_err("opening", at))?;
                refuse_redirects(&s, at)?;
                let size = u64::try_from(st.st_size).unwrap_or(0);
                self.copied.bytes = self.copied.bytes.saturating_add(size);
                if self.copied.bytes > self.max_bytes {
                    return Err(FlattenError::TooLarge {
                        limit: self.max_bytes,
                    });
                }
                // SAFETY: as above; O_EXCL fails on any existing name, a link included.
                let fd = cvt(unsafe {
                    libc::openat(
                        dst.as_raw_fd(),
                        c.as_ptr(),
                        libc::O_WRONLY
                            | libc::O_CREAT
                            | libc::O_EXCL
                            | libc::O_NOFOLLOW
                            | libc::O_CLOEXEC,
                        0o600 as libc::c_uint,
                    )
                })
                .map_err(io_err("creating", at))?;
                // SAFETY: `fd` was just opened and is owned by nobody else.
                let d = unsafe { OwnedFd::from_raw_fd(fd) };
                let mut from = std::fs::File::from(s.try_clone().map_err(io_err("dup", at))?);
                let mut to = std::fs::File::from(d.try_clone().map_err(io_err("dup", at))?);
                // Bounded by the size seen: a file that grew meanwhile is cut there.
                let mut from_limited = io::Read::take(&mut from, size);
                io::copy(&mut from_limited, &mut to).map_err(io_err("copying", at))?;
                copy_meta(&s, &d, at)
            }
            libc::S_IFLNK => {
                remove_at(dst, &c, depth).map_err(io_err("removing", at))?;
                let target = read_link_at(src, &c).map_err(io_err("reading link", at))?;
                // SAFETY: both strings are valid and NUL-terminated; symlinkat creates the
                // link itself and follows nothing.
                cvt(unsafe { libc::symlinkat(target.as_ptr(), dst.as_raw_fd(), c.as_ptr()) })
                    .map_err(io_err("creating link", at))?;
                copy_meta_at(dst, &c, &st, at)
            }
            libc::S_IFCHR if st.st_rdev == 0 => {
                // A whiteout.
                remove_at(dst, &c, depth).map_err(io_err("removing", at))?;
                mknod_at(dst, &c, libc::S_IFCHR, 0).map_err(io_err("creating whiteout", at))
            }
            kind @ (libc::S_IFIFO | libc::S_IFSOCK) => {
                remove_at(dst, &c, depth).map_err(io_err("removing", at))?;
                mknod_at(dst, &c, kind | (st.st_mode & 0o7777), 0)
                    .map_err(io_err("creating", at))?;
                copy_meta_at(dst, &c, &st, at)
            }
            _ => {
                // A device node written by a guest is never carried into a host layer.
                tracing::warn!("flattening layers: skipped device node {}", at.display());
                Ok(())
            }
        }
    }
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> FlattenError {
    let path = path.to_path_buf();
    move |source| FlattenError::Io { op, path, source }
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn cstr(name: &OsStr, at: &Path) -> Result<CString, FlattenError> {
    CString::new(name.as_bytes()).map_err(|_| FlattenError::Io {
        op: "naming",
        path: at.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in a name"),
    })
}

fn cpath(path: &Path) -> Result<CString, FlattenError> {
    cstr(path.as_os_str(), path)
}

fn stat_at(dir: &OwnedFd, name: &CString) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value for fstatat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is an open directory, `name` a valid string, `st` a valid buffer;
    // AT_SYMLINK_NOFOLLOW stats a link itself.
    cvt(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

fn open_at(dir: &OwnedFd, name: &CString, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: `dir` is an open directory and `name` a valid NUL-terminated string.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_RDONLY,
        )
    })?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn mknod_at(dir: &OwnedFd, name: &CString, mode: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    // SAFETY: `dir` is an open directory and `name` a valid string; mknodat creates a new
    // name (EEXIST on any existing one) and follows nothing.
    cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, dev) }).map(drop)
}

/// The names in directory `dir`, read through its descriptor (`/proc/self/fd` names that
/// open directory, not a path a guest could change).
fn list_dir(dir: &OwnedFd, at: &Path) -> Result<Vec<std::ffi::OsString>, FlattenError> {
    let via = format!("/proc/self/fd/{}", dir.as_raw_fd());
    let entries = std::fs::read_dir(&via).map_err(io_err("listing", at))?;
    entries
        .map(|e| e.map(|e| e.file_name()).map_err(io_err("listing", at)))
        .collect()
}

/// Removes whatever is at `name` in `dir` (a directory with its contents); nothing there is
/// fine.
fn remove_at(dir: &OwnedFd, name: &CString, depth: usize) -> io::Result<()> {
    let st = match stat_at(dir, name) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        other => other?,
    };
    let mut flags = 0;
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        if depth >= MAX_DEPTH {
            return Err(io::Error::other(format!(
                "directories nested deeper than {MAX_DEPTH}"
            )));
        }
        let sub = open_at(dir, name, libc::O_DIRECTORY)?;
        let via = format!("/proc/self/fd/{}", sub.as_raw_fd());
        for entry in std::fs::read_dir(via)? {
            let child = CString::new(entry?.file_name().as_bytes())
                .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte"))?;
            remove_at(&sub, &child, depth + 1)?;
        }
        flags = libc::AT_REMOVEDIR;
    }
    // SAFETY: `dir` is an open directory and `name` a valid string; unlinkat removes the
    // name itself, never a link's target.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

fn read_link_at(dir: &OwnedFd, name: &CString) -> io::Result<CString> {
    let mut buf = vec![0u8; MAX_LINK + 1];
    // SAFETY: `buf` has room for `buf.len()` bytes; readlinkat writes at most that many.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    if n > MAX_LINK {
        return Err(io::Error::other(format!(
            "link target longer than {MAX_LINK} bytes"
        )));
    }
    buf.truncate(n);
    CString::new(buf).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "NUL in a link"))
}

fn get_xattr(fd: &OwnedFd, name: &str) -> io::Result<Option<Vec<u8>>> {
    let c = CString::new(name).map_err(|_| io::Error::other("NUL in an xattr name"))?;
    let mut buf = vec![0u8; MAX_XATTR];
    // SAFETY: `fd` is open, `c` a valid string, `buf` has room for `buf.len()` bytes.
    let n = unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    match usize::try_from(n) {
        Ok(n) => {
            buf.truncate(n);
            Ok(Some(buf))
        }
        Err(_) => match io::Error::last_os_error() {
            e if matches!(e.raw_os_error(), Some(libc::ENODATA | libc::ENOTSUP)) => Ok(None),
            e => Err(e),
        },
    }
}

fn set_xattr(fd: &OwnedFd, name: &str, value: &[u8]) -> io::Result<()> {
    let c = CString::new(name).map_err(|_| io::Error::other("NUL in an xattr name"))?;
    // SAFETY: `fd` is open, `c` a valid string, `value` valid for its length.
    cvt(unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            c.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
    .map(drop)
}

fn list_xattrs(fd: &OwnedFd) -> io::Result<Vec<String>> {
    let mut buf = vec![0u8; MAX_XATTR];
    // SAFETY: `fd` is open and `buf` has room for `buf.len()` bytes.
    let n = unsafe { libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    let n = match usize::try_from(n) {
        Ok(n) => n,
        Err(_) => match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
            e => return Err(e),
        },
    };
    Ok(buf[..n]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect())
}

/// Redirects and metacopy point into the layers below: a copy cannot honour them.
fn refuse_redirects(fd: &OwnedFd, at: &Path) -> Result<(), FlattenError> {
    for xattr in ["trusted.overlay.redirect", "trusted.overlay.metacopy"] {
        if get_xattr(fd, xattr)
            .map_err(io_err("reading xattrs of", at))?
            .is_some()
        {
            return Err(FlattenError::Unsupported {
                path: at.to_path_buf(),
                xattr: xattr.into(),
            });
        }
    }
    Ok(())
}

/// Owner, mode, xattrs (overlayfs's own aside) and times of `src` onto `dst` (a file or
/// directory both open).
fn copy_meta(src: &OwnedFd, dst: &OwnedFd, at: &Path) -> Result<(), FlattenError> {
    // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `src` is open and `st` a valid buffer.
    cvt(unsafe { libc::fstat(src.as_raw_fd(), &mut st) }).map_err(io_err("stat", at))?;
    for name in list_xattrs(src).map_err(io_err("listing xattrs of", at))? {
        if name.starts_with(OVERLAY_PREFIX) {
            continue;
        }
        if let Some(value) = get_xattr(src, &name).map_err(io_err("reading xattrs of", at))?
            && let Err(e) = set_xattr(dst, &name, &value)
        {
            // As `cp -a`: an xattr the host filesystem refuses is not the copy's end.
            tracing::debug!("flattening layers: xattr {name} of {}: {e}", at.display());
        }
    }
    // Owner before mode: chown clears setuid bits.
    // SAFETY: `dst` is open; fchown and fchmod act on it only.
    cvt(unsafe { libc::fchown(dst.as_raw_fd(), st.st_uid, st.st_gid) })
        .map_err(io_err("chown", at))?;
    // SAFETY: as above.
    cvt(unsafe { libc::fchmod(dst.as_raw_fd(), st.st_mode & 0o7777) })
        .map_err(io_err("chmod", at))?;
    let times = [
        libc::timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec,
        },
        libc::timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec,
        },
    ];
    // SAFETY: `dst` is open and `times` holds the two timespecs futimens reads.
    cvt(unsafe { libc::futimens(dst.as_raw_fd(), times.as_ptr()) })
        .map_err(io_err("setting times of", at))
        .map(drop)
}

/// Owner and times of a link, fifo or socket `name` in `dir`, from `st` (nothing followed).
fn copy_meta_at(
    dir: &OwnedFd,
    name: &CString,
    st: &libc::stat,
    at: &Path,
) -> Result<(), FlattenError> {
    // SAFETY: `dir` is an open directory and `name` a valid string; AT_SYMLINK_NOFOLLOW
    // changes the name itself.
    cvt(unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.st_uid,
            st.st_gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map_err(io_err("chown", at))?;
    let times = [
        libc::timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec,
        },
        libc::timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec,
        },
    ];
    // SAFETY: as above; `times` holds the two timespecs utimensat reads.
    cvt(unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            name.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map_err(io_err("setting times of", at))
    .map(drop)
}

#[cfg(test)]
#[path = "flatten_tests.rs"]
mod tests;
