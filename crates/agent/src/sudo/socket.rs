//! The sudo service's socket: an abstract `AF_UNIX` `SOCK_SEQPACKET` socket (one message per
//! request, descriptors and credentials attached), in blocking mode on plain threads.
//!
//! Why not tokio: a listener that stays registered for good and rarely fires is exactly the
//! kind of epoll registration gVisor's checkpoint defect resurrects (see
//! [`crate::checkpoint`]); blocking syscalls on their own threads keep the service out of
//! epoll altogether. Why abstract: nothing on the filesystem for a guest to replace, and not
//! a host-backed socket (those make gVisor refuse a checkpoint).
//!
//! Why credentials from `SCM_CREDENTIALS` and not `SO_PEERCRED`: gVisor (runsc 20240729)
//! reports the listener's own credentials as the peer of an accepted socket. Both kernels
//! check what a sender attaches (only root may name another uid or pid), and with
//! `SO_PASSCRED` on the listener both attach the sender's real credentials to every message.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Most descriptors a request may carry (stdin, stdout, stderr).
pub const MAX_FDS: usize = 3;

/// A received message: its bytes, the descriptors and the sender's checked credentials.
#[derive(Debug)]
pub struct Received {
    pub data: Vec<u8>,
    pub fds: Vec<OwnedFd>,
    /// `(pid, uid, gid)` as the kernel checked them; `None` when the message had none.
    pub creds: Option<(i32, u32, u32)>,
    /// The message or its control data did not fit (and was cut by the kernel).
    pub truncated: bool,
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// An abstract address (`\0name`) and its length.
fn abstract_addr(name: &str) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid (empty) value.
    let mut addr: libc::sockaddr_un = unsafe { zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    if bytes.len() + 1 > addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket name too long",
        ));
    }
    for (dst, src) in addr.sun_path[1..].iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + 1 + bytes.len();
    Ok((addr, len as libc::socklen_t))
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: socket() with constant arguments; the descriptor is owned right away.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd was just returned by socket() and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds and listens on `\0name`, with `SO_PASSCRED` so that every accepted socket gets the
/// sender's credentials on every message.
pub fn listen(name: &str, backlog: i32) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    set_passcred(fd.as_raw_fd())?;
    let (addr, len) = abstract_addr(name)?;
    // SAFETY: addr is a valid sockaddr_un of `len` bytes; fd is ours.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const addr).cast::<libc::sockaddr>(),
            len,
        )
    })?;
    // SAFETY: listen on our bound socket.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) })?;
    Ok(fd)
}

fn set_passcred(fd: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: setsockopt with a pointer to a live c_int and its size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// Accepts one connection (blocking), close-on-exec. `SO_PASSCRED` is set again on it: Linux
/// inherits it from the listener, gVisor is not documented to.
pub fn accept(listener: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: accept4 with null address pointers (we do not want the peer's address).
    let fd = cvt(unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    })?;
    // SAFETY: fd was just returned by accept4 and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    set_passcred(fd.as_raw_fd())?;
    Ok(fd)
}

/// Connects to `\0name` (blocking).
pub fn connect(name: &str) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (addr, len) = abstract_addr(name)?;
    // SAFETY: addr is a valid sockaddr_un of `len` bytes; fd is ours.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&raw const addr).cast::<libc::sockaddr>(),
            len,
        )
    })?;
    Ok(fd)
}

/// Sends one message, with `fds` attached as `SCM_RIGHTS` when there are any.
pub fn send(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too many fds"));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // Room for MAX_FDS descriptors, aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain old data; every pointer set below outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let fd_bytes = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `control` (64 bytes, >= space for 3 fds), so
        // CMSG_FIRSTHDR is non-null and CMSG_DATA has room for `fds`.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                fd_bytes as usize,
            );
        }
    }
    loop {
        // SAFETY: msg describes live buffers; MSG_NOSIGNAL: a closed peer is an error, not
        // a SIGPIPE.
        let n = unsafe { libc::sendmsg(sock, &raw const msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message of at most `max` bytes (blocking). `Ok(None)` is the peer's end.
pub fn recv(sock: RawFd, max: usize) -> io::Result<Option<Received>> {
    let mut data = vec![0u8; max];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // Room for MAX_FDS descriptors and one ucred, aligned for cmsghdr.
    let mut control = [0u64; 16];
    // SAFETY: msghdr is plain old data; every pointer set below outlives the recvmsg call.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = loop {
        // SAFETY: as above; MSG_CMSG_CLOEXEC: received descriptors do not leak into children.
        let n = unsafe { libc::recvmsg(sock, &raw mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut received = Received {
        data: Vec::new(),
        fds: Vec::new(),
        creds: None,
        truncated: msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0,
    };
    // SAFETY: the kernel filled msg_control with msg_controllen bytes of cmsghdrs; the CMSG_*
    // macros walk them within that length. Every descriptor is taken into an OwnedFd at once
    // (so none leaks, even when the message is refused later).
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
        while !cmsg.is_null() {
            let payload = (*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
            let ptr = libc::CMSG_DATA(cmsg);
            match ((*cmsg).cmsg_level, (*cmsg).cmsg_type) {
                (libc::SOL_SOCKET, libc::SCM_RIGHTS) => {
                    for i in 0..payload / size_of::<RawFd>() {
                        let fd = std::ptr::read_unaligned(ptr.cast::<RawFd>().add(i));
                        received.fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                (libc::SOL_SOCKET, libc::SCM_CREDENTIALS)
                    if payload >= size_of::<libc::ucred>() =>
                {
                    let cred = std::ptr::read_unaligned(ptr.cast::<libc::ucred>());
                    received.creds = Some((cred.pid, cred.uid, cred.gid));
                }
                _ => {}
            }
            cmsg = libc::CMSG_NXTHDR(&raw const msg, cmsg);
        }
    }
    if n == 0 && received.fds.is_empty() && received.creds.is_none() {
        return Ok(None);
    }
    data.truncate(n);
    received.data = data;
    Ok(Some(received))
}

/// Bounds how long a blocking `recv` on `sock` waits.
pub fn set_recv_timeout(sock: RawFd, timeout: std::time::Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros() as i32),
    };
    // SAFETY: setsockopt with a pointer to a live timeval and its size.
    cvt(unsafe {
        libc::setsockopt(
            sock,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            size_of::<libc::timeval>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// Ends the reading side, waking a thread blocked in `recv` on the same socket (which then
/// sees the end); sending still works.
pub fn shutdown_read(sock: RawFd) {
    // SAFETY: shutdown on a descriptor we hold; failure (already closed) is harmless.
    unsafe { libc::shutdown(sock, libc::SHUT_RD) };
}
