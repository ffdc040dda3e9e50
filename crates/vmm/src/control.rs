//! The control socket: newline-delimited JSON, one `ControlRequest` per line in, one
//! `ControlResponse` per line out, in order, per connection.
//!
//! The server is an event-manager subscriber on the VMM thread. It only reads and parses:
//! requests are queued and the VMM loop executes them after the epoll round (pausing needs
//! the event manager itself, which is busy dispatching while subscribers run), then hands
//! the answers back with [`ControlServer::respond`].

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use sandcell_proto::vmm::{ControlRequest, ControlResponse};

/// The longest request line accepted (requests are tiny; this bounds the buffer).
pub const MAX_LINE: usize = 64 * 1024;
/// At most this many clients at once (the supervisor needs one or two).
pub const MAX_CONNECTIONS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("binding the control socket {path}: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type ConnId = u64;

struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
    /// Skipping the rest of an overlong line.
    discarding: bool,
    /// The client closed its side; answer what is queued, then close.
    eof: bool,
}

pub struct ControlServer {
    listener: UnixListener,
    path: PathBuf,
    conns: HashMap<ConnId, Conn>,
    by_fd: HashMap<RawFd, ConnId>,
    next_id: ConnId,
    pending: VecDeque<(ConnId, Result<ControlRequest, String>)>,
}

impl ControlServer {
    /// Binds `path` (a stale socket file left there is replaced).
    pub fn bind(path: &Path) -> Result<ControlServer, ControlError> {
        if std::fs::symlink_metadata(path).is_ok_and(|m| {
            use std::os::unix::fs::FileTypeExt;
            m.file_type().is_socket()
        }) {
            let _ = std::fs::remove_file(path);
        }
        let err = |source| ControlError::Bind {
            path: path.into(),
            source,
        };
        let listener = UnixListener::bind(path).map_err(err)?;
        listener.set_nonblocking(true).map_err(err)?;
        Ok(ControlServer {
            listener,
            path: path.into(),
            conns: HashMap::new(),
            by_fd: HashMap::new(),
            next_id: 0,
            pending: VecDeque::new(),
        })
    }

    /// Requests parsed since the last call, in arrival order.
    pub fn take_requests(&mut self) -> Vec<(ConnId, Result<ControlRequest, String>)> {
        let reqs: Vec<_> = self.pending.drain(..).collect();
        self.reap();
        reqs
    }

    /// Writes one response line. A client that does not read its answers (socket buffer
    /// full) or went away is dropped.
    pub fn respond(&mut self, id: ConnId, resp: &ControlResponse) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let mut line = match serde_json::to_vec(resp) {
            Ok(l) => l,
            Err(e) => format!("{{\"result\":\"error\",\"message\":\"{e}\"}}").into_bytes(),
        };
        line.push(b'\n');
        if let Err(e) = conn.stream.write_all(&line) {
            tracing::debug!("control connection {id}: write failed ({e}), closing");
            self.close(id);
            return;
        }
        self.reap();
    }

    fn close(&mut self, id: ConnId) {
        if let Some(c) = self.conns.remove(&id) {
            self.by_fd.remove(&c.stream.as_raw_fd());
        }
    }

    /// Closes connections that hung up and have nothing left to answer.
    fn reap(&mut self) {
        let done: Vec<ConnId> = self
            .conns
            .iter()
            .filter(|(id, c)| c.eof && !self.pending.iter().any(|(p, _)| p == *id))
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            self.close(id);
        }
    }

    fn accept(&mut self, ops: &mut EventOps) {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!("control socket {}: accept failed: {e}", self.path.display());
                    return;
                }
            };
            if self.conns.len() >= MAX_CONNECTIONS || stream.set_nonblocking(true).is_err() {
                continue; // dropped: closes the connection
            }
            let fd = stream.as_raw_fd();
            if let Err(e) = ops.add(Events::new(&stream, EventSet::IN | EventSet::READ_HANG_UP)) {
                tracing::warn!("control socket: watching a connection failed: {e}");
                continue;
            }
            let id = self.next_id;
            self.next_id += 1;
            self.by_fd.insert(fd, id);
            self.conns.insert(
                id,
                Conn {
                    stream,
                    buf: Vec::new(),
                    discarding: false,
                    eof: false,
                },
            );
        }
    }

    fn read_conn(&mut self, id: ConnId, ops: &mut EventOps) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let mut chunk = [0u8; 4096];
        loop {
            match conn.stream.read(&mut chunk) {
                Ok(0) => {
                    conn.eof = true;
                    break;
                }
                Ok(n) => {
                    split_lines(conn, &chunk[..n], |req| self.pending.push_back((id, req)));
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => {
                    conn.eof = true;
                    break;
                }
            }
        }
        // Hung up: stop watching; the connection lives until its answers are written.
        let _ = ops.remove(Events::empty(&conn.stream));
    }
}

/// Appends `data` to the connection buffer and emits each complete line, parsed. A line
/// longer than MAX_LINE is answered with an error and skipped up to its newline.
fn split_lines(conn: &mut Conn, data: &[u8], mut emit: impl FnMut(Result<ControlRequest, String>)) {
    for &b in data {
        if b == b'\n' {
            if conn.discarding {
                conn.discarding = false;
            } else {
                let line = std::mem::take(&mut conn.buf);
                #[cfg(feature = "test-control")]
                test_control::maybe_forbidden_syscall(&line);
                if !line.iter().all(u8::is_ascii_whitespace) {
                    emit(
                        serde_json::from_slice(&line).map_err(|e| format!("invalid request: {e}")),
                    );
                }
            }
            conn.buf.clear();
            continue;
        }
        if conn.discarding {
            continue;
        }
        if conn.buf.len() == MAX_LINE {
            conn.buf.clear();
            conn.discarding = true;
            emit(Err(format!("request line longer than {MAX_LINE} bytes")));
            continue;
        }
        conn.buf.push(b);
    }
}

impl MutEventSubscriber for ControlServer {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.listener, EventSet::IN)) {
            tracing::error!(
                "control socket {}: cannot watch the listener: {e}",
                self.path.display()
            );
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let fd = events.fd();
        if fd == self.listener.as_raw_fd() {
            self.accept(ops);
        } else if let Some(&id) = self.by_fd.get(&fd) {
            self.read_conn(id, ops);
        } else {
            // Not ours any more (closed during this round).
            let _ = ops.remove(Events::empty_raw(fd));
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conn() -> (Conn, UnixStream) {
        let (a, b) = UnixStream::pair().expect("pair");
        (
            Conn {
                stream: a,
                buf: Vec::new(),
                discarding: false,
                eof: false,
            },
            b,
        )
    }

    #[test]
    fn lines_split_across_reads_parse_in_order() {
        let (mut c, _peer) = conn();
        let mut out = Vec::new();
        split_lines(&mut c, b"{\"op\":\"sta", |r| out.push(r));
        assert!(out.is_empty());
        split_lines(&mut c, b"tus\"}\n\n{\"op\":\"pause\"}\nnot json\n", |r| {
            out.push(r)
        });
        assert_eq!(out.len(), 3);
        assert_eq!(out[0], Ok(ControlRequest::Status));
        assert_eq!(out[1], Ok(ControlRequest::Pause));
        assert!(
            out[2]
                .as_ref()
                .is_err_and(|e| e.contains("invalid request"))
        );
    }

    #[test]
    fn overlong_lines_are_refused_and_skipped() {
        let (mut c, _peer) = conn();
        let mut out = Vec::new();
        let long = vec![b'x'; MAX_LINE + 10];
        split_lines(&mut c, &long, |r| out.push(r));
        assert_eq!(out.len(), 1);
        assert!(out[0].as_ref().is_err_and(|e| e.contains("longer than")));
        assert!(c.buf.len() <= MAX_LINE);
        split_lines(&mut c, b"yyy\n{\"op\":\"resume\"}\n", |r| out.push(r));
        assert_eq!(out.len(), 2);
        assert_eq!(out[1], Ok(ControlRequest::Resume));
    }
}

/// Test-only requests, compiled only with the `test-control` feature (never in release
/// binaries): they exist to prove that the seccomp filter is in force.
#[cfg(feature = "test-control")]
mod test_control {
    /// The request line that makes the VMM thread call a syscall outside its filter.
    pub const FORBIDDEN_SYSCALL: &[u8] = br#"{"op":"test_forbidden_syscall"}"#;

    /// On [`FORBIDDEN_SYSCALL`], calls `getppid` (harmless, and in no filter table): under
    /// the filter the process dies with SIGSYS here; without it the line is then refused as
    /// an unknown request.
    pub fn maybe_forbidden_syscall(line: &[u8]) {
        if line.trim_ascii() == FORBIDDEN_SYSCALL {
            tracing::warn!("test-control: calling getppid, which the seccomp filter forbids");
            // SAFETY: getppid takes no arguments and touches no memory.
            let ppid = unsafe { libc::syscall(libc::SYS_getppid) };
            tracing::warn!("test-control: getppid returned {ppid}: no seccomp filter");
        }
    }
}
