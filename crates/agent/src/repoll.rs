//! A Unix stream that does not trust readiness events alone.
//!
//! Under gVisor (Debian's runsc 20221219) the agent's socket is a host-backed Unix socket
//! (`--host-uds=create`), and the sentry sometimes loses the readiness notification for it:
//! bytes sit in the host socket's receive queue, the agent's epoll never reports them, the
//! daemon's write side stays full, and an upload hangs forever. It was reproduced with the
//! Python SDK's 10 MiB `files.write` through the daemon (about 1 in 10), with the host end
//! showing the unread bytes (`ss -x`: Recv-Q on the sandbox's socket, Send-Q on ours).
//!
//! [`RepollUnix`] turns such a lost wakeup into a short delay: whenever a read or write would
//! block, it also arms a timer (exponential backoff from [`FIRST_RETRY`] to [`MAX_RETRY`]);
//! when the timer fires before the readiness event, it retries with a plain non-blocking
//! `recv`/`send` on the descriptor. tokio's own readiness state is bypassed on purpose: it
//! would answer "not ready" without asking the kernel, which is exactly the stale answer we
//! are working around. Every recovered stall is logged once per connection, so a gVisor that
//! does not need this shows no such line.

use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::time::Sleep;

/// First retry after a read or write would block.
pub const FIRST_RETRY: Duration = Duration::from_millis(20);
/// Longest gap between retries on an idle connection.
pub const MAX_RETRY: Duration = Duration::from_secs(1);

/// Backoff timer for one direction.
#[derive(Debug, Default)]
struct Watchdog {
    timer: Option<Pin<Box<Sleep>>>,
    next: Duration,
}

impl Watchdog {
    /// Progress was made: the next stall starts from the shortest delay again.
    fn reset(&mut self) {
        self.timer = None;
        self.next = FIRST_RETRY;
    }

    /// Arms the timer if needed and polls it: `Ready` when it fired (the caller retries by
    /// hand), `Pending` with the task registered to wake when it fires.
    fn poll_fired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let delay = self.next.max(FIRST_RETRY);
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(delay)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.timer = None;
                self.next = (delay * 2).min(MAX_RETRY);
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[derive(Debug)]
pub struct RepollUnix {
    inner: UnixStream,
    read: Watchdog,
    write: Watchdog,
    recovered_logged: bool,
}

impl RepollUnix {
    pub fn new(inner: UnixStream) -> Self {
        RepollUnix {
            inner,
            read: Watchdog::default(),
            write: Watchdog::default(),
            recovered_logged: false,
        }
    }

    fn note_recovered(&mut self, what: &str, n: usize) {
        if !self.recovered_logged {
            self.recovered_logged = true;
            crate::log!(
                "unix socket: {what} of {n} bytes succeeded without a readiness event \
                 (lost wakeup recovered; logged once per connection)"
            );
        }
    }

    /// A non-blocking `recv` straight on the descriptor.
    fn raw_recv(&self, buf: &mut ReadBuf<'_>) -> io::Result<usize> {
        let unfilled = buf.initialize_unfilled();
        // SAFETY: recv writes at most `unfilled.len()` bytes into the initialised slice it
        // is given, on the descriptor `self.inner` keeps open.
        let n = unsafe {
            libc::recv(
                self.inner.as_raw_fd(),
                unfilled.as_mut_ptr().cast(),
                unfilled.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        buf.advance(n);
        Ok(n)
    }

    /// A non-blocking `send` straight on the descriptor.
    fn raw_send(&self, data: &[u8]) -> io::Result<usize> {
        // SAFETY: send reads at most `data.len()` bytes from `data`, on the descriptor
        // `self.inner` keeps open; MSG_NOSIGNAL turns a closed peer into EPIPE, not SIGPIPE.
        let n = unsafe {
            libc::send(
                self.inner.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted
}

impl AsyncRead for RepollUnix {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Poll::Ready(r) = Pin::new(&mut this.inner).poll_read(cx, buf) {
            this.read.reset();
            return Poll::Ready(r);
        }
        // Pending: tokio registered the task for the readiness event; the timer is the
        // second way to be woken.
        while this.read.poll_fired(cx).is_ready() {
            match this.raw_recv(buf) {
                Ok(n) => {
                    if n > 0 {
                        this.note_recovered("a read", n);
                    }
                    this.read.reset();
                    return Poll::Ready(Ok(()));
                }
                Err(e) if would_block(&e) => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Pending
    }
}

impl AsyncWrite for RepollUnix {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Poll::Ready(r) = Pin::new(&mut this.inner).poll_write(cx, data) {
            this.write.reset();
            return Poll::Ready(r);
        }
        while this.write.poll_fired(cx).is_ready() {
            match this.raw_send(data) {
                Ok(n) => {
                    this.note_recovered("a write", n);
                    this.write.reset();
                    return Poll::Ready(Ok(n));
                }
                Err(e) if would_block(&e) => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Pending
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Accepts the next connection on `listener`, also trying a plain non-blocking `accept4`
/// on a backoff timer (the same lost readiness events hit the listening socket of a
/// restored gVisor sandbox: the host end connects, the agent is never told).
pub async fn accept(listener: &UnixListener) -> io::Result<UnixStream> {
    let mut delay = FIRST_RETRY;
    loop {
        tokio::select! {
            accepted = listener.accept() => return accepted.map(|(s, _)| s),
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(MAX_RETRY);
        // SAFETY: accept4 on the listening descriptor `listener` keeps open; null address
        // pointers are allowed (the peer's address is not wanted).
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if would_block(&e) {
                continue;
            }
            return Err(e);
        }
        crate::log!(
            "unix socket: accepted a connection without a readiness event (lost wakeup recovered)"
        );
        // SAFETY: accept4 returned a new descriptor that nothing else owns.
        let std_stream = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
        return UnixStream::from_std(std_stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn carries_bytes_both_ways_and_sees_eof() {
        let (a, b) = UnixStream::pair().expect("socketpair");
        let mut a = RepollUnix::new(a);
        let mut b = RepollUnix::new(b);
        let payload: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let sent = payload.clone();
        let writer = tokio::spawn(async move {
            a.write_all(&sent).await.expect("write");
            a.shutdown().await.expect("shutdown");
        });
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.expect("read");
        writer.await.expect("writer");
        assert_eq!(got.len(), payload.len());
        assert!(got == payload, "bytes differ");
    }

    #[tokio::test]
    async fn a_read_completes_from_the_timer_when_no_event_comes() {
        // Bytes written with a plain std socket on the other end are delivered whether the
        // epoll event or the watchdog gets there first: the read must finish either way.
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        b.set_nonblocking(true).expect("nonblocking");
        let mut b = RepollUnix::new(UnixStream::from_std(b).expect("tokio stream"));
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 5];
            b.read_exact(&mut buf).await.map(|_| buf)
        });
        tokio::time::sleep(FIRST_RETRY * 3).await;
        std::io::Write::write_all(&mut &a, b"hello").expect("write");
        let got = reader.await.expect("reader").expect("read");
        assert_eq!(&got, b"hello");
    }
}
