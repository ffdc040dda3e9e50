//! Request extractors: [`Caller`] (the API key, from `X-API-KEY` or `Authorization: Bearer`)
//! and [`ApiJson`] / [`OptionalJson`] (bodies whose errors are E2B-shaped 400s).

use crate::App;
use crate::http::error::ApiError;
use crate::keys::{hash_key, looks_like_key};
use crate::store::KeyRow;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use std::sync::Arc;

/// Largest JSON request body of the control API (the router applies it).
pub const MAX_JSON_BODY: usize = 1024 * 1024;

/// The key a request authenticated with.
#[derive(Debug, Clone)]
pub struct Caller(pub KeyRow);

impl FromRequestParts<Arc<App>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<App>) -> Result<Self, ApiError> {
        let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        let Some(key) = sandcell_proto::auth::api_key(header) else {
            return Err(ApiError::unauthorized(
                "missing API key: send it in the X-API-KEY header",
            ));
        };
        if !looks_like_key(key) {
            return Err(ApiError::unauthorized("invalid API key format"));
        }
        match app.db.active_key_by_hash(&hash_key(key)).await? {
            Some(row) => Ok(Caller(row)),
            None => Err(ApiError::unauthorized("invalid API key")),
        }
    }
}

async fn body_bytes(req: Request, app: &Arc<App>) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, app)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the request body: {}", e.body_text())))
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

/// A required JSON body; malformed JSON or fields give 400 `{"code":400,"message":...}`.
/// The content type is not checked (E2B's SDKs always send JSON).
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<App>> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &Arc<App>) -> Result<Self, ApiError> {
        let bytes = body_bytes(req, app).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_request("a JSON request body is required"));
        }
        parse(&bytes).map(ApiJson)
    }
}

/// A JSON body that may be absent (empty): then `T::default()`.
pub struct OptionalJson<T>(pub T);

impl<T: DeserializeOwned + Default> FromRequest<Arc<App>> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &Arc<App>) -> Result<Self, ApiError> {
        let bytes = body_bytes(req, app).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptionalJson(T::default()));
        }
        parse(&bytes).map(OptionalJson)
    }
}
