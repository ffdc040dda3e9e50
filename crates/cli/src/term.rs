//! The local terminal: is a descriptor one, its size, and raw mode for `sandcell shell`
//! (restored when the guard drops, on every path out of the shell).

use std::io;
use std::os::fd::RawFd;

pub fn is_tty(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

/// Columns and rows of the terminal on `fd`, if it is one with a known size.
pub fn size(fd: RawFd) -> Option<(u16, u16)> {
    // SAFETY: winsize is plain data; all-zero is a valid value.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize into the struct we own.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col, ws.ws_row))
}

/// The terminal on `fd` in raw mode until dropped.
pub struct RawMode {
    fd: RawFd,
    saved: libc::termios,
}

impl RawMode {
    pub fn enter(fd: RawFd) -> io::Result<RawMode> {
        // SAFETY: termios is plain data; all-zero is a valid value to be overwritten.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: tcgetattr writes the settings into the struct we own.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw only edits the struct we own.
        unsafe { libc::cfmakeraw(&mut raw) };
        // SAFETY: tcsetattr reads the struct we own. TCSAFLUSH: typeahead made for the
        // cooked terminal is dropped, not sent to the sandbox.
        if unsafe { libc::tcsetattr(fd, libc::TCSAFLUSH, &raw) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(RawMode { fd, saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the settings read in `enter` on the same descriptor.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}
