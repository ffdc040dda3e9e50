//! What can go wrong talking to envd, and how an error answer is read.
//!
//! envd answers errors two ways: Connect RPCs with `{"code": "not_found", "message"}`, its
//! REST routes (`/files`, `/init`) with `{"code": 404, "message"}`. [`ClientError::Status`]
//! keeps the code as the answer spelled it; [`ClientError::code`] names it the Connect way
//! either way.

use std::io;

use sandcell_proto::agent::{ConnectError, EndOfStream, RestError};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to the agent: {0}")]
    Connect(#[source] io::Error),
    #[error("building the request for {uri}: {reason}")]
    Request { uri: String, reason: String },
    #[error("HTTP exchange with the agent ({what}): {source}")]
    Http { what: String, source: hyper::Error },
    /// The connection failed while an answer was streaming in.
    #[error("reading the agent's answer to {what}: {source}")]
    Body { what: String, source: hyper::Error },
    /// An error status. `code` is the answer's own: a Connect code (`not_found`), envd's
    /// REST one (`404`), or empty when the body was not JSON (`message` is then its text).
    #[error("the agent answered HTTP {status} to {what}: {}: {message}", connect_code(*status, code))]
    Status {
        what: String,
        status: u16,
        code: String,
        message: String,
    },
    #[error("the agent reported an error in {what}: {code}: {message}")]
    Rpc {
        what: String,
        code: String,
        message: String,
    },
    #[error("malformed reply from the agent to {what}: {reason}")]
    Protocol { what: String, reason: String },
    #[error("{what}: output exceeds the {max}-byte limit")]
    TooLarge { what: String, max: usize },
    /// A client stream (`StreamInput`) ended before its sender did.
    #[error("{what} ended early: {reason}")]
    Ended { what: String, reason: String },
}

impl ClientError {
    /// The Connect error code, when the agent sent one (a REST status is named the way
    /// Connect names it: 404 is `not_found`).
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Status { status, code, .. } => Some(connect_code(*status, code)),
            ClientError::Rpc { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The HTTP status, when the agent answered with an error status.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    pub(crate) fn protocol(what: &str, reason: impl ToString) -> Self {
        ClientError::Protocol {
            what: what.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// The Connect name of an answer's code: itself, or for a REST code (or none) the name of
/// the HTTP status.
fn connect_code(status: u16, code: &str) -> &str {
    if code.is_empty() {
        "unknown"
    } else if code.bytes().all(|b| b.is_ascii_digit()) {
        code_of_status(status)
    } else {
        code
    }
}

/// The Connect code for an HTTP status (the inverse of connect-go's mapping).
fn code_of_status(status: u16) -> &'static str {
    match status {
        400 => "invalid_argument",
        401 => "unauthenticated",
        403 => "permission_denied",
        404 => "not_found",
        409 => "already_exists",
        429 | 507 => "resource_exhausted",
        501 => "unimplemented",
        503 => "unavailable",
        504 => "deadline_exceeded",
        _ => "internal",
    }
}

/// An error answer: a Connect error, a REST one, an end-of-stream message carrying an
/// error (a client stream's answer), else the raw text.
pub(crate) fn error_of_reply(what: &str, status: u16, body: &[u8]) -> ClientError {
    let (code, message) = if let Ok(e) = serde_json::from_slice::<ConnectError>(body) {
        (e.code, e.message)
    } else if let Ok(e) = serde_json::from_slice::<RestError>(body) {
        (e.code.to_string(), e.message)
    } else if let Ok(e) = serde_json::from_slice::<EndOfStream>(body)
        && let Some(e) = e.error
    {
        (e.code, e.message)
    } else {
        (String::new(), String::from_utf8_lossy(body).into_owned())
    };
    ClientError::Status {
        what: what.to_owned(),
        status,
        code,
        message,
    }
}

/// The error an end-of-stream message carries, if any.
pub(crate) fn end_of_stream(what: &str, message: &[u8]) -> Result<(), ClientError> {
    match serde_json::from_slice::<EndOfStream>(message) {
        Ok(EndOfStream { error: None }) => Ok(()),
        Ok(EndOfStream { error: Some(e) }) => Err(ClientError::Rpc {
            what: what.to_owned(),
            code: e.code,
            message: e.message,
        }),
        Err(e) => Err(ClientError::protocol(what, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envd_errors_keep_code_and_message() {
        let e = error_of_reply(
            "Stat",
            404,
            br#"{"code":"not_found","message":"no such file"}"#,
        );
        assert!(
            matches!(&e, ClientError::Status { code, message, .. } if code == "not_found" && message == "no such file")
        );
        let e = error_of_reply("GET /files", 401, br#"{"code":401,"message":"bad user"}"#);
        assert!(matches!(&e, ClientError::Status { code, .. } if code == "401"));
        let e = error_of_reply("x", 502, b"plain");
        assert!(matches!(&e, ClientError::Status { message, .. } if message == "plain"));
    }

    #[test]
    fn codes_are_named_the_connect_way() {
        let rest = error_of_reply("GET /files", 404, br#"{"code":404,"message":"gone"}"#);
        assert_eq!(rest.code(), Some("not_found"));
        assert_eq!(rest.status(), Some(404));
        let connect = error_of_reply("Start", 400, br#"{"code":"invalid_argument","message":""}"#);
        assert_eq!(connect.code(), Some("invalid_argument"));
        let raw = error_of_reply("health", 502, b"Bad Gateway");
        assert_eq!(raw.code(), Some("unknown"));
        assert!(raw.to_string().contains("unknown: Bad Gateway"), "{raw}");
        let stream = error_of_reply(
            "StreamInput",
            404,
            br#"{"error":{"code":"not_found","message":"process 7"}}"#,
        );
        assert_eq!(stream.code(), Some("not_found"));
    }
}
