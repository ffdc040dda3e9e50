//! A span per request: every log line written while a request is handled (routes and the
//! envd proxy alike) carries its `request` id, method and path, so the lines of one request
//! can be found among those of the others. The query string is left out (it can hold
//! signatures and tokens). The answer's status and time are logged at debug level.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use std::time::Instant;
use tracing::Instrument;

/// The id of the request being handled, in its extensions: the span's `request` field and
/// the `x-request-id` of the answer ([`super::error::request_id`]) are the same id.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Gives the request its id and runs the rest of the stack inside the request's span.
pub async fn span(mut req: Request, next: Next) -> Response {
    // Not a secret: 16 hex digits tell the requests of one log apart; no id (getrandom
    // failing) is no reason to refuse a request.
    let id = sandcell_proto::random::hex(8).unwrap_or_else(|_| "-".into());
    req.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!(
        "request",
        request = %id,
        method = %req.method(),
        path = %req.uri().path()
    );
    let began = Instant::now();
    async move {
        let response = next.run(req).await;
        tracing::debug!(
            status = response.status().as_u16(),
            ms = began.elapsed().as_millis() as u64,
            "answered"
        );
        response
    }
    .instrument(span)
    .await
}
