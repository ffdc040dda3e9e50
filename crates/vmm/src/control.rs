//! The control socket: newline-delimited JSON, one `ControlRequest` per line in, one
//! `ControlResponse` per line out, in order, per connection.
//!
//! The server is an event-manager subscriber on the VMM thread. It only reads and parses:
//! requests are queued and the VMM loop executes them after the epoll round (pausing needs
//! the event manager itself, which is busy dispatching while subscribers run), then hands
//! the answers back with [`ControlServer::respond`].
//!
//! A client may send file descriptors with its bytes (`SCM_RIGHTS`): a `restore` that
//! gives a waiting VMM its TAP. They are held per connection, at most [`MAX_FDS`], until
//! a request takes them ([`ControlServer::take_fds`]) or the connection closes.

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use sandcell_proto::vmm::{ControlRequest, ControlResponse};

/// The longest request line accepted (requests are tiny; this bounds the buffer).
pub const MAX_LINE: usize = 64 * 1024;
/// At most this many clients at once (the supervisor needs one or two).
pub const MAX_CONNECTIONS: usize = 16;
/// At most this many received descriptors are held per connection (a restore takes one
/// TAP); more are closed as they arrive.
pub const MAX_FDS: usize = 4;

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
    /// Descriptors received and not taken yet.
    fds: Vec<OwnedFd>,
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

    /// The descriptors connection `id` sent so far and no request took.
    pub fn take_fds(&mut self, id: ConnId) -> Vec<OwnedFd> {
        self.conns
            .get_mut(&id)
            .map(|c| std::mem::take(&mut c.fds))
            .unwrap_or_default()
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
                    fds: Vec::new(),
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
            match recv_with_fds(&conn.stream, &mut chunk, &mut conn.fds) {
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

/// One `recvmsg` into `buf`; descriptors that came with the bytes are appended to `fds`
/// up to [`MAX_FDS`] (the rest closed). Close-on-exec: the VMM execs nothing, but a
/// descriptor must not outlive its use by accident.
fn recv_with_fds(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> std::io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for one SCM_RIGHTS message of MAX_FDS descriptors (u64s: cmsghdr alignment).
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain old data; all-zero is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: msg points at our live iovec (over `buf`) and control buffer, sized as
    // declared; the kernel writes within them.
    let n = unsafe { libc::recvmsg(stream.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: msg is the header recvmsg filled; CMSG_FIRSTHDR/NXTHDR stay within its
    // control buffer (msg_controllen was set to what the kernel wrote).
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: a non-null header from CMSG_FIRSTHDR/NXTHDR is within the buffer.
        let header = unsafe { &*cmsg };
        if header.cmsg_level == libc::SOL_SOCKET && header.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_LEN(0) is arithmetic on a constant.
            let data_len =
                (header.cmsg_len as usize).saturating_sub(unsafe { libc::CMSG_LEN(0) } as usize);
            // SAFETY: CMSG_DATA points at this message's payload, inside the buffer.
            let data = unsafe { libc::CMSG_DATA(cmsg) }.cast::<libc::c_int>();
            for i in 0..data_len / std::mem::size_of::<libc::c_int>() {
                // SAFETY: i is within the payload's length; read_unaligned because the
                // payload's alignment is the kernel's business.
                let raw = unsafe { std::ptr::read_unaligned(data.add(i)) };
                // SAFETY: SCM_RIGHTS installed this descriptor in our table for us: we
                // own it and nothing else refers to it.
                let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                if fds.len() < MAX_FDS {
                    fds.push(fd);
                }
            }
        }
        // SAFETY: as CMSG_FIRSTHDR above.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok(n as usize)
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
                fds: Vec::new(),
            },
            b,
        )
    }

    /// Sends `data` with `fds` as one SCM_RIGHTS message (what the daemon does).
    fn send_with_fds(stream: &UnixStream, data: &[u8], fds: &[RawFd]) {
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let mut control = [0u64; 16];
        let payload = std::mem::size_of_val(fds);
        // SAFETY: test code: msghdr zeroed, then pointed at live buffers of the given sizes.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(payload as u32) as usize;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload as u32) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                payload,
            );
            assert_eq!(
                libc::sendmsg(stream.as_raw_fd(), &msg, 0),
                data.len() as isize
            );
        }
    }

    #[test]
    fn descriptors_sent_with_a_request_are_held_up_to_the_cap() {
        let (conn, client) = conn();
        let mut conn = conn;
        let files: Vec<std::fs::File> = (0..MAX_FDS + 2)
            .map(|_| tempfile::tempfile().expect("tempfile"))
            .collect();
        let raw: Vec<RawFd> = files.iter().map(AsRawFd::as_raw_fd).collect();
        send_with_fds(&client, b"{\"cmd\":\"status\"}\n", &raw);
        let mut chunk = [0u8; 64];
        let n = recv_with_fds(&conn.stream, &mut chunk, &mut conn.fds).expect("recv");
        assert_eq!(&chunk[..n], b"{\"cmd\":\"status\"}\n");
        assert_eq!(conn.fds.len(), MAX_FDS, "the rest are closed, not held");
        // What came is the same open file: a write through ours shows in the sender's.
        use std::io::{Read, Seek};
        let mut ours = std::fs::File::from(conn.fds.remove(0));
        ours.write_all(b"same file").expect("write");
        let mut theirs = &files[0];
        theirs.rewind().expect("rewind");
        let mut text = String::new();
        theirs.read_to_string(&mut text).expect("read");
        assert_eq!(text, "same file");
        // Bytes without descriptors add none.
        client
            .try_clone()
            .expect("clone")
            .write_all(b"x")
            .expect("write");
        let n = recv_with_fds(&conn.stream, &mut chunk, &mut conn.fds).expect("recv");
        assert_eq!((n, conn.fds.len()), (1, MAX_FDS - 1));
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
