//! E2B's Secrets routes: `GET/POST /secrets`, `GET/POST/DELETE /secrets/{secretID}` (an
//! id or a name), as the stock SDKs' `Secret` classes call them. No answer carries a
//! value. Bodies are parsed by hand, not by serde into a typed struct, so that no error
//! message can echo a value back (serde's type errors quote what they got).

use crate::App;
use crate::http::error::{ApiError, ApiResult, ErrorBody};
use crate::http::extract::{ApiJson, Caller};
use crate::secrets::crypto::SecretValue;
use crate::secrets::service;
use crate::store::secrets::SecretRow;
use crate::util::rfc3339;
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use utoipa::ToSchema;

const MAX_PAGE: i64 = 100;

/// Metadata of a secret; never its value.
#[derive(Debug, Serialize, ToSchema)]
pub struct SecretInfo {
    #[serde(rename = "secretID")]
    pub secret_id: String,
    /// Lower-case, unique per key.
    pub name: String,
    /// The version injected (an update appends one).
    #[serde(rename = "currentVersion")]
    pub current_version: i64,
    pub metadata: BTreeMap<String, String>,
    /// RFC 3339.
    #[serde(rename = "createdAt")]
    pub created_at: String,
    #[serde(rename = "updatedAt")]
    pub updated_at: String,
}

/// `POST /secrets`'s body (documentation only: parsed by hand, see the module's note).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct NewSecret {
    /// 1 to 128 of `[A-Za-z0-9_-]`, stored lower-case; `sec_` is reserved.
    name: String,
    /// Write-only: 1 to 16384 bytes, no CR, LF or NUL.
    value: String,
    /// At most 32 entries; keys up to 128 bytes, values up to 1024, 8192 in all.
    metadata: Option<BTreeMap<String, String>>,
}

/// `POST /secrets/{secretID}`'s body (documentation only).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct SecretUpdate {
    /// The new version's value (write-only).
    value: String,
    /// Replaces the metadata when present.
    metadata: Option<BTreeMap<String, String>>,
}

fn info(row: &SecretRow) -> SecretInfo {
    SecretInfo {
        secret_id: row.id.clone(),
        name: row.name.clone(),
        current_version: row.current_version,
        metadata: service::metadata_of(row),
        created_at: rfc3339(row.created_at),
        updated_at: rfc3339(row.updated_at),
    }
}

fn object(body: Value) -> ApiResult<Map<String, Value>> {
    match body {
        Value::Object(m) => Ok(m),
        _ => Err(ApiError::bad_request(
            "the request body must be a JSON object",
        )),
    }
}

/// `value`, moved out of the body (no copy left in the map); never shown in an error.
fn take_value(body: &mut Map<String, Value>) -> ApiResult<SecretValue> {
    match body.remove("value") {
        Some(Value::String(s)) => Ok(SecretValue::new(s)),
        Some(_) => Err(ApiError::bad_request("\"value\" must be a string")),
        None => Err(ApiError::bad_request("\"value\" is required")),
    }
}

fn take_metadata(body: &mut Map<String, Value>) -> ApiResult<Option<BTreeMap<String, String>>> {
    match body.remove("metadata") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => m
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k, s)),
                _ => Err(ApiError::bad_request(format!(
                    "invalid metadata: the value of {k:?} must be a string"
                ))),
            })
            .collect::<ApiResult<_>>()
            .map(Some),
        Some(_) => Err(ApiError::bad_request(
            "invalid metadata: it must be an object of strings",
        )),
    }
}

/// Creates a secret of the caller's key (version 1).
#[utoipa::path(post, path = "/secrets", tag = "secrets", request_body = NewSecret,
    security(("ApiKeyAuth" = [])),
    responses((status = 201, body = SecretInfo), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 429, body = ErrorBody)))]
pub async fn create_secret(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(body): ApiJson<Value>,
) -> ApiResult<(StatusCode, Json<SecretInfo>)> {
    let mut body = object(body)?;
    let value = take_value(&mut body)?;
    let metadata = take_metadata(&mut body)?.unwrap_or_default();
    let name = match body.get("name") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ApiError::bad_request("\"name\" must be a string")),
        None => return Err(ApiError::bad_request("\"name\" is required")),
    };
    let row = app
        .secrets
        .create(&caller.0.id, &name, &value, metadata)
        .await?;
    Ok((StatusCode::CREATED, Json(info(&row))))
}

/// Appends a version to the caller's secret (by id or name); new metadata if given.
#[utoipa::path(post, path = "/secrets/{secretID}", tag = "secrets", request_body = SecretUpdate,
    security(("ApiKeyAuth" = [])), params(("secretID" = String, Path, description = "id or name")),
    responses((status = 200, body = SecretInfo), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn update_secret(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<Value>,
) -> ApiResult<Json<SecretInfo>> {
    let mut body = object(body)?;
    let value = take_value(&mut body)?;
    let metadata = take_metadata(&mut body)?;
    let row = app
        .secrets
        .update(&caller.0.id, &id, &value, metadata)
        .await?;
    Ok(Json(info(&row)))
}

/// The caller's secret (by id or name), without its value.
#[utoipa::path(get, path = "/secrets/{secretID}", tag = "secrets",
    security(("ApiKeyAuth" = [])), params(("secretID" = String, Path, description = "id or name")),
    responses((status = 200, body = SecretInfo), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn get_secret(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<SecretInfo>> {
    Ok(Json(info(&app.secrets.get(&caller.0.id, &id).await?)))
}

/// Deletes the caller's secret (by id or name) and every version of it.
#[utoipa::path(delete, path = "/secrets/{secretID}", tag = "secrets",
    security(("ApiKeyAuth" = [])), params(("secretID" = String, Path, description = "id or name")),
    responses((status = 204, description = "Deleted"), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn delete_secret(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    app.secrets.delete(&caller.0.id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `limit` (1 to 100, default 100) and the `nextToken` cursor (`created_at:id`, base64url).
fn parse_page(raw: Option<&str>) -> ApiResult<(i64, Option<(i64, String)>)> {
    let (mut limit, mut after) = (MAX_PAGE, None);
    for (k, v) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*k {
            "limit" => {
                limit = v
                    .parse::<i64>()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("invalid limit {v:?}: 1 to {MAX_PAGE}"))
                    })?
            }
            "nextToken" => {
                after = Some(crate::sandboxes::api::parse_page_token(&v)?);
            }
            _ => {}
        }
    }
    Ok((limit, after))
}

/// The caller's secrets, oldest first; the next page's token is in `x-next-token`.
#[utoipa::path(get, path = "/secrets", tag = "secrets", security(("ApiKeyAuth" = [])),
    params(("limit" = Option<u32>, Query, description = "1 to 100 (default 100)"),
        ("nextToken" = Option<String>, Query)),
    responses((status = 200, body = Vec<SecretInfo>,
            headers(("x-next-token" = String, description = "present when more pages follow"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_secrets(
    State(app): State<Arc<App>>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> ApiResult<(HeaderMap, Json<Vec<SecretInfo>>)> {
    let (limit, after) = parse_page(raw.as_deref())?;
    let after = after.as_ref().map(|(t, id)| (*t, id.as_str()));
    let mut rows = app.secrets.list(&caller.0.id, after, limit + 1).await?;
    let mut headers = HeaderMap::new();
    if rows.len() as i64 > limit {
        rows.truncate(limit as usize);
        if let Some(last) = rows.last() {
            let token = crate::sandboxes::api::encode_page_token(last.created_at, &last.id);
            if let Ok(v) = HeaderValue::from_str(&token) {
                headers.insert("x-next-token", v);
            }
        }
    }
    Ok((headers, Json(rows.iter().map(info).collect())))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_value_of_the_wrong_type_is_refused_without_being_echoed() {
        let mut body = object(serde_json::json!({"value": 918273645})).unwrap();
        let e = take_value(&mut body).unwrap_err();
        assert!(!e.message.contains("918273645"), "{}", e.message);
        let mut body = object(serde_json::json!({"value": "s3cr3t"})).unwrap();
        assert_eq!(take_value(&mut body).unwrap().expose(), "s3cr3t");
        assert!(body.get("value").is_none());
    }

    #[test]
    fn pages_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_page(None).unwrap(), (100, None));
        let token = crate::sandboxes::api::encode_page_token(5, "sec_ab");
        let q = format!("limit=2&nextToken={token}");
        assert_eq!(
            parse_page(Some(&q)).unwrap(),
            (2, Some((5, "sec_ab".to_string())))
        );
        for bad in [
            "limit=0",
            "limit=101",
            "limit=x",
            "nextToken=%%%",
            "nextToken=YQ",
        ] {
            assert!(parse_page(Some(bad)).is_err(), "{bad}");
        }
    }
}
