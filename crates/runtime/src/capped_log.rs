//! A size-capped log fed through a pipe: what a sandbox's console output (the gVisor
//! agent's stdout and stderr, runsc's own errors) goes into, so that a guest writing without
//! end (issue 12: 300 MB to `/proc/1/fd/1` made a 301 MB `console.log`) cannot fill the
//! host's disk or, under `/run`, its memory.
//!
//! The log file is rotated: once `<log>` would pass the cap it becomes `<log>.1` (replacing
//! the previous one) and a new `<log>` starts, so the two hold at most twice the cap and
//! `<log>` always ends with the latest output (what error messages quote).
//!
//! Who writes: not the daemon, because `runsc run` outlives it (detached sandboxes) and
//! would die of SIGPIPE writing to a pipe nobody reads after a daemon restart. A helper
//! process is forked (no exec: it is this code) and double-forked away, so that it belongs
//! to no one, outlives the daemon like `runsc run` does, and is reaped by init. It reads
//! until every writer (runsc and its children) has closed the pipe, then exits. Between fork
//! and exit it calls only async-signal-safe functions (read, write, rename, open, ftruncate,
//! fstat, close, _exit) and touches no allocator, as a child of a multithreaded process must.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Largest size of a console log file (and of its `.1`).
pub const CONSOLE_LOG_CAP: u64 = 4 << 20;
const BUF: usize = 64 * 1024;

/// The rotated file beside `log`: `<log>.1`.
pub fn rotated(log: &Path) -> PathBuf {
    let mut name = log.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("NUL byte in {}", p.display()),
        )
    })
}

const LOG_FLAGS: libc::c_int =
    libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_NOFOLLOW | libc::O_CLOEXEC;

/// Starts the writer of `log` (appending to what is there) and returns the pipe's write
/// end: give it to the process whose output it is (close-on-exec, so only that process and
/// its children keep it).
/// [`crate::subreaper::LOG_WRITER_COMM`], NUL-terminated for prctl.
const LOG_WRITER_NAME: &std::ffi::CStr = c"sandcell-log";

pub fn spawn(log: &Path, cap: u64) -> io::Result<OwnedFd> {
    let c_log = cpath(log)?;
    let c_old = cpath(&rotated(log))?;
    // SAFETY: a valid NUL-terminated path; the descriptor is owned below.
    let file = unsafe { libc::open(c_log.as_ptr(), LOG_FLAGS, 0o640 as libc::c_uint) };
    if file < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just opened, owned by nobody else.
    let file = unsafe { OwnedFd::from_raw_fd(file) };
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 just made both; each is owned once.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Allocated before the fork: the child must not allocate.
    let mut buf = vec![0u8; BUF];
    // SAFETY: fork has no preconditions; the child runs only async-signal-safe code (see the
    // module docs) and never returns from this function.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: in the forked child; everything called is async-signal-safe.
        unsafe {
            libc::setsid();
            if libc::fork() != 0 {
                // The middle process: exits at once so that the writer is init's child
                // (or the daemon's, when it is a subreaper: crate::subreaper).
                libc::_exit(0);
            }
            // The name the subreaper knows orphaned writers by (crate::subreaper).
            libc::prctl(libc::PR_SET_NAME, LOG_WRITER_NAME.as_ptr(), 0, 0, 0);
            writer(
                read.as_raw_fd(),
                file.as_raw_fd(),
                &c_log,
                &c_old,
                cap,
                &mut buf,
            )
        }
    }
    drop(read);
    drop(file);
    let mut status = 0;
    // SAFETY: `pid` is our child (the middle process, which exits at once).
    unsafe { libc::waitpid(pid, &mut status, 0) };
    Ok(write)
}

/// The writer's loop, in the forked child: never returns.
///
/// # Safety
/// Only in a child made by fork in [`spawn`]: it closes every descriptor but its own two.
unsafe fn writer(
    read: libc::c_int,
    file: libc::c_int,
    log: &CString,
    old: &CString,
    cap: u64,
    buf: &mut [u8],
) -> ! {
    // SAFETY: plain syscalls on descriptors this process owns, on `buf`, and on
    // NUL-terminated paths; all async-signal-safe.
    unsafe {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            libc::signal(sig, libc::SIG_DFL);
        }
        // Keep only stdin = the pipe and stdout = the log (the daemon's sockets and other
        // sandboxes' pipes must not stay open in here).
        if libc::dup2(read, 0) < 0 || libc::dup2(file, 1) < 0 {
            libc::_exit(1);
        }
        if libc::syscall(libc::SYS_close_range, 2u32, u32::MAX, 0u32) != 0 {
            for fd in 2..65536 {
                libc::close(fd);
            }
        }
        let mut st: libc::stat = std::mem::zeroed();
        let mut size: u64 = if libc::fstat(1, &mut st) == 0 {
            st.st_size as u64
        } else {
            0
        };
        loop {
            let n = libc::read(0, buf.as_mut_ptr().cast(), buf.len());
            if n == 0 {
                libc::_exit(0);
            }
            if n < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                libc::_exit(1);
            }
            let n = n as usize;
            if size + n as u64 > cap {
                rotate(log, old);
                size = 0;
            }
            let mut done = 0;
            while done < n {
                let w = libc::write(1, buf[done..].as_ptr().cast(), n - done);
                if w < 0 {
                    if *libc::__errno_location() == libc::EINTR {
                        continue;
                    }
                    // A full disk: the output is lost, the guest is not held up.
                    break;
                }
                done += w as usize;
            }
            size += done as u64;
        }
    }
}

/// `log` becomes `old` and stdout a new, empty `log`; if the rename fails (the run dir is
/// gone, say) the file is emptied instead, so it stays under the cap either way.
///
/// # Safety
/// As [`writer`].
unsafe fn rotate(log: &CString, old: &CString) {
    // SAFETY: as in `writer`.
    unsafe {
        if libc::rename(log.as_ptr(), old.as_ptr()) == 0 {
            let fd = libc::open(
                log.as_ptr(),
                LOG_FLAGS | libc::O_TRUNC,
                0o640 as libc::c_uint,
            );
            if fd >= 0 {
                libc::dup2(fd, 1);
                libc::close(fd);
                return;
            }
        }
        libc::ftruncate(1, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn output_past_the_cap_rotates_and_keeps_the_latest() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("console.log");
        std::fs::write(&log, b"before\n").unwrap();
        let cap = 64 * 1024;
        let write = spawn(&log, cap).unwrap();
        let mut pipe = std::fs::File::from(write);
        let line = [b'x'; 1023];
        for _ in 0..2000 {
            pipe.write_all(&line).unwrap();
            pipe.write_all(b"\n").unwrap();
        }
        pipe.write_all(b"the end\n").unwrap();
        drop(pipe);
        // The writer ends once it has read everything (the pipe's last writer is gone).
        let mut text = Vec::new();
        for _ in 0..500 {
            // Missing for a moment while it rotates.
            text = std::fs::read(&log).unwrap_or_default();
            if text.ends_with(b"the end\n") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(text.ends_with(b"the end\n"), "the latest output is missing");
        assert!(text.len() as u64 <= cap, "{} > {cap}", text.len());
        let old = std::fs::metadata(rotated(&log)).unwrap().len();
        assert!(old <= cap && old > 0, "{old}");
    }

    #[test]
    fn a_link_at_the_log_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        let log = tmp.path().join("console.log");
        std::os::unix::fs::symlink(&target, &log).unwrap();
        assert!(spawn(&log, 1024).is_err());
        assert!(!target.exists());
    }
}
