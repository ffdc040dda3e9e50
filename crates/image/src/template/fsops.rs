//! File system work of a build on the host, as root, over trees we do not trust: reading a
//! build context or an earlier stage's files without following their symlinks out of them
//! (`openat2(RESOLVE_IN_ROOT)`: every path is resolved as if the tree were `/`), and the
//! overlayfs mounts that stack a stage's layers.

use crate::{Error, Result};
use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// A directory tree read as its own root.
pub(crate) struct RootDir {
    fd: OwnedFd,
    pub(crate) path: PathBuf,
}

impl RootDir {
    pub(crate) fn open(path: &Path) -> Result<RootDir> {
        let c = cstring(path)?;
        // SAFETY: c is NUL-terminated; the returned descriptor is checked and then owned.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(Error::io("opening", path)(io::Error::last_os_error()));
        }
        // SAFETY: fd is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(RootDir {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// `rel` resolved inside the tree (`..` and absolute symlinks stop at its root).
    fn open_at(&self, rel: &Path, flags: i32) -> io::Result<OwnedFd> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let c = CString::new(rel.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
        // SAFETY: open_how is plain integers; all-zero is its documented default.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC) as u64;
        how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: the dirfd is ours and open, c is NUL-terminated and `how` is a valid
        // open_how of the size passed.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                self.fd.as_raw_fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor from openat2, owned from here on.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    /// The entry itself (a symlink is not followed).
    pub(crate) fn lstat(&self, rel: &Path) -> io::Result<std::fs::Metadata> {
        let fd = self.open_at(rel, libc::O_PATH | libc::O_NOFOLLOW)?;
        File::from(fd).metadata()
    }

    /// Follows a last-component symlink (inside the tree): what `COPY link dst` copies.
    pub(crate) fn stat(&self, rel: &Path) -> io::Result<std::fs::Metadata> {
        let fd = self.open_at(rel, libc::O_PATH)?;
        File::from(fd).metadata()
    }

    pub(crate) fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        let fd = self.open_at(rel, libc::O_PATH | libc::O_NOFOLLOW)?;
        let mut buf = vec![0u8; 4096];
        // SAFETY: fd is an O_PATH descriptor of the link (empty path: the link itself);
        // buf is writable for its length.
        let n = unsafe {
            libc::readlinkat(
                fd.as_raw_fd(),
                c"".as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(PathBuf::from(OsString::from_vec(buf)))
    }

    /// Names in directory `rel` (followed if it is a symlink inside the tree), sorted.
    pub(crate) fn list(&self, rel: &Path) -> io::Result<Vec<OsString>> {
        let fd = self.open_at(rel, libc::O_RDONLY | libc::O_DIRECTORY)?;
        let mut names: Vec<OsString> =
            std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))?
                .map(|e| e.map(|e| e.file_name()))
                .collect::<io::Result<_>>()?;
        names.sort();
        Ok(names)
    }

    /// A regular file's content (a symlink as the last component is followed inside the
    /// tree only when `follow`).
    pub(crate) fn open_file(&self, rel: &Path, follow: bool) -> io::Result<File> {
        let flags = libc::O_RDONLY | if follow { 0 } else { libc::O_NOFOLLOW };
        Ok(File::from(self.open_at(rel, flags)?))
    }
}

use std::os::unix::ffi::OsStringExt;

fn cstring(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| Error::BadEntry {
        layer: "build".into(),
        path: path.display().to_string(),
        problem: "NUL byte in path".into(),
    })
}

/// An overlayfs mount, unmounted when dropped.
pub(crate) struct Mount {
    target: PathBuf,
}

impl Mount {
    /// `lowers` top first. With `upper_work`, writable; without it, read-only (overlayfs
    /// needs two lowers then: a single one is bound read-only instead).
    pub(crate) fn overlay(
        lowers: &[PathBuf],
        upper_work: Option<(&Path, &Path)>,
        target: &Path,
    ) -> Result<Mount> {
        std::fs::create_dir_all(target).map_err(Error::io("creating mount point", target))?;
        let bad = |p: &Path| {
            p.to_string_lossy().contains([',', ':', '\\']) || p.as_os_str().as_bytes().contains(&0)
        };
        let mut all: Vec<&Path> = lowers.iter().map(PathBuf::as_path).collect();
        if let Some((u, w)) = upper_work {
            all.extend([u, w]);
        }
        if let Some(p) = all.iter().find(|p| bad(p)) {
            return Err(Error::BadEntry {
                layer: "build".into(),
                path: p.display().to_string(),
                problem: "a path with ',', ':' or '\\' cannot be an overlayfs layer".into(),
            });
        }
        let (fstype, source, flags, options) = match (lowers, upper_work) {
            ([single], None) => (
                c"none".to_owned(),
                cstring(single)?,
                libc::MS_BIND | libc::MS_REC,
                String::new(),
            ),
            (_, upper_work) => {
                let lower: Vec<String> = lowers.iter().map(|l| l.display().to_string()).collect();
                let mut o = format!("lowerdir={}", lower.join(":"));
                if let Some((u, w)) = upper_work {
                    o.push_str(&format!(
                        ",upperdir={},workdir={}",
                        u.display(),
                        w.display()
                    ));
                }
                (c"overlay".to_owned(), c"overlay".to_owned(), 0, o)
            }
        };
        if options.len() >= 4000 {
            return Err(Error::Tool {
                tool: "overlayfs",
                problem: format!(
                    "{} layers make mount options longer than a page; use fewer steps (combine RUNs)",
                    lowers.len()
                ),
            });
        }
        let c_target = cstring(target)?;
        let c_options = CString::new(options.clone()).map_err(|_| Error::Tool {
            tool: "overlayfs",
            problem: "NUL in options".into(),
        })?;
        // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
        let rc = unsafe {
            libc::mount(
                source.as_ptr(),
                c_target.as_ptr(),
                fstype.as_ptr(),
                flags,
                c_options.as_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(Error::Tool {
                tool: "overlayfs",
                problem: format!(
                    "mounting ({options}) on {}: {} (needs root)",
                    target.display(),
                    io::Error::last_os_error()
                ),
            });
        }
        let mount = Mount {
            target: target.to_path_buf(),
        };
        if flags & libc::MS_BIND != 0 {
            // A bind mount becomes read-only by a remount.
            // SAFETY: as above.
            let rc = unsafe {
                libc::mount(
                    std::ptr::null(),
                    c_target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                    std::ptr::null(),
                )
            };
            if rc != 0 {
                return Err(Error::io("remounting read-only", target)(
                    io::Error::last_os_error(),
                ));
            }
        }
        Ok(mount)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.target
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Ok(c) = cstring(&self.target) {
            // SAFETY: c is NUL-terminated. Lazy: a reader still inside does not keep the
            // mount (it goes when the reader does).
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
