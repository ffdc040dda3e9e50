//! How the client reaches envd: one fresh byte stream per call, opened by a [`Connector`].
//! A sandbox's agent socket (a Unix socket, or a hybrid-vsock one after its `CONNECT`
//! handshake: any closure returning a stream will do) or the daemon's proxy over TCP.

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

/// How long [`TcpConnector`] waits for the daemon to accept (a host that drops packets
/// would otherwise hold us for the kernel's minutes of SYN retries).
pub const TCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens one byte stream to envd per call.
pub trait Connector: Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn connect(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

impl<F, Fut, S> Connector for F
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = io::Result<S>> + Send,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Io = S;
    fn connect(&self) -> impl Future<Output = io::Result<S>> + Send {
        self()
    }
}

/// An agent listening on a Unix socket.
#[derive(Debug, Clone)]
pub struct UnixConnector(pub PathBuf);

impl Connector for UnixConnector {
    type Io = UnixStream;
    fn connect(&self) -> impl Future<Output = io::Result<UnixStream>> + Send {
        UnixStream::connect(self.0.clone())
    }
}

/// A TCP peer at `host:port` (the daemon, whose proxy routes by header), within
/// [`TCP_CONNECT_TIMEOUT`].
#[derive(Debug, Clone)]
pub struct TcpConnector(pub String);

impl Connector for TcpConnector {
    type Io = TcpStream;
    fn connect(&self) -> impl Future<Output = io::Result<TcpStream>> + Send {
        let addr = self.0.clone();
        async move {
            match tokio::time::timeout(TCP_CONNECT_TIMEOUT, TcpStream::connect(&addr)).await {
                Ok(connected) => connected,
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no answer within {} s", TCP_CONNECT_TIMEOUT.as_secs()),
                )),
            }
        }
    }
}

/// One HTTP/1.1 exchange on `io`: the response head, its body still streaming.
pub async fn exchange<Io, B>(io: Io, req: Request<B>) -> Result<Response<Incoming>, hyper::Error>
where
    Io: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    // Drives the connection until the response body is consumed or dropped; its errors
    // surface through the request and body.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender.send_request(req).await
}
