//! Small host helpers shared by the runtimes.

use crate::{Error, Result};
use std::ffi::CString;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub(crate) fn path_cstring(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        Error::host(
            format!("path {} contains a NUL byte", path.display()),
            std::io::ErrorKind::InvalidInput.into(),
        )
    })
}

/// The last `max_lines` lines of the last `max_bytes` of a log file, lossily decoded, as
/// `"\n--- <label> ---\n<lines>"`, or "" when there is nothing to show. Bounded: a guest
/// can fill its console log, we read only its tail. Only a regular file is read: a link or
/// a FIFO put in its place (a jailed VMM owns the directory of its console log) shows
/// nothing, and never a host file the link points to.
pub(crate) fn log_tail(path: &Path, label: &str, max_bytes: u64, max_lines: usize) -> String {
    let Ok(mut file) = crate::nofollow::open_regular(path) else {
        return String::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(max_bytes);
    if file.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    if file.take(max_bytes).read_to_end(&mut buf).is_err() {
        return String::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return String::new();
    }
    let shown = &lines[lines.len().saturating_sub(max_lines)..];
    format!(
        "\n--- {label} ({}) ---\n{}",
        path.display(),
        shown.join("\n")
    )
}

/// The non-empty lines of the last `max_bytes` of a log file, oldest first (a first line
/// cut by the window is dropped), invalid UTF-8 replaced.
pub(crate) fn tail_lines(path: &Path, max_bytes: u64) -> Vec<String> {
    let Ok(mut file) = crate::nofollow::open_regular(path) else {
        return Vec::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(max_bytes);
    if file.seek(SeekFrom::Start(start)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    if file.take(max_bytes).read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    if start > 0 && !lines.is_empty() {
        lines.remove(0);
    }
    lines
}

/// The last non-empty line of the last `max_bytes` of a log file ("" if none): a process's
/// final error message.
pub(crate) fn last_line(path: &Path, max_bytes: u64) -> String {
    let tail = log_tail(path, "", max_bytes, 1);
    tail.rsplit('\n').next().unwrap_or("").trim().to_string()
}

/// `std::fs::remove_dir_all`, where "already gone" is success.
pub(crate) fn remove_dir_all_if_exists(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename, creating the parent.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Opens (creating) a log file in append mode. Append matters: runsc writes the container's
/// output with positioned writes, which O_APPEND turns into appends instead of overwrites.
pub(crate) fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Makes `cmd` a supervised child: in its own process group, so that a terminal's Ctrl-C
/// reaches only us (we then stop the sandbox in order), and killed when the thread that
/// spawned it dies, so that a `sandcell` killed outright does not leave a sandbox running
/// (its files are then swept by the next run). Spawn it from a long-lived thread: the
/// death signal follows the spawning thread, not the process.
pub(crate) fn supervised(cmd: &mut tokio::process::Command) -> &mut tokio::process::Command {
    cmd.process_group(0);
    // SAFETY: the closure runs between fork and exec and calls only prctl(2), which is
    // async-signal-safe, and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

pub(crate) fn is_mount_point(path: &Path) -> bool {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = path.as_os_str().as_bytes();
    // Field 5 is the mount point, with spaces and the like escaped as octal.
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|mp| unescape_mountinfo(mp).as_slice() == wanted)
}

fn unescape_mountinfo(field: &str) -> Vec<u8> {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = (bytes[i] == b'\\' && i + 4 <= bytes.len())
            .then(|| std::str::from_utf8(&bytes[i + 1..i + 4]).ok())
            .flatten()
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        if let Some(v) = octal {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// Detaches the mount at `path` if there is one.
pub(crate) fn unmount_if_mounted(path: &Path) -> Result<()> {
    if !is_mount_point(path) {
        return Ok(());
    }
    let c = path_cstring(path)?;
    // SAFETY: a valid NUL-terminated path; MNT_DETACH has no other inputs.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    if rc != 0 {
        return Err(Error::host(
            format!("unmounting {}", path.display()),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Sends `signal` to `pid`; "no such process" is success.
pub(crate) fn kill_pid(pid: u32, signal: i32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    if pid <= 1 {
        return;
    }
    // SAFETY: kill(2) with a positive pid only sends a signal; it touches no memory of ours.
    unsafe {
        libc::kill(pid, signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_is_bounded_and_keeps_the_end() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("console.log");
        let text: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&log, text).unwrap();
        let tail = log_tail(&log, "console", 200, 3);
        assert!(tail.ends_with("line 997\nline 998\nline 999"), "{tail}");
        assert!(!tail.contains("line 5\n"));
        assert_eq!(log_tail(&tmp.path().join("none"), "x", 10, 1), "");
    }

    /// A log replaced by a link to a host file (a jailed VMM owns its console log's
    /// directory) shows nothing of that file; a FIFO does not block the reader.
    #[test]
    fn tails_do_not_follow_links_or_wait_on_fifos() {
        let tmp = tempfile::tempdir().unwrap();
        let secret = tmp.path().join("shadow");
        std::fs::write(&secret, "root:$6$secret\n").unwrap();
        let log = tmp.path().join("console.log");
        std::os::unix::fs::symlink(&secret, &log).unwrap();
        assert_eq!(log_tail(&log, "console", 4096, 25), "");
        assert_eq!(last_line(&log, 2048), "");
        assert!(tail_lines(&log, 4096).is_empty());
        let fifo = tmp.path().join("vmm.log");
        let c = path_cstring(&fifo).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert_eq!(log_tail(&fifo, "vmm", 4096, 25), "");
    }

    #[test]
    fn mountinfo_escapes_decode() {
        assert_eq!(unescape_mountinfo("/a\\040b"), b"/a b");
        assert_eq!(unescape_mountinfo("/plain"), b"/plain");
        assert!(is_mount_point(Path::new("/")));
    }
}
