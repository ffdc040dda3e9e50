//! Pseudo-terminals for `Start{pty}`: a master the agent reads output from and writes input
//! to, and a slave that becomes the child's stdin, stdout, stderr and controlling terminal.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

#[derive(Debug, thiserror::Error)]
pub enum PtyError {
    #[error("openpty: {0}")]
    Open(io::Error),
    #[error("TIOCSWINSZ to {cols}x{rows}: {source}")]
    Resize {
        cols: u16,
        rows: u16,
        source: io::Error,
    },
    #[error("making the pty master non-blocking: {0}")]
    NonBlocking(io::Error),
}

/// Registers an owned descriptor with tokio's reactor.
pub fn async_fd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is open for its whole life, and the AsyncFd owns it from here on,
    // so the descriptor stays the same open file until the AsyncFd is dropped.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(io::Error::from)
}

/// A freshly opened pair; the master is close-on-exec and non-blocking, the slave blocking.
#[derive(Debug)]
pub struct PtyPair {
    pub master: OwnedFd,
    pub slave: OwnedFd,
}

/// Opens a pty of `cols` x `rows` (zeros are replaced by 80x24, as a zero size confuses
/// programs).
pub fn open(cols: u16, rows: u16) -> Result<PtyPair, PtyError> {
    let (mut master, mut slave): (libc::c_int, libc::c_int) = (-1, -1);
    let size = winsize(cols, rows);
    // SAFETY: openpty writes two descriptors into the provided ints; the name and termios
    // pointers may be null, and `size` is a valid winsize that outlives the call.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            &size,
        )
    };
    if rc != 0 {
        return Err(PtyError::Open(io::Error::last_os_error()));
    }
    // SAFETY: openpty succeeded, so both are open descriptors that nothing else owns.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    set_cloexec_nonblocking(master.as_raw_fd()).map_err(PtyError::NonBlocking)?;
    // The slave is dup'ed onto the child's stdio (dup2 clears close-on-exec on the copies);
    // our copy must not leak into other children.
    set_cloexec(slave.as_raw_fd()).map_err(PtyError::Open)?;
    Ok(PtyPair { master, slave })
}

fn winsize(cols: u16, rows: u16) -> libc::winsize {
    libc::winsize {
        ws_row: if rows == 0 { 24 } else { rows },
        ws_col: if cols == 0 { 80 } else { cols },
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// TIOCSWINSZ on the master: the kernel sends SIGWINCH to the terminal's foreground group.
pub fn resize(master: RawFd, cols: u16, rows: u16) -> Result<(), PtyError> {
    let size = winsize(cols, rows);
    // SAFETY: TIOCSWINSZ reads a winsize from the pointer, which is valid for the call.
    if unsafe { libc::ioctl(master, libc::TIOCSWINSZ, &size) } < 0 {
        return Err(PtyError::Resize {
            cols,
            rows,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFD/F_SETFD on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn set_cloexec_nonblocking(fd: RawFd) -> io::Result<()> {
    set_cloexec(fd)?;
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// In the child, after fork and before exec: a new session whose controlling terminal is the
/// pty on stdin. Only async-signal-safe calls.
pub fn make_controlling_terminal() -> io::Result<()> {
    // SAFETY: setsid and ioctl are async-signal-safe syscalls with no pointer arguments
    // (TIOCSCTTY takes an integer: 0 = do not steal a terminal owned by another session).
    unsafe {
        if libc::setsid() < 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
