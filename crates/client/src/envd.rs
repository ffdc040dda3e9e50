//! A sandbox's envd API through the daemon's proxy: processes (Start with or without a PTY,
//! input, signals, resize) and files (streamed both ways).
//!
//! The protocol is `sandcell-envd-client`'s ([`EnvdClient::via_proxy`]); what is here only
//! puts its errors in this crate's [`ClientError`], so a caller explains a daemon that does
//! not answer and a sandbox that does not the same way for REST and envd calls.

use crate::{Client, ClientError};
use bytes::Bytes;
use hyper::StatusCode;
use sandcell_envd_client::{self as envd, EnvdClient, TcpConnector};
use sandcell_proto::agent::filesystem as fs;
use sandcell_proto::agent::process::StartRequest;
use sandcell_proto::agent::{DataEvent, EntryInfo, ProcessEvent};
use tokio::io::AsyncRead;

pub use sandcell_envd_client::OutputKind as Output;

/// The envd API of one sandbox, as one user.
#[derive(Debug, Clone)]
pub struct Envd {
    inner: EnvdClient<TcpConnector>,
    /// The daemon's `host:port`, for errors.
    addr: String,
    sandbox_id: String,
}

impl Client {
    /// The envd API of sandbox `sandbox_id` (its access token, if it is `secure`).
    pub fn envd_of(&self, sandbox_id: &str, access_token: Option<String>) -> Envd {
        Envd {
            inner: EnvdClient::via_proxy(&self.addr, sandbox_id, access_token),
            addr: self.addr.clone(),
            sandbox_id: sandbox_id.to_string(),
        }
    }

    /// The envd API of a sandbox known by id only: its access token is asked of the daemon.
    pub async fn connect_envd(&self, sandbox_id: &str) -> Result<Envd, ClientError> {
        let detail = self.get_sandbox(sandbox_id).await?;
        Ok(self.envd_of(sandbox_id, detail.envd_access_token))
    }
}

impl Envd {
    /// Calls made as `user` (`root`, `user`, ...); without one the sandbox's default user.
    pub fn as_user(mut self, user: Option<String>) -> Envd {
        self.inner = self.inner.as_user(user);
        self
    }

    pub fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    fn error(&self, e: envd::ClientError) -> ClientError {
        from_envd(&self.addr, e)
    }

    /// Starts a process; its events stream. A process that cannot start (no such command)
    /// comes out of the stream as [`ClientError::Rpc`].
    pub async fn start(&self, start: &StartRequest) -> Result<ProcessStream, ClientError> {
        Ok(ProcessStream {
            inner: self.inner.start(start).await.map_err(|e| self.error(e))?,
            addr: self.addr.clone(),
        })
    }

    /// Writes to the stdin (or, `pty`, the terminal) of process `pid`.
    pub async fn send_input(&self, pid: u32, data: &[u8], pty: bool) -> Result<(), ClientError> {
        let sent = if pty {
            self.inner.send_pty_input(pid, data).await
        } else {
            self.inner.send_input(pid, data).await
        };
        sent.map_err(|e| self.error(e))
    }

    /// Opens a `StreamInput` call to process `pid`: one request whose body carries every
    /// input chunk as it is sent.
    pub fn stream_input(&self, pid: u32, pty: bool) -> Result<InputStream, ClientError> {
        Ok(InputStream {
            inner: self
                .inner
                .stream_input(pid, pty)
                .map_err(|e| self.error(e))?,
            addr: self.addr.clone(),
        })
    }

    pub async fn close_stdin(&self, pid: u32) -> Result<(), ClientError> {
        self.inner.close_stdin(pid).await.map_err(|e| self.error(e))
    }

    /// Signals process `pid` (its group). envd's enum names for the ones it knows, the
    /// number for the rest (our agent takes any).
    pub async fn send_signal(&self, pid: u32, signal: i32) -> Result<(), ClientError> {
        self.inner
            .send_signal(pid, signal)
            .await
            .map_err(|e| self.error(e))
    }

    /// Resizes the PTY of process `pid`.
    pub async fn resize(&self, pid: u32, cols: u16, rows: u16) -> Result<(), ClientError> {
        self.inner
            .resize(pid, cols, rows)
            .await
            .map_err(|e| self.error(e))
    }

    /// What is at `path`; `Ok(None)` when nothing is.
    pub async fn stat(&self, path: &str) -> Result<Option<fs::EntryInfo>, ClientError> {
        self.inner.stat(path).await.map_err(|e| self.error(e))
    }

    /// The entries under the directory `path`, `depth` levels down (1: its children).
    pub async fn list_dir(
        &self,
        path: &str,
        depth: u32,
    ) -> Result<Vec<fs::EntryInfo>, ClientError> {
        self.inner
            .list_dir(path, depth)
            .await
            .map_err(|e| self.error(e))
    }

    /// Makes the directory `path` and its parents; an existing one is a 409
    /// [`ClientError::Envd`].
    pub async fn make_dir(&self, path: &str) -> Result<fs::EntryInfo, ClientError> {
        self.inner.make_dir(path).await.map_err(|e| self.error(e))
    }

    /// Removes the file or directory (recursively) at `path`.
    pub async fn remove(&self, path: &str) -> Result<(), ClientError> {
        self.inner.remove(path).await.map_err(|e| self.error(e))
    }

    /// Streams the file at `path` out of the sandbox.
    pub async fn download(&self, path: &str) -> Result<Download, ClientError> {
        Ok(Download {
            inner: self
                .inner
                .read_file(path)
                .await
                .map_err(|e| self.error(e))?,
            addr: self.addr.clone(),
        })
    }

    /// Streams `contents` into the file at `path` (parents made as needed).
    pub async fn upload<R>(&self, path: &str, contents: R) -> Result<Vec<EntryInfo>, ClientError>
    where
        R: AsyncRead + Unpin + Send + 'static,
    {
        self.inner
            .write_file(path, contents)
            .await
            .map_err(|e| self.error(e))
    }
}

/// An envd client error as this crate names it: reaching the daemon fails as for REST
/// calls ([`ClientError::Connect`], [`ClientError::Http`]); an error answer from the
/// sandbox is [`ClientError::Envd`]; a broken answer [`ClientError::Body`] or
/// [`ClientError::Decode`].
pub(crate) fn from_envd(addr: &str, e: envd::ClientError) -> ClientError {
    use envd::ClientError as E;
    match e {
        E::Connect(source) => ClientError::Connect {
            addr: addr.to_string(),
            source,
        },
        E::Request { uri, reason } => ClientError::Url {
            url: uri,
            problem: reason,
        },
        E::Http { source, .. } => ClientError::Http {
            addr: addr.to_string(),
            source,
        },
        E::Body { what, source } => ClientError::Body(format!("{what}: {source}")),
        E::Status {
            what,
            status,
            code,
            message,
        } => ClientError::Envd {
            what,
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            code,
            message,
        },
        E::Rpc {
            what,
            code,
            message,
        } => ClientError::Rpc {
            what,
            code,
            message,
        },
        E::Protocol { what, reason } => ClientError::Decode {
            what,
            problem: reason,
        },
        E::TooLarge { what, .. } => ClientError::Body(format!("{what}: length limit exceeded")),
        E::Ended { what, reason } => ClientError::Body(format!("{what}: {reason}")),
    }
}

/// The bytes of a data event.
pub fn decode_data(data: &DataEvent) -> Result<(Output, Vec<u8>), ClientError> {
    envd::decode_data(data).map_err(|e| from_envd("", e))
}

/// The events of one process, as they come.
#[derive(Debug)]
pub struct ProcessStream {
    inner: envd::ProcessStream,
    addr: String,
}

impl ProcessStream {
    /// The next event; `None` once the stream ended cleanly, and after any error. An error
    /// in the end-of-stream message comes out as [`ClientError::Rpc`].
    pub async fn next(&mut self) -> Option<Result<ProcessEvent, ClientError>> {
        let next = self.inner.next().await?;
        Some(next.map_err(|e| from_envd(&self.addr, e)))
    }
}

/// Input to one process, in order, over one `StreamInput` call.
#[derive(Debug)]
pub struct InputStream {
    inner: envd::InputStream,
    addr: String,
}

impl InputStream {
    /// Queues `data`; waits while the daemon is behind.
    pub async fn send(&mut self, data: &[u8]) -> Result<(), ClientError> {
        self.inner
            .send(data)
            .await
            .map_err(|e| from_envd(&self.addr, e))
    }

    /// Ends the stream and waits for the daemon's answer (everything sent was delivered).
    pub async fn finish(self) -> Result<(), ClientError> {
        let addr = self.addr;
        self.inner.finish().await.map_err(|e| from_envd(&addr, e))
    }
}

/// A file's contents, as they come.
#[derive(Debug)]
pub struct Download {
    inner: envd::FileStream,
    addr: String,
}

impl Download {
    /// The next chunk; `None` at the end.
    pub async fn next_chunk(&mut self) -> Option<Result<Bytes, ClientError>> {
        let next = self.inner.next_chunk().await?;
        Some(next.map_err(|e| from_envd(&self.addr, e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envd_errors_keep_status_code_and_message() {
        let e = from_envd(
            "127.0.0.1:1",
            envd::ClientError::Status {
                what: "GET /files".into(),
                status: 401,
                code: "401".into(),
                message: "bad user".into(),
            },
        );
        assert!(matches!(
            &e,
            ClientError::Envd { status, code, message, .. }
                if *status == StatusCode::UNAUTHORIZED && code == "401" && message == "bad user"
        ));
        let e = from_envd(
            "127.0.0.1:1",
            envd::ClientError::Connect(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
        );
        assert!(matches!(&e, ClientError::Connect { addr, .. } if addr == "127.0.0.1:1"));
    }
}
