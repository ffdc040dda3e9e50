//! E2B's Volumes routes: `GET/POST /volumes`, `GET/DELETE /volumes/{volumeID}` (an id or a
//! name), as the stock SDKs' `Volume` classes call them. Another key's volume is 404.

use crate::App;
use crate::http::error::{ApiResult, ErrorBody};
use crate::http::extract::{ApiJson, Caller};
use crate::store::volumes::VolumeRow;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// A volume as listed.
#[derive(Debug, Serialize, ToSchema)]
pub struct Volume {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
}

/// A volume with the bearer token of its content API.
#[derive(Debug, Serialize, ToSchema)]
pub struct VolumeAndToken {
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    pub name: String,
    pub token: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Sandcell: the key's own bucket the volume lives in (never its credentials).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<super::storage::StorageInfo>,
}

/// `POST /volumes`'s body.
#[derive(Debug, Deserialize, ToSchema)]
pub struct NewVolume {
    /// 1 to 64 of `[A-Za-z0-9_-]`, unique per key.
    pub name: String,
    /// Sandcell: adopt the volume of this id, made on another daemon over the same bucket,
    /// instead of making one (with `token`, its content token).
    #[serde(rename = "volumeID", default)]
    pub volume_id: Option<String>,
    /// Sandcell: the content token of the volume to adopt.
    #[serde(default)]
    pub token: Option<String>,
    /// Sandcell: the key's own S3-compatible bucket for the volume's content, instead of
    /// the operator's ("bring your own bucket"; the credentials are write-only).
    #[serde(default)]
    pub storage: Option<super::storage::StorageSpec>,
}

fn with_token(app: &App, row: &VolumeRow) -> VolumeAndToken {
    VolumeAndToken {
        volume_id: row.id.clone(),
        name: row.name.clone(),
        token: row.token.clone(),
        domain: app.config.domain.clone(),
        storage: row
            .storage
            .as_deref()
            .and_then(super::storage::VolumeStorage::info_of),
    }
}

/// Creates a volume of the caller's key, its content in the operator's bucket or, with
/// `storage`, in the key's own (checked first: 400 naming the bucket's error).
#[utoipa::path(post, path = "/volumes", tag = "volumes", request_body = NewVolume,
    security(("ApiKeyAuth" = [])),
    responses((status = 201, body = VolumeAndToken), (status = 400, body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 501, description = "Volumes are not configured", body = ErrorBody),
        (status = 502, description = "The bucket failed", body = ErrorBody)))]
pub async fn create_volume(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiJson(body): ApiJson<NewVolume>,
) -> ApiResult<(StatusCode, Json<VolumeAndToken>)> {
    let row = match (&body.volume_id, &body.token) {
        (None, None) => {
            app.volumes
                .create(&caller.0.id, &body.name, body.storage.as_ref())
                .await?
        }
        (Some(_), Some(_)) if body.storage.is_some() => {
            return Err(crate::http::error::ApiError::bad_request(
                "adopting a volume in a key's own bucket (volumeID with storage) is not \
                 supported",
            ));
        }
        (Some(id), Some(token)) => {
            app.volumes
                .adopt(&caller.0.id, &body.name, id, token)
                .await?
        }
        _ => {
            return Err(crate::http::error::ApiError::bad_request(
                "volumeID and token go together (adopting a volume of another daemon)",
            ));
        }
    };
    Ok((StatusCode::CREATED, Json(with_token(&app, &row))))
}

/// The caller's volumes, oldest first.
#[utoipa::path(get, path = "/volumes", tag = "volumes", security(("ApiKeyAuth" = [])),
    responses((status = 200, body = Vec<Volume>), (status = 401, body = ErrorBody),
        (status = 501, body = ErrorBody)))]
pub async fn list_volumes(
    State(app): State<Arc<App>>,
    caller: Caller,
) -> ApiResult<Json<Vec<Volume>>> {
    let rows = app.volumes.list(&caller.0.id).await?;
    Ok(Json(
        rows.into_iter()
            .map(|r| Volume {
                volume_id: r.id,
                name: r.name,
            })
            .collect(),
    ))
}

/// The caller's volume (by id or name) and its content token.
#[utoipa::path(get, path = "/volumes/{volumeID}", tag = "volumes",
    security(("ApiKeyAuth" = [])), params(("volumeID" = String, Path, description = "id or name")),
    responses((status = 200, body = VolumeAndToken), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 501, body = ErrorBody)))]
pub async fn get_volume(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<VolumeAndToken>> {
    let row = app.volumes.get(&caller.0.id, &id).await?;
    Ok(Json(with_token(&app, &row)))
}

/// Deletes the caller's volume (by id or name) and its content in the bucket; refused
/// while a sandbox mounts it.
#[utoipa::path(delete, path = "/volumes/{volumeID}", tag = "volumes",
    security(("ApiKeyAuth" = [])), params(("volumeID" = String, Path, description = "id or name")),
    responses((status = 204, description = "Deleted"), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, description = "Mounted", body = ErrorBody),
        (status = 501, body = ErrorBody)))]
pub async fn delete_volume(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    app.volumes.delete(&caller.0.id, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}
