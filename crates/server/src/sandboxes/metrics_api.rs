//! E2B's sandbox metrics routes over the samples of sandboxes/metrics.rs:
//! `GET /sandboxes/{id}/metrics?start=&end=` (a time series, Unix seconds, the sandbox's
//! whole life by default) and `GET /sandboxes/metrics?sandbox_ids=a,b` (the latest sample of
//! each). Only the caller's sandboxes: another key's id is 404 in the first and absent from
//! the second.

use crate::App;
use crate::http::error::{ApiError, ApiResult, ErrorBody};
use crate::http::extract::Caller;
use crate::sandboxes::metrics::Sample;
use crate::util::{now_ms, rfc3339};
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use utoipa::ToSchema;

/// Most ids `GET /sandboxes/metrics` takes at once (E2B's limit).
pub const MAX_IDS: usize = 100;

/// E2B's `SandboxMetric`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxMetric {
    /// RFC 3339
    pub timestamp: String,
    /// Seconds since the Unix epoch
    pub timestamp_unix: i64,
    pub cpu_count: u32,
    /// Of all its vCPUs together, 0 to 100
    pub cpu_used_pct: f32,
    /// Bytes, page cache excluded
    pub mem_used: u64,
    pub mem_total: u64,
    /// Bytes of page cache
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

impl From<Sample> for SandboxMetric {
    fn from(s: Sample) -> SandboxMetric {
        SandboxMetric {
            timestamp: rfc3339(s.at_ms),
            timestamp_unix: s.at_ms.div_euclid(1000),
            cpu_count: s.cpu_count,
            cpu_used_pct: s.cpu_used_pct,
            mem_used: s.mem_used,
            mem_total: s.mem_total,
            mem_cache: s.mem_cache,
            disk_used: s.disk_used,
            disk_total: s.disk_total,
        }
    }
}

/// E2B's `SandboxesWithMetrics`: the latest sample by sandbox id.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxesWithMetrics {
    pub sandboxes: BTreeMap<String, SandboxMetric>,
}

fn unix_param(name: &str, value: &str) -> ApiResult<i64> {
    value
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|v| (0..=i64::MAX / 1000).contains(v))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "{name} {value:?} is not a time: send Unix seconds, e.g. {name}={}",
                now_ms() / 1000
            ))
        })
}

#[utoipa::path(get, path = "/sandboxes/{sandboxID}/metrics", tag = "sandboxes",
    security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path),
        ("start" = Option<i64>, Query, description = "Unix seconds (default: the sandbox's start)"),
        ("end" = Option<i64>, Query, description = "Unix seconds (default: now)")),
    responses((status = 200, body = Vec<SandboxMetric>),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn sandbox_metrics(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<Vec<SandboxMetric>>> {
    let (mut start, mut end) = (None, None);
    for (name, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*name {
            "start" => start = Some(unix_param("start", &value)?),
            "end" => end = Some(unix_param("end", &value)?),
            _ => {}
        }
    }
    if let (Some(s), Some(e)) = (start, end)
        && s > e
    {
        return Err(ApiError::bad_request(format!(
            "start {s} is after end {e}: send start <= end"
        )));
    }
    // Ended sandboxes too: their series stays readable a while after the end.
    if app.db.sandbox_of_key(&caller.0.id, &id).await?.is_none() {
        return Err(ApiError::sandbox_not_found(&id));
    }
    let from = start.map_or(0, |s| s * 1000);
    // Through the end second inclusive.
    let to = end.map_or(i64::MAX, |e| e * 1000 + 999);
    let samples = app.lifecycle.samples.range(&id, from, to);
    Ok(Json(samples.into_iter().map(SandboxMetric::from).collect()))
}

#[utoipa::path(get, path = "/sandboxes/metrics", tag = "sandboxes",
    security(("ApiKeyAuth" = [])),
    params(("sandbox_ids" = String, Query, description = "Comma-separated ids, at most 100")),
    responses((status = 200, body = SandboxesWithMetrics),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn sandboxes_metrics(
    State(app): State<Arc<App>>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<SandboxesWithMetrics>> {
    let mut ids: Vec<String> = Vec::new();
    for (name, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        if name == "sandbox_ids" {
            ids.extend(
                value
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string),
            );
        }
    }
    if ids.is_empty() {
        return Err(ApiError::bad_request(
            "sandbox_ids is missing: send sandbox_ids=ID[,ID...]",
        ));
    }
    if ids.len() > MAX_IDS {
        return Err(ApiError::bad_request(format!(
            "{} sandbox_ids: send at most {MAX_IDS} per request",
            ids.len()
        )));
    }
    ids.sort();
    ids.dedup();
    let mut sandboxes = BTreeMap::new();
    for id in ids {
        if app.db.sandbox_of_key(&caller.0.id, &id).await?.is_none() {
            continue;
        }
        if let Some(latest) = app.lifecycle.samples.latest(&id) {
            sandboxes.insert(id, latest.into());
        }
    }
    Ok(Json(SandboxesWithMetrics { sandboxes }))
}
