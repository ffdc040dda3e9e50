//! Processes: Start (its event stream), input (unary or one `StreamInput` call), stdin's
//! end, signals and PTY size.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::Method;
use hyper::body::{Frame, Incoming};
use sandcell_proto::agent::process::{
    self as proc, ProcessInput, ProcessSelector, Pty, PtySize, StreamInputData, StreamInputRequest,
    StreamInputStart, UpdateRequest,
};
use sandcell_proto::agent::{self as wire, DataEvent, EndEvent, Event, ProcessEvent, envelope};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::client::{EnvdClient, read_capped};
use crate::connect::Connector;
use crate::error::{ClientError, end_of_stream};

/// Input chunks queued for an [`InputStream`] before `send` waits.
const INPUT_QUEUE: usize = 16;

impl<C: Connector> EnvdClient<C> {
    /// Starts a process and returns its event stream. `start` is the agent's
    /// [`wire::StartRequest`] or envd's whole [`proc::StartRequest`] (with a PTY). A failure
    /// to start (say, no such command) comes out of the stream as [`ClientError::Rpc`].
    pub async fn start<S: serde::Serialize>(
        &self,
        start: &S,
    ) -> Result<ProcessStream, ClientError> {
        let json = serde_json::to_vec(start).map_err(|e| ClientError::protocol("Start", e))?;
        let body = Full::new(Bytes::from(envelope::encode(0, &json)));
        let req = self.request(
            Method::POST,
            wire::START_PATH,
            Some(wire::CONNECT_JSON),
            body,
        )?;
        let resp = self.call("Start", req).await?;
        Ok(ProcessStream {
            body: resp.into_body(),
            events: EventReader::new(self.max_envelope),
        })
    }

    /// Writes `data` to the stdin of process `pid`.
    pub async fn send_input(&self, pid: u32, data: &[u8]) -> Result<(), ClientError> {
        self.input(pid, input_of(data, false)).await
    }

    /// Writes `data` to the terminal of process `pid` (started with a PTY).
    pub async fn send_pty_input(&self, pid: u32, data: &[u8]) -> Result<(), ClientError> {
        self.input(pid, input_of(data, true)).await
    }

    async fn input(&self, pid: u32, input: ProcessInput) -> Result<(), ClientError> {
        let message = proc::SendInputRequest {
            process: ProcessSelector::pid(pid),
            input,
        };
        self.unary("SendInput", wire::SEND_INPUT_PATH, &message)
            .await
            .map(drop)
    }

    /// Opens a `StreamInput` call to process `pid`: one request whose body carries every
    /// input chunk as it is sent (to the terminal when `pty`).
    pub fn stream_input(&self, pid: u32, pty: bool) -> Result<InputStream, ClientError> {
        let (tx, mut rx) = mpsc::channel::<Bytes>(INPUT_QUEUE);
        let first = StreamInputRequest {
            start: Some(StreamInputStart {
                process: ProcessSelector::pid(pid),
            }),
            ..Default::default()
        };
        let first =
            serde_json::to_vec(&first).map_err(|e| ClientError::protocol("StreamInput", e))?;
        // The channel is empty and ours: this cannot fail.
        let _ = tx.try_send(Bytes::from(envelope::encode(0, &first)));
        // The body ends when the sender is dropped; a full channel is the backpressure.
        let chunks = futures_util::stream::poll_fn(move |cx| {
            rx.poll_recv(cx)
                .map(|chunk| chunk.map(|bytes| Ok::<_, std::io::Error>(Frame::data(bytes))))
        });
        let req = self.request(
            Method::POST,
            proc::STREAM_INPUT_PATH,
            Some(wire::CONNECT_JSON),
            StreamBody::new(chunks),
        )?;
        let envd = self.clone();
        let call = tokio::spawn(async move {
            let resp = envd.call("StreamInput", req).await?;
            let body = read_capped("StreamInput", resp.into_body(), envd.max_reply).await?;
            stream_reply_error("StreamInput", &body, envd.max_reply)
        });
        Ok(InputStream {
            tx: Some(tx),
            call,
            pty,
        })
    }

    pub async fn close_stdin(&self, pid: u32) -> Result<(), ClientError> {
        let message = proc::CloseStdinRequest {
            process: ProcessSelector::pid(pid),
        };
        self.unary("CloseStdin", wire::CLOSE_STDIN_PATH, &message)
            .await
            .map(drop)
    }

    /// Signals the process group of `pid`. Signals envd knows go by its enum name; others
    /// by number (which only our agent understands).
    pub async fn send_signal(&self, pid: u32, signal: i32) -> Result<(), ClientError> {
        let name = match signal {
            1 => serde_json::json!("SIGNAL_SIGHUP"),
            2 => serde_json::json!("SIGNAL_SIGINT"),
            9 => serde_json::json!("SIGNAL_SIGKILL"),
            15 => serde_json::json!("SIGNAL_SIGTERM"),
            n => serde_json::json!(n),
        };
        let message = proc::SendSignalRequest {
            process: ProcessSelector::pid(pid),
            signal: name,
        };
        self.unary("SendSignal", wire::SEND_SIGNAL_PATH, &message)
            .await
            .map(drop)
    }

    /// Resizes the PTY of process `pid`.
    pub async fn resize(&self, pid: u32, cols: u16, rows: u16) -> Result<(), ClientError> {
        let message = UpdateRequest {
            process: ProcessSelector::pid(pid),
            pty: Some(Pty {
                size: Some(PtySize {
                    cols: cols.into(),
                    rows: rows.into(),
                }),
            }),
        };
        self.unary("Update", proc::UPDATE_PATH, &message)
            .await
            .map(drop)
    }
}

fn input_of(data: &[u8], pty: bool) -> ProcessInput {
    let b64 = BASE64.encode(data);
    if pty {
        ProcessInput {
            stdin: None,
            pty: Some(b64),
        }
    } else {
        ProcessInput {
            stdin: Some(b64),
            pty: None,
        }
    }
}

/// The error in the end-of-stream message of a Connect stream answer, if any.
fn stream_reply_error(what: &str, body: &[u8], max: usize) -> Result<(), ClientError> {
    let mut decoder = envelope::Decoder::new(max);
    decoder.push(body);
    while let Some(env) = decoder.next().map_err(|e| ClientError::protocol(what, e))? {
        if env.is_end() {
            return end_of_stream(what, &env.message);
        }
    }
    Ok(())
}

/// Which output a data event carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    Stdout,
    Stderr,
    Pty,
}

/// The bytes of a data event.
pub fn decode_data(data: &DataEvent) -> Result<(OutputKind, Vec<u8>), ClientError> {
    let (kind, b64) = match (&data.stdout, &data.stderr, &data.pty) {
        (Some(s), None, None) => (OutputKind::Stdout, s),
        (None, Some(s), None) => (OutputKind::Stderr, s),
        (None, None, Some(s)) => (OutputKind::Pty, s),
        _ => {
            return Err(ClientError::protocol(
                "Start",
                "a data event must carry exactly one output",
            ));
        }
    };
    let bytes = BASE64
        .decode(b64.as_bytes())
        .map_err(|e| ClientError::protocol("Start", e))?;
    Ok((kind, bytes))
}

/// The envelopes of a Start answer turned into events, apart from the body that brings
/// them (so the rules below are testable without a connection).
///
/// The stream is fused: once it has ended (end-of-stream) or failed, it yields nothing
/// more, even if the buffer holds further envelopes: nothing may follow end-of-stream, and
/// after a malformed message the framing cannot be trusted.
#[derive(Debug)]
struct EventReader {
    decoder: envelope::Decoder,
    done: bool,
}

/// What [`EventReader::next`] has.
#[derive(Debug)]
enum Step {
    /// An event, an error, or (`None`) the end.
    Ready(Option<Result<ProcessEvent, ClientError>>),
    /// Nothing buffered yet: push more bytes.
    NeedMore,
}

impl EventReader {
    fn new(max_envelope: usize) -> Self {
        EventReader {
            decoder: envelope::Decoder::new(max_envelope),
            done: false,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if !self.done {
            self.decoder.push(bytes);
        }
    }

    fn next(&mut self) -> Step {
        if self.done {
            return Step::Ready(None);
        }
        match self.decoder.next() {
            Err(e) => Step::Ready(Some(Err(self.fail(ClientError::protocol("Start", e))))),
            Ok(Some(env)) if env.is_end() => {
                self.done = true;
                Step::Ready(end_of_stream("Start", &env.message).err().map(Err))
            }
            Ok(Some(env)) => Step::Ready(Some(
                serde_json::from_slice(&env.message)
                    .map_err(|e| self.fail(ClientError::protocol("Start", e))),
            )),
            Ok(None) => Step::NeedMore,
        }
    }

    fn fail(&mut self, e: ClientError) -> ClientError {
        self.done = true;
        e
    }
}

/// The events of one process, as they come.
#[derive(Debug)]
pub struct ProcessStream {
    body: Incoming,
    events: EventReader,
}

/// Everything a process printed, and how it ended.
#[derive(Debug, Clone)]
pub struct ProcessOutput {
    pub pid: Option<u32>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub end: EndEvent,
}

impl ProcessStream {
    /// The next event; `None` once the stream ended cleanly, and after any error. An error
    /// in the end-of-stream message comes out as [`ClientError::Rpc`].
    pub async fn next(&mut self) -> Option<Result<ProcessEvent, ClientError>> {
        loop {
            if let Step::Ready(item) = self.events.next() {
                return item;
            }
            match self.body.frame().await {
                None => {
                    let e = ClientError::protocol("Start", "stream ended without end-of-stream");
                    return Some(Err(self.events.fail(e)));
                }
                Some(Err(source)) => {
                    let e = ClientError::Body {
                        what: "Start".to_owned(),
                        source,
                    };
                    return Some(Err(self.events.fail(e)));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.events.push(&data);
                    }
                }
            }
        }
    }

    /// Reads the stream to its end, keeping at most `max_output` bytes of stdout + stderr.
    pub async fn collect(mut self, max_output: usize) -> Result<ProcessOutput, ClientError> {
        let (mut pid, mut stdout, mut stderr, mut end) = (None, Vec::new(), Vec::new(), None);
        while let Some(event) = self.next().await {
            match event?.event {
                Event::Start(s) => pid = Some(s.pid),
                Event::Data(d) => {
                    let (kind, bytes) = decode_data(&d)?;
                    if stdout.len() + stderr.len() + bytes.len() > max_output {
                        return Err(ClientError::TooLarge {
                            what: "process output".to_owned(),
                            max: max_output,
                        });
                    }
                    match kind {
                        OutputKind::Stderr => stderr.extend_from_slice(&bytes),
                        OutputKind::Stdout | OutputKind::Pty => stdout.extend_from_slice(&bytes),
                    }
                }
                Event::End(e) => end = Some(e),
                Event::Keepalive(_) => {}
            }
        }
        let end = end.ok_or_else(|| {
            ClientError::protocol("Start", "the stream closed without an end event")
        })?;
        Ok(ProcessOutput {
            pid,
            stdout,
            stderr,
            end,
        })
    }
}

/// Input to one process, in order, over one `StreamInput` call.
#[derive(Debug)]
pub struct InputStream {
    tx: Option<mpsc::Sender<Bytes>>,
    call: JoinHandle<Result<(), ClientError>>,
    pty: bool,
}

impl InputStream {
    /// Queues `data`; waits while the other end is behind.
    pub async fn send(&mut self, data: &[u8]) -> Result<(), ClientError> {
        let message = StreamInputRequest {
            data: Some(StreamInputData {
                input: input_of(data, self.pty),
            }),
            ..Default::default()
        };
        let json =
            serde_json::to_vec(&message).map_err(|e| ClientError::protocol("StreamInput", e))?;
        let sent = match &self.tx {
            Some(tx) => tx
                .send(Bytes::from(envelope::encode(0, &json)))
                .await
                .is_ok(),
            None => false,
        };
        if sent {
            return Ok(());
        }
        // The call ended early: its error says why.
        self.tx = None;
        Err(self
            .finish_call()
            .await
            .err()
            .unwrap_or_else(|| ClientError::Ended {
                what: "StreamInput".to_owned(),
                reason: "the other end ended the input stream".to_owned(),
            }))
    }

    /// Ends the stream and waits for the answer (everything sent was delivered).
    pub async fn finish(mut self) -> Result<(), ClientError> {
        self.tx = None;
        self.finish_call().await
    }

    async fn finish_call(&mut self) -> Result<(), ClientError> {
        match (&mut self.call).await {
            Ok(result) => result,
            Err(e) => Err(ClientError::Ended {
                what: "StreamInput".to_owned(),
                reason: e.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(json: &str) -> Vec<u8> {
        envelope::encode(0, json.as_bytes())
    }

    fn end(json: &str) -> Vec<u8> {
        envelope::encode(envelope::FLAG_END_STREAM, json.as_bytes())
    }

    const START: &str = r#"{"event":{"start":{"pid":7}}}"#;

    #[test]
    fn events_come_until_the_end_of_stream_and_nothing_after() {
        let mut r = EventReader::new(1 << 20);
        assert!(matches!(r.next(), Step::NeedMore));
        let mut wire = event(START);
        wire.extend(end("{}"));
        wire.extend(event(START));
        // Split mid-envelope: the first call needs the rest.
        r.push(&wire[..3]);
        assert!(matches!(r.next(), Step::NeedMore));
        r.push(&wire[3..]);
        assert!(
            matches!(r.next(), Step::Ready(Some(Ok(ProcessEvent { event: Event::Start(s) }))) if s.pid == 7)
        );
        assert!(matches!(r.next(), Step::Ready(None)));
        // An envelope after end-of-stream is never read.
        assert!(matches!(r.next(), Step::Ready(None)));
    }

    #[test]
    fn an_error_at_the_end_comes_out_once() {
        let mut r = EventReader::new(1 << 20);
        r.push(&end(
            r#"{"error":{"code":"not_found","message":"no such command"}}"#,
        ));
        assert!(matches!(
            r.next(),
            Step::Ready(Some(Err(ClientError::Rpc { code, .. }))) if code == "not_found"
        ));
        assert!(matches!(r.next(), Step::Ready(None)));
    }

    #[test]
    fn a_malformed_event_ends_the_stream() {
        let mut r = EventReader::new(1 << 20);
        let mut wire = event("{not json");
        wire.extend(event(START));
        r.push(&wire);
        assert!(matches!(
            r.next(),
            Step::Ready(Some(Err(ClientError::Protocol { .. })))
        ));
        assert!(matches!(r.next(), Step::Ready(None)));
    }

    #[test]
    fn an_oversized_envelope_ends_the_stream() {
        let mut r = EventReader::new(8);
        r.push(&event(START));
        assert!(matches!(r.next(), Step::Ready(Some(Err(_)))));
        assert!(matches!(r.next(), Step::Ready(None)));
    }

    #[test]
    fn stream_reply_errors_come_out() {
        let mut body = envelope::encode(0, b"{}");
        body.extend(envelope::encode(
            envelope::FLAG_END_STREAM,
            br#"{"error":{"code":"not_found","message":"process 7 not found"}}"#,
        ));
        assert!(matches!(
            stream_reply_error("StreamInput", &body, 1 << 16),
            Err(ClientError::Rpc { code, .. }) if code == "not_found"
        ));
        let mut ok = envelope::encode(0, b"{}");
        ok.extend(envelope::encode(envelope::FLAG_END_STREAM, b"{}"));
        assert!(stream_reply_error("StreamInput", &ok, 1 << 16).is_ok());
    }

    #[test]
    fn data_events_need_exactly_one_output() {
        let both = DataEvent {
            stdout: Some("YQ==".into()),
            stderr: Some("Yg==".into()),
            pty: None,
        };
        assert!(decode_data(&both).is_err());
        let one = DataEvent {
            stderr: Some("Yg==".into()),
            ..Default::default()
        };
        assert_eq!(
            decode_data(&one).ok(),
            Some((OutputKind::Stderr, b"b".to_vec()))
        );
    }

    #[test]
    fn input_goes_to_stdin_or_the_terminal() {
        let json = |pty| serde_json::to_string(&input_of(b"a", pty)).unwrap_or_default();
        assert_eq!(json(false), r#"{"stdin":"YQ=="}"#);
        assert_eq!(json(true), r#"{"pty":"YQ=="}"#);
    }
}
