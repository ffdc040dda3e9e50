//! Where the agent listens: `vsock:PORT` (in a microVM), `unix:/path` (gVisor, tests) or
//! `tcp:IP:PORT` (tests, debugging). TCP addresses are parsed literally: no name resolution,
//! so the static binary never needs NSS.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener};

use crate::repoll::RepollUnix;

use crate::vsock::{VsockListener, VsockStream};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    Vsock { port: u32 },
    Unix(PathBuf),
    Tcp(SocketAddr),
}

#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("listen address {0:?} is not vsock:PORT, unix:/PATH or tcp:IP:PORT")]
    Syntax(String),
    #[error("binding {addr}: {source}")]
    Bind { addr: ListenAddr, source: io::Error },
}

impl FromStr for ListenAddr {
    type Err = ListenError;

    fn from_str(s: &str) -> Result<Self, ListenError> {
        let bad = || ListenError::Syntax(s.to_owned());
        let (scheme, rest) = s.split_once(':').ok_or_else(bad)?;
        match scheme {
            "vsock" => Ok(ListenAddr::Vsock {
                port: rest.parse().map_err(|_| bad())?,
            }),
            "unix" if !rest.is_empty() => Ok(ListenAddr::Unix(PathBuf::from(rest))),
            "tcp" => Ok(ListenAddr::Tcp(rest.parse().map_err(|_| bad())?)),
            _ => Err(bad()),
        }
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::Vsock { port } => write!(f, "vsock:{port}"),
            ListenAddr::Unix(path) => write!(f, "unix:{}", path.display()),
            ListenAddr::Tcp(addr) => write!(f, "tcp:{addr}"),
        }
    }
}

#[derive(Debug)]
pub enum Listener {
    Vsock(VsockListener),
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    pub async fn bind(addr: &ListenAddr) -> Result<Self, ListenError> {
        let wrap = |source| ListenError::Bind {
            addr: addr.clone(),
            source,
        };
        match addr {
            ListenAddr::Vsock { port } => VsockListener::bind(*port)
                .map(Listener::Vsock)
                .map_err(wrap),
            ListenAddr::Unix(path) => {
                remove_stale_socket(path).map_err(wrap)?;
                UnixListener::bind(path).map(Listener::Unix).map_err(wrap)
            }
            ListenAddr::Tcp(sa) => TcpListener::bind(sa).await.map(Listener::Tcp).map_err(wrap),
        }
    }

    pub async fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Vsock(l) => l.accept().await.map(Stream::Vsock),
            Listener::Unix(l) => crate::repoll::accept(l)
                .await
                .map(|s| Stream::Unix(RepollUnix::new(s))),
            Listener::Tcp(l) => l.accept().await.map(|(s, _)| Stream::Tcp(s)),
        }
    }
}

/// A socket left by a previous agent (e.g. a restored sandbox) would make bind fail; anything
/// that is not a socket is left alone and bind reports the clash.
fn remove_stale_socket(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        _ => Ok(()),
    }
}

/// One accepted connection, whatever the transport.
#[derive(Debug)]
pub enum Stream {
    Vsock(VsockStream),
    /// Wrapped: gVisor's host-backed Unix sockets can lose readiness events.
    Unix(RepollUnix),
    Tcp(TcpStream),
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Stream::Vsock($s) => {
                let $s = Pin::new($s);
                $e
            }
            Stream::Unix($s) => {
                let $s = Pin::new($s);
                $e
            }
            Stream::Tcp($s) => {
                let $s = Pin::new($s);
                $e
            }
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, data))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_schemes() {
        assert_eq!(
            "vsock:49983".parse::<ListenAddr>().ok(),
            Some(ListenAddr::Vsock { port: 49983 })
        );
        assert_eq!(
            "unix:/run/a.sock".parse::<ListenAddr>().ok(),
            Some(ListenAddr::Unix("/run/a.sock".into()))
        );
        assert_eq!(
            "tcp:127.0.0.1:8080".parse::<ListenAddr>().ok(),
            Some(ListenAddr::Tcp(([127, 0, 0, 1], 8080).into()))
        );
        for bad in ["vsock:x", "unix:", "tcp:localhost:80", "http://x", "49983"] {
            assert!(bad.parse::<ListenAddr>().is_err(), "{bad} should not parse");
        }
    }
}
