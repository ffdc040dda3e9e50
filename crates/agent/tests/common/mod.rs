//! Shared by the agent's integration tests: the real `sandcell-agent` binary as a child on a
//! Unix socket in a temporary directory, and a raw HTTP helper for requests the client would
//! never send.
#![allow(dead_code)] // each test binary uses its own subset

pub mod envd;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use sandcell_envd_client::{EnvdClient, ProcessOutput, UnixConnector};
use sandcell_proto::agent::{ProcessConfig, StartRequest};

pub struct Agent {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub client: EnvdClient<UnixConnector>,
}

impl Agent {
    /// Starts the agent binary and waits (at most ~20 s) until it answers /health.
    pub async fn spawn() -> Agent {
        Agent::spawn_with(tempfile::tempdir().expect("creating a temp dir"), &[]).await
    }

    /// Starts the agent binary with extra arguments, its socket in `dir`.
    pub async fn spawn_with(dir: tempfile::TempDir, args: &[String]) -> Agent {
        let sock = dir.path().join("agent.sock");
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandcell-agent"))
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .args(args)
            .spawn()
            .expect("spawning sandcell-agent");
        let client = EnvdClient::unix(&sock);
        let mut last_err = None;
        for _ in 0..400 {
            match client.health().await {
                Ok(()) => {
                    return Agent {
                        child,
                        dir,
                        sock,
                        client,
                    };
                }
                Err(e) => last_err = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("the agent never became healthy: {last_err:?}");
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Waits for the agent process to exit by itself (at most ~20 s).
    pub async fn wait_exit(&mut self) -> ExitStatus {
        for _ in 0..400 {
            if let Some(status) = self.child.try_wait().expect("try_wait on the agent") {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the agent did not exit");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn request(cmd: &str, args: &[&str]) -> StartRequest {
    StartRequest {
        process: ProcessConfig {
            cmd: cmd.to_owned(),
            args: args.iter().map(|s| s.to_string()).collect(),
            envs: BTreeMap::new(),
            cwd: None,
        },
        stdin: None,
        tag: None,
    }
}

pub fn sh(script: &str) -> StartRequest {
    request("/bin/sh", &["-c", script])
}

pub async fn run(client: &EnvdClient<UnixConnector>, req: &StartRequest) -> ProcessOutput {
    let stream = client.start(req).await.expect("Start");
    stream
        .collect(64 * 1024 * 1024)
        .await
        .expect("reading the Start stream")
}

/// One raw HTTP/1.1 request on the agent's socket: (status, body).
pub async fn raw(
    sock: &Path,
    method: &str,
    uri: &str,
    content_type: Option<&str>,
    body: Vec<u8>,
) -> (u16, Bytes) {
    let io = tokio::net::UnixStream::connect(sock)
        .await
        .expect("connecting to the agent");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "agent");
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .expect("building a request");
    let resp = sender.send_request(req).await.expect("sending a request");
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("reading a body")
        .to_bytes();
    (status, body)
}

/// A request written without waiting for the server to read it all: for bodies the server
/// refuses before reading (it answers, then closes, and writing the rest fails). Returns the
/// status line's code and the raw response.
pub async fn raw_unread_body(sock: &Path, head: &str, body: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let stream = tokio::net::UnixStream::connect(sock)
        .await
        .expect("connecting to the agent");
    let (mut rd, mut wr) = stream.into_split();
    let mut request = head.as_bytes().to_vec();
    request.extend_from_slice(body);
    let writer = tokio::spawn(async move {
        // Fails with EPIPE once the agent has answered and closed: expected.
        let _ = wr.write_all(&request).await;
        wr
    });
    let mut response = Vec::new();
    // Closing with our unread body queued resets the socket after the answer: keep what came.
    let _ = rd.read_to_end(&mut response).await;
    let _ = writer.await;
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

/// Deterministic bytes that are not all alike (xorshift).
pub fn pseudo_random(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    out
}
