//! Handlers of envd's `process.Process` service.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use http_body_util::BodyExt;
use hyper::Request;
use hyper::body::Incoming;
use sandcell_proto::agent::process::{
    CloseStdinRequest, ConnectRequest, ListResponse, ProcessInput, SendInputRequest,
    SendSignalRequest, StartRequest, StreamInputRequest, UpdateRequest,
};
use sandcell_proto::agent::{CONNECT_JSON, envelope};
use tokio::sync::mpsc;

use crate::body::{self, ChannelBody};
use crate::connect::{
    self, ApiError, Reply, content_type_is, empty_reply, end_of_stream, envelope_of, json_reply,
    stream_error, stream_reply,
};
use crate::hub::Subscription;
use crate::process::{Entry, Launch, ProcessError, StartError, check_nul};
use crate::server::State;
use crate::stream;

/// Envelopes queued per stream before its forwarder waits for the client.
const STREAM_QUEUE: usize = 8;

impl From<ProcessError> for ApiError {
    fn from(e: ProcessError) -> Self {
        ApiError::new(e.code(), e.to_string())
    }
}

impl From<StartError> for ApiError {
    fn from(e: StartError) -> Self {
        ApiError::new(e.code(), e.to_string())
    }
}

pub async fn start(state: &State, req: Request<Incoming>) -> Reply {
    let user = state.shared.rpc_user(&req);
    let timeout = connect::timeout_of(&req);
    let keepalive = connect::keepalive_of(&req).unwrap_or(state.config.keepalive);
    let start_req: StartRequest =
        connect::stream_request(req, state.config.max_json_body, "StartRequest").await?;
    let launched = (|| {
        let user = user?;
        let timeout = timeout?;
        check_nul(&start_req)?;
        let cwd = state
            .shared
            .resolve(start_req.process.cwd.as_deref().unwrap_or(""), &user)
            .map_err(ApiError::invalid)?;
        let default_env = state.shared.defaults().env();
        let running = state.procs.start(Launch {
            req: &start_req,
            user: &user,
            default_env,
            cwd,
            timeout,
        })?;
        Ok::<_, ApiError>(running)
    })();
    match launched {
        Ok(running) => {
            // Subscribe before the pump runs, so the Start caller sees all of the output.
            let sub = running.entry.hub.subscribe();
            let pid = running.entry.pid;
            tokio::spawn(stream::pump(running, state.procs.clone()));
            let (tx, rx) = mpsc::channel(STREAM_QUEUE);
            tokio::spawn(stream::forward(pid, sub, tx, keepalive));
            stream_reply(ChannelBody::new(rx).boxed_unsync())
        }
        Err(e) => stream_error(e),
    }
}

pub async fn connect(state: &State, req: Request<Incoming>) -> Reply {
    let keepalive = connect::keepalive_of(&req).unwrap_or(state.config.keepalive);
    let connect_req: ConnectRequest =
        connect::stream_request(req, state.config.max_json_body, "ConnectRequest").await?;
    let (pid, sub) = match state.procs.lookup(&connect_req.process) {
        Ok(entry) => (entry.pid, entry.hub.subscribe()),
        Err(e) => match state.procs.retained_end(&connect_req.process) {
            Some((pid, end)) => (pid, Subscription::Ended(end)),
            None => return stream_error(e.into()),
        },
    };
    let (tx, rx) = mpsc::channel(STREAM_QUEUE);
    tokio::spawn(stream::forward(pid, sub, tx, keepalive));
    stream_reply(ChannelBody::new(rx).boxed_unsync())
}

pub async fn list(state: &State, req: Request<Incoming>) -> Reply {
    let _: serde_json::Value =
        connect::unary(req, state.config.max_json_body, "ListRequest").await?;
    json_reply(&ListResponse {
        processes: state.procs.list(),
    })
}

pub async fn update(state: &State, req: Request<Incoming>) -> Reply {
    let update: UpdateRequest =
        connect::unary(req, state.config.max_json_body, "UpdateRequest").await?;
    let entry = state.procs.lookup(&update.process)?;
    if let Some(size) = update.pty.and_then(|p| p.size) {
        entry.resize(size.cols, size.rows)?;
    }
    empty_reply()
}

async fn write_input(entry: &Entry, input: &ProcessInput) -> Result<(), ApiError> {
    let decode = |b64: &str, field: &str| {
        BASE64
            .decode(b64.as_bytes())
            .map_err(|_| ApiError::invalid(format!("input.{field} is not base64")))
    };
    match (&input.stdin, &input.pty) {
        (Some(stdin), _) => entry.write_stdin(&decode(stdin, "stdin")?).await?,
        (None, Some(pty)) => entry.write_pty(&decode(pty, "pty")?).await?,
        (None, None) => {
            return Err(ApiError::new(
                "unimplemented",
                "the input names neither stdin nor pty",
            ));
        }
    }
    Ok(())
}

pub async fn send_input(state: &State, req: Request<Incoming>) -> Reply {
    let input: SendInputRequest =
        connect::unary(req, state.config.max_json_body, "SendInputRequest").await?;
    let entry = state.procs.lookup(&input.process)?;
    write_input(&entry, &input.input).await?;
    empty_reply()
}

/// Client streaming: envelopes of `start{process}`, `data{input}`, `keepalive`, applied in
/// order as they arrive; the answer (one `{}` message, or the error) comes when the client
/// ends its stream.
pub async fn stream_input(state: &State, req: Request<Incoming>) -> Reply {
    if !content_type_is(&req, CONNECT_JSON) {
        return Err(ApiError::unsupported_media_type(format!(
            "StreamInput takes {CONNECT_JSON}"
        )));
    }
    match apply_input_stream(state, req.into_body()).await {
        Ok(()) => {
            let mut reply = envelope_of(0, &serde_json::json!({})).to_vec();
            reply.extend_from_slice(&end_of_stream(None));
            stream_reply(body::full(reply))
        }
        Err(e) => stream_error(e),
    }
}

async fn apply_input_stream(state: &State, mut body: Incoming) -> Result<(), ApiError> {
    let mut decoder = envelope::Decoder::new(state.config.max_json_body);
    let mut target: Option<std::sync::Arc<Entry>> = None;
    loop {
        while let Some(env) = decoder
            .next()
            .map_err(|e| ApiError::invalid(e.to_string()))?
        {
            if env.is_end() {
                return Ok(());
            }
            let msg: StreamInputRequest = connect::parse_json(&env.message, "StreamInputRequest")?;
            if let Some(start) = msg.start {
                target = Some(state.procs.lookup(&start.process)?);
            } else if let Some(data) = msg.data {
                let entry = target.as_ref().ok_or_else(|| {
                    ApiError::new("failed_precondition", "StreamInput data before its start")
                })?;
                write_input(entry, &data.input).await?;
            }
            // keepalive: nothing to do
        }
        match body.frame().await {
            None => {
                return if decoder.pending() == 0 {
                    Ok(())
                } else {
                    Err(ApiError::invalid(
                        "the StreamInput stream ends mid-envelope",
                    ))
                };
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    decoder.push(&data);
                }
            }
            Some(Err(e)) => {
                return Err(ApiError::new(
                    "unknown",
                    format!("error streaming input: {e}"),
                ));
            }
        }
    }
}

pub async fn close_stdin(state: &State, req: Request<Incoming>) -> Reply {
    let close: CloseStdinRequest =
        connect::unary(req, state.config.max_json_body, "CloseStdinRequest").await?;
    state.procs.lookup(&close.process)?.close_stdin().await?;
    empty_reply()
}

pub async fn send_signal(state: &State, req: Request<Incoming>) -> Reply {
    let sig: SendSignalRequest =
        connect::unary(req, state.config.max_json_body, "SendSignalRequest").await?;
    let signo = parse_signal(&sig.signal)
        .ok_or_else(|| ApiError::invalid(format!("invalid signal: {}", sig.signal)))?;
    state.procs.signal(&sig.process, signo)?;
    empty_reply()
}

/// envd's enum (`SIGNAL_SIGTERM`, `SIGNAL_SIGKILL`) by name or number; also, as extensions
/// our CLI uses, SIGINT/SIGHUP by name and any signal by number.
fn parse_signal(value: &serde_json::Value) -> Option<i32> {
    let valid = |n: i64| i32::try_from(n).ok().filter(|n| (1..=64).contains(n));
    match value {
        serde_json::Value::Number(n) => n.as_i64().and_then(valid),
        serde_json::Value::String(s) => {
            sandcell_proto::agent::signal_from_enum(s).or_else(|| s.parse().ok().and_then(valid))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_signal;
    use serde_json::json;

    #[test]
    fn signals_by_name_and_number() {
        assert_eq!(parse_signal(&json!("SIGNAL_SIGKILL")), Some(9));
        assert_eq!(parse_signal(&json!(15)), Some(15));
        assert_eq!(parse_signal(&json!("2")), Some(2));
        assert_eq!(parse_signal(&json!("SIGNAL_UNSPECIFIED")), None);
        assert_eq!(parse_signal(&json!(0)), None);
        assert_eq!(parse_signal(&json!(null)), None);
    }
}
