//! The files of a volume as E2B's volume content API sees them, on the daemon's side.
//!
//! Everything under a volume's `data/` is the guests' (any sandbox mounting it writes
//! there), and the daemon runs as root: no path is ever resolved by the kernel's plain
//! lookup. Each one is opened from the volume's top with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`, so a link or a `..`
//! anywhere fails (ELOOP, EXDEV) instead of leading out; the last component is then acted
//! on relative to its parent's descriptor with `AT_SYMLINK_NOFOLLOW` / `O_NOFOLLOW`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Deepest listing (`depth`) served.
pub const MAX_DEPTH: u32 = 16;
/// Most entries one listing returns.
pub const MAX_ENTRIES: usize = 10_000;

/// A path inside a volume: its plain components (none empty, `.` or `..`); empty = the top.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolPath(Vec<String>);

impl VolPath {
    /// `/a/b`, `a/b`, `/` and `` are accepted; `..` and NUL are not.
    pub fn parse(s: &str) -> Option<VolPath> {
        if s.len() > 4096 || s.contains('\0') {
            return None;
        }
        let mut parts = Vec::new();
        for p in s.split('/') {
            match p {
                "" | "." => {}
                ".." => return None,
                p if p.len() > 255 => return None,
                p => parts.push(p.to_string()),
            }
        }
        Some(VolPath(parts))
    }

    pub fn is_top(&self) -> bool {
        self.0.is_empty()
    }

    /// The path as the API shows it (`/a/b`).
    pub fn shown(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    fn parent_and_name(&self) -> Option<(VolPath, &str)> {
        let (name, parent) = self.0.split_last()?;
        Some((VolPath(parent.to_vec()), name))
    }

    fn rel(&self) -> String {
        if self.0.is_empty() {
            ".".into()
        } else {
            self.0.join("/")
        }
    }

    fn child(&self, name: &str) -> VolPath {
        let mut v = self.0.clone();
        v.push(name.to_string());
        VolPath(v)
    }

    pub fn name(&self) -> &str {
        self.0.last().map_or("", String::as_str)
    }
}

/// What a stat shows (E2B's `VolumeEntryStat`, times in Unix milliseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub path: String,
    pub kind: &'static str,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime_ms: i64,
    pub mtime_ms: i64,
    pub ctime_ms: i64,
    pub target: Option<String>,
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// The volume's top directory (the daemon's own path, no guest part in it).
pub fn open_top(dir: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: a valid C string; the returned descriptor is checked and owned at once.
    let fd = cvt(unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_DIRECTORY | libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: `fd` was just opened by us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `path` under `top`, opened with `flags`, refusing links, `..` and other mounts.
fn open_beneath(
    top: &OwnedFd,
    path: &VolPath,
    flags: libc::c_int,
    mode: u32,
) -> io::Result<OwnedFd> {
    let rel = cstr(&path.rel())?;
    // SAFETY: all-zero is a valid `open_how` (no flags); the fields are set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = u64::from(mode);
    how.resolve = libc::RESOLVE_BENEATH
        | libc::RESOLVE_NO_SYMLINKS
        | libc::RESOLVE_NO_MAGICLINKS
        | libc::RESOLVE_NO_XDEV;
    // SAFETY: openat2 reads the C string and the `open_how` we own, of the size given.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            top.as_raw_fd(),
            rel.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor openat2 just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as libc::c_int) })
}

fn open_dir(top: &OwnedFd, path: &VolPath) -> io::Result<OwnedFd> {
    open_beneath(top, path, libc::O_DIRECTORY | libc::O_RDONLY, 0)
}

fn fstatat(dir: &OwnedFd, name: &str) -> io::Result<libc::stat> {
    let c = cstr(name)?;
    // SAFETY: all-zero is a valid `stat`; fstatat writes into the one we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, C string and out pointer.
    cvt(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(st)
}

fn readlinkat(dir: &OwnedFd, name: &str) -> Option<String> {
    let c = cstr(name).ok()?;
    let mut buf = vec![0u8; 4096];
    // SAFETY: valid descriptor and C string; readlinkat writes at most buf.len() bytes.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            c.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(String::from_utf8_lossy(&buf).into_owned())
}

fn ms(sec: i64, nsec: i64) -> i64 {
    sec.saturating_mul(1000).saturating_add(nsec / 1_000_000)
}

fn entry_of(dir: &OwnedFd, path: &VolPath, name: &str) -> io::Result<Entry> {
    let st = fstatat(dir, name)?;
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFDIR => "directory",
        libc::S_IFREG => "file",
        libc::S_IFLNK => "symlink",
        _ => "unknown",
    };
    Ok(Entry {
        name: name.to_string(),
        path: path.shown(),
        kind,
        size: st.st_size.max(0) as u64,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        atime_ms: ms(st.st_atime, st.st_atime_nsec),
        mtime_ms: ms(st.st_mtime, st.st_mtime_nsec),
        ctime_ms: ms(st.st_ctime, st.st_ctime_nsec),
        target: (kind == "symlink").then(|| readlinkat(dir, name)).flatten(),
    })
}

/// The entry at `path` (a link is shown as a link, not followed).
pub fn stat(top: &OwnedFd, path: &VolPath) -> io::Result<Entry> {
    match path.parent_and_name() {
        None => entry_of(top, path, "."),
        Some((parent, name)) => entry_of(&open_dir(top, &parent)?, path, name),
    }
    .map(|mut e| {
        if path.is_top() {
            e.name = String::new();
        }
        e
    })
}

/// Names in a directory (not `.`, `..`), sorted.
fn names(dir: &OwnedFd) -> io::Result<Vec<String>> {
    // Through the descriptor: /proc/self/fd/N is the directory already opened safely.
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))? {
        let e = e?;
        if let Some(n) = e.file_name().to_str() {
            out.push(n.to_string());
        }
        if out.len() > MAX_ENTRIES {
            break;
        }
    }
    out.sort();
    Ok(out)
}

/// The entries under the directory `path`, `depth` levels deep (1: its own).
pub fn list(top: &OwnedFd, path: &VolPath, depth: u32) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    list_into(top, path, depth.clamp(1, MAX_DEPTH), &mut out)?;
    Ok(out)
}

fn list_into(top: &OwnedFd, path: &VolPath, depth: u32, out: &mut Vec<Entry>) -> io::Result<()> {
    let dir = open_dir(top, path)?;
    for name in names(&dir)? {
        if out.len() >= MAX_ENTRIES {
            return Ok(());
        }
        let child = path.child(&name);
        let e = match entry_of(&dir, &child, &name) {
            Ok(e) => e,
            // Gone meanwhile (a sandbox writes there too).
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let is_dir = e.kind == "directory";
        out.push(e);
        if is_dir && depth > 1 {
            list_into(top, &child, depth - 1, out)?;
        }
    }
    Ok(())
}

/// Makes the directory `path` (and its parents with `force`); an existing directory is
/// fine with `force`, EEXIST without.
pub fn mkdir(top: &OwnedFd, path: &VolPath, mode: u32, force: bool) -> io::Result<()> {
    let (parent, name) = path
        .parent_and_name()
        .ok_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists))?;
    if force && !parent.is_top() {
        mkdir(top, &parent, 0o755, true)?;
    }
    let dir = open_dir(top, &parent)?;
    let c = cstr(name)?;
    // SAFETY: valid descriptor and C string.
    match cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), c.as_ptr(), mode & 0o7777) }) {
        Ok(_) => Ok(()),
        Err(e) if force && e.kind() == io::ErrorKind::AlreadyExists => {
            // Only a real directory (not a link to one) counts as there.
            if fstatat(&dir, name)?.st_mode & libc::S_IFMT == libc::S_IFDIR {
                Ok(())
            } else {
                Err(e)
            }
        }
        Err(e) => Err(e),
    }
}

/// Opens the regular file `path` for reading.
pub fn open_read(top: &OwnedFd, path: &VolPath) -> io::Result<std::fs::File> {
    // O_NONBLOCK: a FIFO planted there must not hang the daemon.
    let fd = open_beneath(top, path, libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    Ok(file)
}

/// Creates or truncates the regular file `path` for writing (its parents too with
/// `force`).
pub fn open_write(
    top: &OwnedFd,
    path: &VolPath,
    mode: u32,
    force: bool,
) -> io::Result<std::fs::File> {
    let (parent, _) = path
        .parent_and_name()
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EISDIR))?;
    if force && !parent.is_top() {
        mkdir(top, &parent, 0o755, true)?;
    }
    let fd = open_beneath(
        top,
        path,
        libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NONBLOCK,
        mode & 0o7777,
    )?;
    let file = std::fs::File::from(fd);
    if !file.metadata()?.is_file() {
        return Err(io::Error::from_raw_os_error(libc::EISDIR));
    }
    Ok(file)
}

/// Changes the owner and mode of `path` (never through a link: a link itself is refused).
pub fn set_attrs(
    top: &OwnedFd,
    path: &VolPath,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
) -> io::Result<()> {
    let fd = open_beneath(top, path, libc::O_RDONLY | libc::O_NONBLOCK, 0)?;
    if uid.is_some() || gid.is_some() {
        // SAFETY: a descriptor we own; u32::MAX (-1) leaves that id as it is.
        cvt(unsafe {
            libc::fchown(
                fd.as_raw_fd(),
                uid.unwrap_or(u32::MAX),
                gid.unwrap_or(u32::MAX),
            )
        })?;
    }
    if let Some(mode) = mode {
        // SAFETY: a descriptor we own.
        cvt(unsafe { libc::fchmod(fd.as_raw_fd(), mode & 0o7777) })?;
    }
    Ok(())
}

/// Removes `path`: a file or link, or a directory with everything in it.
pub fn remove(top: &OwnedFd, path: &VolPath) -> io::Result<()> {
    let (parent, name) = path
        .parent_and_name()
        .ok_or_else(|| io::Error::from(io::ErrorKind::PermissionDenied))?;
    remove_in(&open_dir(top, &parent)?, name, 0)
}

fn remove_in(dir: &OwnedFd, name: &str, level: u32) -> io::Result<()> {
    if level > 256 {
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    let c = cstr(name)?;
    let is_dir = fstatat(dir, name)?.st_mode & libc::S_IFMT == libc::S_IFDIR;
    if is_dir {
        // SAFETY: valid descriptor and C string; O_NOFOLLOW: the entry was a directory,
        // and if it was swapped for a link since, the open fails.
        let fd = cvt(unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_DIRECTORY | libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: just opened, owned by nothing else.
        let child = unsafe { OwnedFd::from_raw_fd(fd) };
        for n in names(&child)? {
            remove_in(&child, &n, level + 1)?;
        }
    }
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: valid descriptor and C string.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) }).map(drop)
}

/// Whether an error means "no such path" for the API (404) rather than a refusal.
pub fn is_missing(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

/// Whether an error is the path's fault (a link, a `..`, a directory where a file is
/// expected, ...): 400 for the API.
pub fn is_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ELOOP
                | libc::EXDEV
                | libc::EISDIR
                | libc::EEXIST
                | libc::ENOTEMPTY
                | libc::EINVAL
        )
    ) || e.kind() == io::ErrorKind::AlreadyExists
        || e.kind() == io::ErrorKind::InvalidInput
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::{Read, Write};

    fn p(s: &str) -> VolPath {
        VolPath::parse(s).unwrap()
    }

    #[test]
    fn paths_parse_plainly() {
        assert_eq!(p("/a/b/").shown(), "/a/b");
        assert_eq!(p("a//./b").shown(), "/a/b");
        assert!(p("/").is_top() && p("").is_top());
        assert!(VolPath::parse("/a/../b").is_none());
        assert!(VolPath::parse("a\0b").is_none());
    }

    #[test]
    fn files_round_trip_and_links_are_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host file").unwrap();
        let top = open_top(tmp.path()).unwrap();

        mkdir(&top, &p("/d/e"), 0o755, true).unwrap();
        let mut f = open_write(&top, &p("/d/e/f.txt"), 0o644, false).unwrap();
        f.write_all(b"hello").unwrap();
        drop(f);
        let mut s = String::new();
        open_read(&top, &p("d/e/f.txt"))
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        assert_eq!(s, "hello");
        let e = stat(&top, &p("/d/e/f.txt")).unwrap();
        assert_eq!(
            (e.kind, e.size, e.name.as_str(), e.path.as_str()),
            ("file", 5, "f.txt", "/d/e/f.txt")
        );
        let all = list(&top, &p("/"), 3).unwrap();
        let paths: Vec<&str> = all.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/d", "/d/e", "/d/e/f.txt"]);
        assert_eq!(list(&top, &p("/"), 1).unwrap().len(), 1);

        // A guest's link to the host: shown as a link, never read, written or listed through.
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("out")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), tmp.path().join("s")).unwrap();
        assert_eq!(stat(&top, &p("/s")).unwrap().kind, "symlink");
        assert!(open_read(&top, &p("/s")).is_err());
        assert!(open_read(&top, &p("/out/secret")).is_err());
        assert!(open_write(&top, &p("/out/new"), 0o644, false).is_err());
        assert!(open_write(&top, &p("/s"), 0o644, false).is_err());
        assert!(list(&top, &p("/out"), 1).is_err());
        assert!(mkdir(&top, &p("/out/x"), 0o755, true).is_err());
        assert!(set_attrs(&top, &p("/s"), None, None, Some(0o777)).is_err());
        remove(&top, &p("/out")).unwrap();
        assert!(
            outside.path().join("secret").exists(),
            "the link went, not its target"
        );
        assert_eq!(
            std::fs::read_to_string(outside.path().join("secret")).unwrap(),
            "host file"
        );

        remove(&top, &p("/d")).unwrap();
        assert!(is_missing(&stat(&top, &p("/d")).unwrap_err()));
        assert!(remove(&top, &p("/")).is_err());
    }
}
