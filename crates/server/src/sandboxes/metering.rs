//! Metering: what each key's sandboxes consumed, in vCPU-seconds and GiB-seconds (the
//! sandbox's size times how long it ran, E2B's billing units), and `GET /usage`, our
//! extension of the API.
//!
//! Stored as intervals (`usage_intervals`, migration 2): one opens in the same transaction
//! that marks a sandbox running and closes in the one that moves it out of running. The end
//! of open intervals is flushed every [`FLUSH_INTERVAL`] and reads count them up to the
//! present, to the millisecond. After a daemon crash: a sandbox that the restarted daemon
//! adopts kept running, and its open interval simply continues (the downtime is billed, it
//! ran); one found dead is closed at its last flush, as nobody saw when it ended.

use crate::App;
use crate::http::error::{ApiError, ApiResult, ErrorBody};
use crate::http::extract::Caller;
use crate::store::UsageInterval;
use crate::util::{now_ms, parse_rfc3339, rfc3339};
use axum::Json;
use axum::extract::{RawQuery, State};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use utoipa::ToSchema;

/// How often the end of running sandboxes' intervals is written down.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(10);

/// `GET /usage`: the caller's key's consumption in `[start, end)`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Usage {
    #[serde(rename = "keyID")]
    pub key_id: String,
    /// RFC 3339
    pub start: String,
    /// RFC 3339
    pub end: String,
    /// Sum over sandboxes of vCPUs × seconds running.
    #[serde(rename = "vcpuSeconds")]
    pub vcpu_seconds: f64,
    /// Sum over sandboxes of memory in GiB × seconds running.
    #[serde(rename = "gibSeconds")]
    pub gib_seconds: f64,
    pub sandboxes: Vec<SandboxUsage>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SandboxUsage {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "runningSeconds")]
    pub running_seconds: f64,
    #[serde(rename = "vcpuSeconds")]
    pub vcpu_seconds: f64,
    #[serde(rename = "gibSeconds")]
    pub gib_seconds: f64,
}

/// Sums `intervals` clipped to `[from, to)`, per sandbox (in first-seen order) and in all.
pub fn summarize(intervals: &[UsageInterval], from: i64, to: i64) -> (f64, f64, Vec<SandboxUsage>) {
    // Milliseconds, in integers until the end: exact sums.
    let mut per: BTreeMap<&str, (u128, u128, u128)> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    for iv in intervals {
        let ms = (iv.end_ms.min(to) - iv.start_ms.max(from)).max(0) as u128;
        let entry = per.entry(&iv.sandbox_id).or_insert_with(|| {
            order.push(&iv.sandbox_id);
            (0, 0, 0)
        });
        entry.0 += ms;
        entry.1 += ms * u128::from(iv.vcpus);
        entry.2 += ms * u128::from(iv.memory_mib);
    }
    let secs = |ms: u128| ms as f64 / 1000.0;
    let gib_secs = |mib_ms: u128| mib_ms as f64 / 1024.0 / 1000.0;
    let sandboxes: Vec<SandboxUsage> = order
        .iter()
        .map(|id| {
            let (ms, vcpu_ms, mib_ms) = per[id];
            SandboxUsage {
                sandbox_id: (*id).to_string(),
                running_seconds: secs(ms),
                vcpu_seconds: secs(vcpu_ms),
                gib_seconds: gib_secs(mib_ms),
            }
        })
        .collect();
    let vcpu: u128 = per.values().map(|v| v.1).sum();
    let mib: u128 = per.values().map(|v| v.2).sum();
    (secs(vcpu), gib_secs(mib), sandboxes)
}

/// The consumption of the caller's key (our extension; E2B bills elsewhere).
#[utoipa::path(get, path = "/usage", tag = "usage", security(("ApiKeyAuth" = [])),
    params(
        ("start" = Option<String>, Query, description = "RFC 3339; default: the beginning"),
        ("end" = Option<String>, Query, description = "RFC 3339; default: now")),
    responses((status = 200, body = Usage),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn usage(
    State(app): State<Arc<App>>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<Usage>> {
    let now = now_ms();
    let (mut from, mut to) = (0, now);
    for (name, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        let slot = match &*name {
            "start" => &mut from,
            "end" => &mut to,
            _ => continue,
        };
        *slot = parse_rfc3339(&value).ok_or_else(|| {
            ApiError::bad_request(format!("invalid {name} {value:?}: RFC 3339 expected"))
        })?;
    }
    if from > to {
        return Err(ApiError::bad_request("start is after end"));
    }
    let intervals = app.db.usage(&caller.0.id, from, to, now).await?;
    let (vcpu_seconds, gib_seconds, sandboxes) = summarize(&intervals, from, to);
    Ok(Json(Usage {
        key_id: caller.0.id.clone(),
        start: rfc3339(from),
        end: rfc3339(to),
        vcpu_seconds,
        gib_seconds,
        sandboxes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(id: &str, vcpus: u32, mib: u32, start: i64, end: i64) -> UsageInterval {
        UsageInterval {
            sandbox_id: id.into(),
            vcpus,
            memory_mib: mib,
            start_ms: start,
            end_ms: end,
        }
    }

    #[test]
    fn intervals_are_clipped_to_the_range_and_summed() {
        let ivs = [
            iv("a", 2, 1024, 0, 10_000),
            iv("b", 1, 512, 5_000, 20_000),
            iv("a", 2, 1024, 30_000, 40_000),
        ];
        let (vcpu, gib, per) = summarize(&ivs, 5_000, 35_000);
        // a: 5 s + 5 s at 2 vCPU, 1 GiB; b: 15 s at 1 vCPU, 0.5 GiB.
        assert_eq!(per.len(), 2);
        assert_eq!(per[0].sandbox_id, "a");
        assert_eq!(per[0].running_seconds, 10.0);
        assert_eq!(per[0].vcpu_seconds, 20.0);
        assert_eq!(per[0].gib_seconds, 10.0);
        assert_eq!(per[1].vcpu_seconds, 15.0);
        assert_eq!(per[1].gib_seconds, 7.5);
        assert_eq!(vcpu, 35.0);
        assert_eq!(gib, 17.5);
        let (vcpu, _, per) = summarize(&ivs, 50_000, 60_000);
        assert_eq!(vcpu, 0.0);
        assert!(per.iter().all(|p| p.running_seconds == 0.0));
    }
}
