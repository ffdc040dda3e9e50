//! AF_VSOCK stream sockets on tokio: a raw libc socket in an [`AsyncFd`]. Small enough that a
//! crate (and its `nix` dependency) is not worth it in a binary that goes into every image.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

fn register(fd: OwnedFd) -> io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: an OwnedFd is a valid open descriptor that stays open, and keeps returning the
    // same number from as_raw_fd, until the AsyncFd that owns it is dropped.
    Ok(unsafe { AsyncFd::register(fd) }?)
}

/// A listening vsock socket bound to `VMADDR_CID_ANY:port`.
#[derive(Debug)]
pub struct VsockListener {
    fd: AsyncFd<OwnedFd>,
}

impl VsockListener {
    pub fn bind(port: u32) -> io::Result<Self> {
        // SAFETY: plain syscall with constant arguments; the result is checked below.
        let raw = unsafe {
            libc::socket(
                libc::AF_VSOCK,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a socket we just created and own exclusively.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_vm is plain old data; all-zero is a valid value before we fill it.
        let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
        addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
        addr.svm_port = port;
        addr.svm_cid = libc::VMADDR_CID_ANY;
        // SAFETY: `addr` is a valid sockaddr_vm and the length passed is its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const addr).cast::<libc::sockaddr>(),
                size_of::<libc::sockaddr_vm>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: listen on a socket we own.
        if unsafe { libc::listen(fd.as_raw_fd(), 128) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(VsockListener { fd: register(fd)? })
    }

    pub async fn accept(&self) -> io::Result<VsockStream> {
        loop {
            let mut guard = self.fd.readable().await?;
            let accepted = guard.try_io(|fd| {
                // SAFETY: accept4 on a listening socket we own; we do not ask for the peer
                // address (null pointers are allowed).
                let raw = unsafe {
                    libc::accept4(
                        fd.as_raw_fd(),
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    )
                };
                if raw < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    // SAFETY: accept4 returned a fresh descriptor that nothing else owns.
                    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
                }
            });
            match accepted {
                Ok(Ok(fd)) => return VsockStream::new(fd),
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

/// A connected vsock stream.
#[derive(Debug)]
pub struct VsockStream {
    fd: AsyncFd<OwnedFd>,
}

impl VsockStream {
    fn new(fd: OwnedFd) -> io::Result<Self> {
        Ok(VsockStream { fd: register(fd)? })
    }
}

impl AsyncRead for VsockStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            let read = guard.try_io(|fd| {
                // SAFETY: reading into a buffer of `unfilled.len()` initialized bytes we
                // borrow mutably for the duration of the call.
                let n = unsafe {
                    libc::read(fd.as_raw_fd(), unfilled.as_mut_ptr().cast(), unfilled.len())
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match read {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for VsockStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            let written = guard.try_io(|fd| {
                // SAFETY: writing from a borrowed slice of `data.len()` bytes. MSG_NOSIGNAL so a
                // closed peer is an EPIPE error instead of a SIGPIPE.
                let n = unsafe {
                    libc::send(
                        fd.as_raw_fd(),
                        data.as_ptr().cast(),
                        data.len(),
                        libc::MSG_NOSIGNAL,
                    )
                };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            match written {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // SAFETY: shutdown(2) on a socket we own.
        let rc = unsafe { libc::shutdown(self.fd.get_ref().as_raw_fd(), libc::SHUT_WR) };
        if rc < 0 {
            Poll::Ready(Err(io::Error::last_os_error()))
        } else {
            Poll::Ready(Ok(()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs the host's vsock support (`/dev/vsock`, present on the project's machines); the
    /// agent's only listener in a microVM, so a failure here is worth seeing.
    #[tokio::test]
    async fn binds_on_any_cid() {
        let listener = VsockListener::bind(49_000 + std::process::id() % 1000);
        assert!(listener.is_ok(), "binding AF_VSOCK: {listener:?}");
    }
}
