//! Host file operations inside trees a sandbox can write to: a gVisor sandbox's agent
//! directory (`<run-dir>/<id>/host`, the guest's `/run/sandcell-host`) and the layers of its
//! root. The host does them as root, and the guest can plant symlinks there (issue 12: a
//! link at `agent.resume` made a plain `fs::write` create `/root/PWNED`, or truncate any host
//! file). So nothing here follows a link: every path component is opened relative to the
//! directory before it (`openat`) with `O_NOFOLLOW`, files are created with
//! `O_CREAT|O_EXCL` (which fails on any existing name, links included), and a Unix socket is
//! connected to through an `O_PATH` descriptor of the socket itself. A link makes the
//! operation fail; it never lands on a host file of the guest's choosing.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// How many times a create races a guest that puts the name back after we removed it.
const CREATE_ATTEMPTS: usize = 100;

fn cstr(name: &std::ffi::OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("NUL byte in {name:?}")))
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Opens directory `path` (a host-made directory: only its last component is checked not to
/// be a link).
pub fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cstr(path.as_os_str())?;
    // SAFETY: `c` is a valid NUL-terminated string; the returned descriptor is owned below.
    let fd = cvt(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_RDONLY,
        )
    })?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens the directory `name` in `dir`, not following a link; creates it (mode 0755) first
/// when `create` and it is missing.
fn open_child_dir(dir: &OwnedFd, name: &std::ffi::OsStr, create: bool) -> io::Result<OwnedFd> {
    let c = cstr(name)?;
    let open = || {
        // SAFETY: `dir` is an open directory and `c` a valid NUL-terminated string.
        cvt(unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_RDONLY,
            )
        })
    };
    let fd = match open() {
        Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {
            // SAFETY: as above; mkdirat does not follow a link at the final component.
            match cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), 0o755) }) {
                Err(e) if e.raw_os_error() != Some(libc::EEXIST) => return Err(e),
                _ => {}
            }
            open()?
        }
        other => other?,
    };
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens directory `rel` under `root` (`root` itself is the host's), component by
/// component, never following a link; creates missing ones when `create`. `rel` must be
/// relative and plain (no `..`).
pub fn open_dir_in(root: &Path, rel: &Path, create: bool) -> io::Result<OwnedFd> {
    let mut dir = open_dir(root)?;
    for part in rel.components() {
        match part {
            Component::Normal(name) => dir = open_child_dir(&dir, name, create)?,
            Component::CurDir => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not a plain relative path", rel.display()),
                ));
            }
        }
    }
    Ok(dir)
}

/// Replaces file `name` in `dir` with a new file holding `contents` (mode 0644): whatever
/// is at that name (a file, a link) is removed, not written through, and the new file is
/// created with `O_EXCL`. A directory at that name is an error.
pub fn replace_file(dir: &OwnedFd, name: &str, contents: &[u8]) -> io::Result<()> {
    let c = cstr(std::ffi::OsStr::new(name))?;
    for _ in 0..CREATE_ATTEMPTS {
        // SAFETY: `dir` is an open directory and `c` a valid NUL-terminated string;
        // unlinkat removes a link itself, never its target.
        match cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) }) {
            Err(e) if e.raw_os_error() != Some(libc::ENOENT) => return Err(e),
            _ => {}
        }
        // SAFETY: as above. O_CREAT|O_EXCL fails on any existing name, a link included.
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o644 as libc::c_uint,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EEXIST) {
                // Put back between our unlink and our create: try again.
                continue;
            }
            return Err(e);
        }
        // SAFETY: `fd` was just opened and is owned by nobody else.
        let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        return std::io::Write::write_all(&mut file, contents);
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        format!("{name} was recreated {CREATE_ATTEMPTS} times while we replaced it"),
    ))
}

/// [`replace_file`] of `rel` (a plain relative path) under `root`, creating its parent
/// directories: nothing on the way is followed if it is a link.
pub fn write_file_in(root: &Path, rel: &Path, contents: &[u8]) -> io::Result<()> {
    let name = rel.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} names no file", rel.display()),
        )
    })?;
    let parent = rel.parent().unwrap_or(Path::new(""));
    let dir = open_dir_in(root, parent, true)?;
    replace_file(&dir, name, contents)
}

/// What [`open_regular`] and [`open_regular_at`] refuse: the name is not a regular file (a
/// symbolic link, a FIFO, a directory, a device, a socket).
#[derive(Debug, thiserror::Error)]
#[error("{name} is {kind}, not a regular file")]
pub struct NotRegular {
    pub name: String,
    pub kind: &'static str,
}

impl NotRegular {
    /// The refusal inside `e`, if `e` is one.
    pub fn of(e: &io::Error) -> Option<&NotRegular> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<NotRegular>())
    }
}

fn not_regular(name: &std::ffi::OsStr, kind: &'static str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        NotRegular {
            name: name.to_string_lossy().into_owned(),
            kind,
        },
    )
}

/// What a `st_mode` is, in words.
pub fn kind_of(mode: libc::mode_t) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR | libc::S_IFBLK => "a device",
        _ => "of an unknown type",
    }
}

/// `fstat` of an open descriptor.
pub fn fstat(fd: &impl AsRawFd) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is a valid stat buffer.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// Read-only, not through a link at the last component, and never blocking on a FIFO (the
/// type is checked right after the open).
const READ_REGULAR: libc::c_int =
    libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;

/// The descriptor `rc` (an open of `name` with [`READ_REGULAR`]) as a regular file, or the
/// [`NotRegular`] refusal.
fn regular(rc: libc::c_int, name: &std::ffi::OsStr) -> io::Result<std::fs::File> {
    let fd = match cvt(rc) {
        Ok(fd) => fd,
        // O_NOFOLLOW: the last component is a link.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(not_regular(name, "a symbolic link"));
        }
        Err(e) => return Err(e),
    };
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = fstat(&fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(not_regular(name, kind_of(st.st_mode)));
    }
    Ok(std::fs::File::from(fd))
}

/// Opens the regular file `path` to read. Its last component is not followed if it is a
/// link, a FIFO there does not block the open, and anything but a regular file is refused
/// with [`NotRegular`]. For files in a directory someone else can write to (a jailed VMM's
/// console log), whose parents are the host's.
pub fn open_regular(path: &Path) -> io::Result<std::fs::File> {
    let c = cstr(path.as_os_str())?;
    // SAFETY: `c` is a valid NUL-terminated string; the descriptor is owned in `regular`.
    regular(
        unsafe { libc::open(c.as_ptr(), READ_REGULAR) },
        path.as_os_str(),
    )
}

/// [`open_regular`] of `name` in the open directory `dir`.
pub fn open_regular_at(dir: &OwnedFd, name: &std::ffi::OsStr) -> io::Result<std::fs::File> {
    let c = cstr(name)?;
    // SAFETY: `dir` is an open directory and `c` a valid NUL-terminated string; the
    // descriptor is owned in `regular`.
    regular(
        unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), READ_REGULAR) },
        name,
    )
}

/// Connects to the Unix socket at `path` without following a link there: the name is
/// opened `O_PATH|O_NOFOLLOW`, must be a socket, and is connected to through
/// `/proc/self/fd` (so a guest's link to a host socket, say a container daemon's, is
/// refused rather than connected to).
pub async fn connect_unix(path: &Path) -> io::Result<tokio::net::UnixStream> {
    let c = cstr(path.as_os_str())?;
    // SAFETY: `c` is a valid NUL-terminated string; the descriptor is owned below.
    let fd = cvt(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: `fd` was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: an all-zero stat is a valid value for fstat to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `st` is a valid stat buffer.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is not a Unix socket (a link or a file put there from inside the sandbox?)",
                path.display()
            ),
        ));
    }
    let via = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let stream = tokio::net::UnixStream::connect(&via).await;
    drop(fd);
    stream
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replacing_a_planted_link_leaves_its_target_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().join("host");
        std::fs::create_dir(&shared).unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let missing = tmp.path().join("PWNED");
        std::os::unix::fs::symlink(&victim, shared.join("agent.resume")).unwrap();
        std::os::unix::fs::symlink(&missing, shared.join("other")).unwrap();

        let dir = open_dir(&shared).unwrap();
        replace_file(&dir, "agent.resume", b"").unwrap();
        replace_file(&dir, "other", b"x").unwrap();

        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(!missing.exists(), "the write followed the link");
        let meta = std::fs::symlink_metadata(shared.join("agent.resume")).unwrap();
        assert!(meta.is_file(), "the link was not replaced by a file");
        assert_eq!(std::fs::read(shared.join("other")).unwrap(), b"x");
    }

    #[test]
    fn a_linked_directory_on_the_way_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("rootfs");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("etc")).unwrap();

        let err = write_file_in(&root, Path::new("etc/resolv.conf"), b"nameserver 1\n")
            .expect_err("wrote through a linked directory");
        assert!(
            matches!(err.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)),
            "{err}"
        );
        assert!(!outside.join("resolv.conf").exists());

        write_file_in(&root, Path::new("run/sandcell-host/x"), b"y").unwrap();
        assert_eq!(
            std::fs::read(root.join("run/sandcell-host/x")).unwrap(),
            b"y"
        );
        assert!(open_dir_in(&root, Path::new("../x"), false).is_err());
    }

    #[tokio::test]
    async fn connect_refuses_a_link_to_a_socket() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real.sock");
        let _listener = tokio::net::UnixListener::bind(&real).unwrap();
        let link = tmp.path().join("agent.sock");
        std::os::unix::fs::symlink(&real, &link).unwrap();

        connect_unix(&real).await.unwrap();
        let err = connect_unix(&link).await.expect_err("followed the link");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        let file = tmp.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(connect_unix(&file).await.is_err());
    }
}
