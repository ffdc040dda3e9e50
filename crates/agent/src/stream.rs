//! The `Process/Start` response stream: start, data as it comes, keepalives, end, then the
//! Connect end-of-stream envelope.
//!
//! Output is read in chunks of at most [`CHUNK`] bytes and each chunk is sent before the next
//! read, into a bounded channel: a slow client stops the reading (and, through the pipe, the
//! process) instead of growing a buffer. A client that goes away does not stop the process
//! (envd's semantics): its output is then read and dropped so it never blocks on a full pipe.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use sandcell_proto::agent::{
    ConnectError, DataEvent, EndEvent, EndOfStream, Event, Keepalive, ProcessEvent, StartEvent,
    envelope,
};
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use crate::process::{Processes, Running};
use crate::reaper::ExitKind;

/// Largest data chunk per event (before base64).
pub const CHUNK: usize = 32 * 1024;
/// After the process exits, output still in its pipes is sent; this bounds how much, so a
/// background child that inherited the pipes and keeps writing cannot hold the end back.
const DRAIN_AFTER_EXIT: usize = 1024 * 1024;

pub fn envelope_of<T: serde::Serialize>(flags: u8, message: &T) -> Bytes {
    // Serializing our own plain structs cannot fail; an empty message would be a bug we'd see.
    let json = serde_json::to_vec(message).unwrap_or_default();
    Bytes::from(envelope::encode(flags, &json))
}

/// The end-of-stream envelope, with an error or without.
pub fn end_of_stream(error: Option<ConnectError>) -> Bytes {
    envelope_of(envelope::FLAG_END_STREAM, &EndOfStream { error })
}

fn event(event: Event) -> Bytes {
    envelope_of(0, &ProcessEvent { event })
}

/// Where the envelopes go; remembers that the client left.
struct Sink {
    tx: mpsc::Sender<Bytes>,
    connected: bool,
}

impl Sink {
    async fn send(&mut self, make: impl FnOnce() -> Bytes) {
        if self.connected && self.tx.send(make()).await.is_err() {
            self.connected = false;
        }
    }
}

#[derive(Clone, Copy)]
enum Output {
    Stdout,
    Stderr,
}

fn data_event(which: Output, bytes: &[u8]) -> Bytes {
    let encoded = Some(BASE64.encode(bytes));
    let data = match which {
        Output::Stdout => DataEvent {
            stdout: encoded,
            ..Default::default()
        },
        Output::Stderr => DataEvent {
            stderr: encoded,
            ..Default::default()
        },
    };
    event(Event::Data(data))
}

/// Reads from `pipe`, or waits forever once it is closed (so `select!` ignores it).
async fn read_open(pipe: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> std::io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Sends whatever is already in the pipe, without waiting for more.
async fn drain(sink: &mut Sink, which: Output, pipe: Option<pipe::Receiver>, buf: &mut [u8]) {
    let Some(pipe) = pipe else { return };
    let mut total = 0;
    while total < DRAIN_AFTER_EXIT {
        match read_now(&pipe, buf) {
            Ok(0) | Err(_) => break, // EOF, EAGAIN (nothing left right now) or a read error
            Ok(n) => {
                total += n;
                sink.send(|| data_event(which, &buf[..n])).await;
            }
        }
    }
}

/// One read(2) on the non-blocking pipe. Not `Receiver::try_read`: that answers WouldBlock
/// from tokio's cached readiness, which may not have caught up with data already written.
fn read_now(pipe: &pipe::Receiver, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: reading into a live, exclusively borrowed buffer of `buf.len()` bytes from a
    // descriptor the Receiver keeps open (tokio put it in non-blocking mode).
    let n = unsafe { libc::read(pipe.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Reports one process until its end. Runs as its own task; returns when the process has
/// exited and its end (or the client's absence) is settled.
pub async fn report(
    run: Running,
    procs: Arc<Processes>,
    tx: mpsc::Sender<Bytes>,
    keepalive: Duration,
) {
    let Running {
        pid,
        stdout,
        stderr,
        mut exit,
    } = run;
    let mut sink = Sink {
        tx,
        connected: true,
    };
    sink.send(|| event(Event::Start(StartEvent { pid }))).await;

    let (mut stdout, mut stderr) = (Some(stdout), Some(stderr));
    let (mut out_buf, mut err_buf) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let mut ticker = tokio::time::interval_at(Instant::now() + keepalive, keepalive);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);

    let status = loop {
        // Unbiased, so a process flooding one stream cannot starve the other. Output still
        // in the pipes when the exit wins is sent by `drain` below, before the end.
        tokio::select! {
            read = read_open(&mut stdout, &mut out_buf) => match read {
                Ok(n) if n > 0 => sink.send(|| data_event(Output::Stdout, &out_buf[..n])).await,
                _ => stdout = None,
            },
            read = read_open(&mut stderr, &mut err_buf) => match read {
                Ok(n) if n > 0 => sink.send(|| data_event(Output::Stderr, &err_buf[..n])).await,
                _ => stderr = None,
            },
            status = &mut exit => break status.ok(),
            _ = ticker.tick() => sink.send(|| event(Event::Keepalive(Keepalive {}))).await,
        }
    };
    drain(&mut sink, Output::Stdout, stdout, &mut out_buf).await;
    drain(&mut sink, Output::Stderr, stderr, &mut err_buf).await;
    procs.finished(pid);

    sink.send(|| event(Event::End(end_event(status)))).await;
    sink.send(|| end_of_stream(None)).await;
}

fn end_event(status: Option<ExitKind>) -> EndEvent {
    match status {
        Some(ExitKind::Exited(code)) => EndEvent {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error: None,
        },
        Some(ExitKind::Signaled(sig)) => EndEvent {
            exit_code: -1,
            exited: false,
            status: sandcell_proto::agent::signal_status(sig),
            error: None,
        },
        None => EndEvent {
            exit_code: -1,
            exited: false,
            status: "unknown".to_owned(),
            error: Some("the exit status of the process was lost".to_owned()),
        },
    }
}
