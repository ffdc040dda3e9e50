//! Process output, in two halves:
//!
//! - [`pump`]: one task per process reads its pipes (or PTY master) in chunks of at most
//!   [`CHUNK`] bytes and publishes them to the process's [`Hub`], then its end. It waits for
//!   room in subscribers' queues (backpressure) and discards output nobody subscribes to, so
//!   the process runs on with no client, as under envd.
//! - [`forward`]: one task per `Start`/`Connect` stream turns the subscription into Connect
//!   envelopes (start, data, keepalives, end, end-of-stream) on a bounded channel that feeds
//!   the HTTP body. A client that goes away ends its forwarder only.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use sandcell_proto::agent::{
    ConnectError, DataEvent, EndEvent, Event, Keepalive, ProcessEvent, StartEvent,
};
use tokio::io::AsyncReadExt;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};

use crate::connect::{end_of_stream, envelope_of};
use crate::hub::{Hub, Subscription};
use crate::process::{self, Output, Processes, Running};
use crate::reaper::ExitKind;

/// Largest data chunk per event (before base64); envd reads 32 KiB from pipes.
pub const CHUNK: usize = 32 * 1024;
/// After the process exits, output still in its pipes is sent; this bounds how much, so a
/// background child that inherited the pipes and keeps writing cannot hold the end back.
const DRAIN_AFTER_EXIT: usize = 1024 * 1024;

pub fn event_envelope(event: Event) -> Bytes {
    envelope_of(0, &ProcessEvent { event })
}

#[derive(Clone, Copy)]
enum Which {
    Stdout,
    Stderr,
    Pty,
}

fn data_event(which: Which, bytes: &[u8]) -> Event {
    let encoded = Some(BASE64.encode(bytes));
    Event::Data(match which {
        Which::Stdout => DataEvent {
            stdout: encoded,
            ..Default::default()
        },
        Which::Stderr => DataEvent {
            stderr: encoded,
            ..Default::default()
        },
        Which::Pty => DataEvent {
            pty: encoded,
            ..Default::default()
        },
    })
}

async fn publish(hub: &Hub, which: Which, bytes: &[u8]) {
    if hub.has_subscribers() {
        hub.publish(data_event(which, bytes)).await;
    }
}

/// Reads from `pipe`, or waits forever once it is closed (so `select!` ignores it).
async fn read_open(pipe: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> std::io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

/// Reads the PTY master; EIO means every holder of the slave is gone (the end of output).
async fn read_pty(
    master: &mut Option<Arc<AsyncFd<OwnedFd>>>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    let Some(fd) = master else {
        return std::future::pending().await;
    };
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|inner| read_now(inner.as_raw_fd(), buf)) {
            Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
            Ok(result) => return result,
            Err(_would_block) => continue,
        }
    }
}

/// One read(2) on a non-blocking descriptor. Not `try_read` on tokio types: those answer
/// WouldBlock from cached readiness, which may lag data already written.
fn read_now(fd: i32, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: reading into a live, exclusively borrowed buffer of `buf.len()` bytes from a
    // descriptor its owner keeps open (in non-blocking mode).
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// Publishes whatever is already readable on `fd`, without waiting for more.
async fn drain(hub: &Hub, which: Which, fd: Option<i32>, buf: &mut [u8]) {
    let Some(fd) = fd else { return };
    let mut total = 0;
    while total < DRAIN_AFTER_EXIT {
        match read_now(fd, buf) {
            Ok(0) | Err(_) => break, // EOF, EAGAIN (nothing left right now), EIO or an error
            Ok(n) => {
                total += n;
                publish(hub, which, &buf[..n]).await;
            }
        }
    }
}

/// Runs one process to its end: output to the hub, the timeout, the exit. Its own task.
pub async fn pump(run: Running, procs: Arc<Processes>) {
    let Running {
        entry,
        output,
        mut exit,
        timeout,
    } = run;
    let hub = entry.hub.clone();
    let (mut stdout, mut stderr, mut master) = match output {
        Output::Pipes { stdout, stderr } => (Some(stdout), Some(stderr), None),
        Output::Pty(m) => (None, None, Some(m)),
    };
    let (mut out_buf, mut err_buf) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    // envd reads 16 KiB from a PTY master.
    let mut pty_buf = vec![0u8; if master.is_some() { 16 * 1024 } else { 0 }];
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut timed_out = false;

    let status = loop {
        // Unbiased, so a process flooding one stream cannot starve the other. Output still
        // buffered when the exit wins is published by `drain` below, before the end.
        tokio::select! {
            read = read_open(&mut stdout, &mut out_buf) => match read {
                Ok(n) if n > 0 => publish(&hub, Which::Stdout, &out_buf[..n]).await,
                _ => stdout = None,
            },
            read = read_open(&mut stderr, &mut err_buf) => match read {
                Ok(n) if n > 0 => publish(&hub, Which::Stderr, &err_buf[..n]).await,
                _ => stderr = None,
            },
            read = read_pty(&mut master, &mut pty_buf) => match read {
                Ok(n) if n > 0 => publish(&hub, Which::Pty, &pty_buf[..n]).await,
                _ => master = None,
            },
            status = &mut exit => break status.ok(),
            () = &mut deadline, if !timed_out => {
                // envd runs the process under the request's deadline and kills it with
                // SIGKILL when it passes.
                timed_out = true;
                let _ = process::signal_group(entry.pid, libc::SIGKILL);
            }
        }
    };
    drain(
        &hub,
        Which::Stdout,
        stdout.as_ref().map(|p| p.as_raw_fd()),
        &mut out_buf,
    )
    .await;
    drain(
        &hub,
        Which::Stderr,
        stderr.as_ref().map(|p| p.as_raw_fd()),
        &mut err_buf,
    )
    .await;
    drain(
        &hub,
        Which::Pty,
        master.as_ref().map(|m| m.as_raw_fd()),
        &mut pty_buf,
    )
    .await;

    let end = end_event(status);
    procs.finished(&entry, &end);
    hub.finish(end).await;
}

/// Streams one subscription as Connect envelopes into `tx`, starting with `start{pid}`.
pub async fn forward(pid: u32, sub: Subscription, tx: mpsc::Sender<Bytes>, keepalive: Duration) {
    if tx
        .send(event_envelope(Event::Start(StartEvent { pid })))
        .await
        .is_err()
    {
        return;
    }
    let mut rx = match sub {
        Subscription::Live(rx) => rx,
        Subscription::Ended(end) => {
            let _ = tx.send(event_envelope(Event::End(end))).await;
            let _ = tx.send(end_of_stream(None)).await;
            return;
        }
    };
    let mut ticker = tokio::time::interval_at(Instant::now() + keepalive, keepalive);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let envelope = tokio::select! {
            ev = rx.recv() => match ev {
                Some(ev @ Event::End(_)) => {
                    let _ = tx.send(event_envelope(ev)).await;
                    let _ = tx.send(end_of_stream(None)).await;
                    return;
                }
                Some(ev) => {
                    ticker.reset();
                    event_envelope(ev)
                }
                None => {
                    // The hub dropped us without an end: only if the pump task died.
                    let _ = tx.send(end_of_stream(Some(ConnectError {
                        code: "unknown".to_owned(),
                        message: "end event channel closed before sending end event".to_owned(),
                    }))).await;
                    return;
                }
            },
            _ = ticker.tick() => event_envelope(Event::Keepalive(Keepalive {})),
        };
        if tx.send(envelope).await.is_err() {
            return; // the client left; dropping `rx` unsubscribes
        }
    }
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
            // envd also copies Go's wait error ("exit status 3", "signal: killed") into
            // `error`; the SDKs only display it, and our CLI prints a set `error`, so the
            // agent leaves it for real failures.
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
