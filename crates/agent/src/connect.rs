//! The Connect protocol's JSON flavour as connect-go serves it, and envd's REST error shape:
//! error answers, unary request parsing, streaming responses, request headers.
//!
//! - Unary: `POST` with `application/json`, answer 200 with the JSON message, or an HTTP
//!   status from [`http_status`] with `{"code": "not_found", "message"}`.
//! - Streams: answer 200 `application/connect+json` with enveloped messages and a final
//!   end-of-stream envelope; errors, even before the first message, go in that envelope.
//! - REST routes (`/files`, `/init`, auth failures): `{"code": 404, "message"}`.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use sandcell_proto::agent::{ConnectError, EndOfStream, RestError, envelope};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::body::{self, BoxBody};

/// The HTTP status connect-go pairs with a Connect code.
pub fn http_status(code: &str) -> StatusCode {
    match code {
        "canceled" => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
        "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
        "not_found" => StatusCode::NOT_FOUND,
        "already_exists" | "aborted" => StatusCode::CONFLICT,
        "permission_denied" => StatusCode::FORBIDDEN,
        "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
        "unimplemented" => StatusCode::NOT_IMPLEMENTED,
        "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
        "unauthenticated" => StatusCode::UNAUTHORIZED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Which body an error answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorStyle {
    Connect,
    Rest,
}

/// An error answer: a Connect code and message with an HTTP status.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub style: ErrorStyle,
}

impl ApiError {
    /// A Connect error with the status connect-go pairs with `code`.
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status: http_status(code),
            code,
            message: message.into(),
            style: ErrorStyle::Connect,
        }
    }

    pub fn with_status(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            style: ErrorStyle::Connect,
        }
    }

    /// envd's REST error: `{"code": <status>, "message"}`.
    pub fn rest(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: "unknown",
            message: message.into(),
            style: ErrorStyle::Rest,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::new("invalid_argument", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        ApiError::with_status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_argument",
            message,
        )
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        ApiError::with_status(StatusCode::PAYLOAD_TOO_LARGE, "resource_exhausted", message)
    }

    pub fn as_connect(&self) -> ConnectError {
        ConnectError {
            code: self.code.to_owned(),
            message: self.message.clone(),
        }
    }

    pub fn into_response(self) -> Response<BoxBody> {
        let json = match self.style {
            ErrorStyle::Connect => serde_json::to_vec(&self.as_connect()),
            ErrorStyle::Rest => serde_json::to_vec(&RestError {
                code: self.status.as_u16(),
                message: self.message,
            }),
        };
        let mut resp = with_content_type(
            Response::new(body::full(json.unwrap_or_default())),
            "application/json",
        );
        *resp.status_mut() = self.status;
        resp
    }
}

pub type Reply = Result<Response<BoxBody>, ApiError>;

pub fn with_content_type(
    mut resp: Response<BoxBody>,
    content_type: &'static str,
) -> Response<BoxBody> {
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

pub fn status_only(status: StatusCode) -> Response<BoxBody> {
    let mut resp = Response::new(body::empty());
    *resp.status_mut() = status;
    resp
}

/// A unary success: the message as JSON.
pub fn json_reply<T: Serialize>(message: &T) -> Reply {
    let json = serde_json::to_vec(message)
        .map_err(|e| ApiError::new("internal", format!("encoding the answer: {e}")))?;
    Ok(with_content_type(
        Response::new(body::full(json)),
        "application/json",
    ))
}

pub fn empty_reply() -> Reply {
    Ok(with_content_type(
        Response::new(body::full(&b"{}"[..])),
        "application/json",
    ))
}

pub fn content_type_is(req: &Request<Incoming>, want: &str) -> bool {
    req.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(want))
}

/// Reads a whole request body of at most `limit` bytes.
pub async fn bounded_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::too_large(format!(
            "request body exceeds {limit} bytes"
        ))),
        Err(e) => Err(ApiError::invalid(format!("reading the request body: {e}"))),
    }
}

pub fn parse_json<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, ApiError> {
    // protojson reads an empty body as the empty message.
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| ApiError::invalid(format!("malformed {what}: {e}")))
}

/// Reads and parses a unary Connect request (`application/json`).
pub async fn unary<T: DeserializeOwned>(
    req: Request<Incoming>,
    limit: usize,
    what: &str,
) -> Result<T, ApiError> {
    if req.headers().contains_key(CONTENT_TYPE) && !content_type_is(&req, "application/json") {
        return Err(ApiError::unsupported_media_type(format!(
            "{what} must be application/json"
        )));
    }
    let bytes = bounded_body(req, limit).await?;
    parse_json(&bytes, what)
}

/// Reads the one request message of a server-streaming call.
pub async fn stream_request<T: DeserializeOwned>(
    req: Request<Incoming>,
    limit: usize,
    what: &str,
) -> Result<T, ApiError> {
    if !content_type_is(&req, sandcell_proto::agent::CONNECT_JSON) {
        return Err(ApiError::unsupported_media_type(format!(
            "{what} takes {}",
            sandcell_proto::agent::CONNECT_JSON
        )));
    }
    let bytes = bounded_body(req, limit + envelope::HEADER_LEN).await?;
    let mut decoder = envelope::Decoder::new(limit);
    decoder.push(&bytes);
    match decoder.next() {
        Ok(Some(env)) => parse_json(&env.message, what),
        Ok(None) => Err(ApiError::invalid(format!(
            "the {what} request envelope is truncated"
        ))),
        Err(e @ envelope::DecodeError::TooLarge { .. }) => Err(ApiError::too_large(e.to_string())),
        Err(e) => Err(ApiError::invalid(e.to_string())),
    }
}

pub fn envelope_of<T: Serialize>(flags: u8, message: &T) -> Bytes {
    // Serializing our own plain structs cannot fail; an empty message would be a bug we'd see.
    let json = serde_json::to_vec(message).unwrap_or_default();
    Bytes::from(envelope::encode(flags, &json))
}

/// The end-of-stream envelope, with an error or without.
pub fn end_of_stream(error: Option<ConnectError>) -> Bytes {
    envelope_of(envelope::FLAG_END_STREAM, &EndOfStream { error })
}

/// A streaming answer whose body is `body`.
pub fn stream_reply(body: BoxBody) -> Reply {
    Ok(with_content_type(
        Response::new(body),
        sandcell_proto::agent::CONNECT_JSON,
    ))
}

/// A stream that fails before its first message: 200 with only the end-of-stream envelope.
pub fn stream_error(err: ApiError) -> Reply {
    stream_reply(body::full(end_of_stream(Some(err.as_connect()))))
}

/// The SDK's `Keepalive-Ping-Interval` header, in seconds (bounded to something sane).
pub fn keepalive_of<B>(req: &Request<B>) -> Option<Duration> {
    let value = req
        .headers()
        .get("keepalive-ping-interval")?
        .to_str()
        .ok()?;
    let secs: u64 = value.trim().parse().ok()?;
    Some(Duration::from_secs(secs.clamp(1, 3600)))
}

/// `Connect-Timeout-Ms`: envd kills a started process when it elapses. `Err` when malformed.
pub fn timeout_of<B>(req: &Request<B>) -> Result<Option<Duration>, ApiError> {
    let Some(value) = req.headers().get("connect-timeout-ms") else {
        return Ok(None);
    };
    let ms: u64 = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| ApiError::invalid("Connect-Timeout-Ms is not a number of milliseconds"))?;
    Ok((ms > 0).then(|| Duration::from_millis(ms)))
}
