//! A span per request: every log line written while a request is handled (routes and the
//! envd proxy alike) carries its `request` id, method and path, so the lines of one request
//! can be found among those of the others. The query string is left out (it can hold
//! signatures and tokens). The answer's status and time are logged at debug level.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use std::time::Instant;
use tracing::Instrument;

/// Runs the rest of the stack inside the request's span.
pub async fn span(req: Request, next: Next) -> Response {
    // 8 hex digits are enough to tell apart the requests of one log; no id is no reason
    // to refuse a request.
    let id = sandcell_proto::random::hex(4).unwrap_or_else(|_| "-".into());
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
