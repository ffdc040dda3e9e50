//! `GET /v2/sandboxes/{id}/logs` (E2B's structured sandbox logs): the sandbox's life as the
//! daemon recorded it (created, started, paused, resumed, snapshots, forks, its end and
//! why), from the database, so it holds across daemon restarts and after the sandbox ended;
//! and, while it runs, the last lines of its console (what its init, the agent, and the
//! runtime printed). Console lines are guest-written: each is cut to [`MAX_LINE`] bytes,
//! stripped of control characters, marked `source: console`, and stamped with the time it
//! was read (the console has no timestamps of its own).
//!
//! Query (E2B's): `cursor` (ms since the epoch; `start` is taken too), `limit` (1 to 1000,
//! default 1000), `direction` (`forward`: from the cursor on, oldest first; `backward`: up
//! to the cursor, newest first), `level` (the lowest level shown), `search` (a substring,
//! case-insensitive).

use crate::App;
use crate::http::error::{ApiError, ApiResult, ErrorBody};
use crate::http::extract::Caller;
use crate::store::State as DbState;
use crate::util::{now_ms, rfc3339};
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use utoipa::ToSchema;

pub const MAX_LIMIT: usize = 1000;
/// The most of the console read per request.
const CONSOLE_BYTES: u64 = 64 * 1024;
/// The longest console line shown.
const MAX_LINE: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl LogLevel {
    fn parse(s: &str) -> Option<LogLevel> {
        Some(match s {
            "debug" => LogLevel::Debug,
            "info" => LogLevel::Info,
            "warn" => LogLevel::Warn,
            "error" => LogLevel::Error,
            _ => return None,
        })
    }
}

/// E2B's `SandboxLogEntry`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxLogEntry {
    /// RFC 3339
    pub timestamp: String,
    pub message: String,
    pub level: LogLevel,
    pub fields: BTreeMap<String, String>,
    #[serde(skip)]
    at_ms: i64,
}

/// E2B's `SandboxLogsV2Response`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxLogs {
    pub logs: Vec<SandboxLogEntry>,
}

fn entry(at_ms: i64, level: LogLevel, source: &str, message: String) -> SandboxLogEntry {
    let mut fields = BTreeMap::new();
    fields.insert("source".to_string(), source.to_string());
    SandboxLogEntry {
        timestamp: rfc3339(at_ms),
        message,
        level,
        fields,
        at_ms,
    }
}

/// A console line made safe to show: control characters dropped, cut at [`MAX_LINE`].
fn clean_line(line: &str) -> String {
    let mut out: String = line.chars().filter(|c| !c.is_control()).collect();
    if out.len() > MAX_LINE {
        let mut cut = MAX_LINE;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push('…');
    }
    out
}

struct LogQuery {
    cursor: Option<i64>,
    limit: usize,
    forward: bool,
    level: LogLevel,
    search: Option<String>,
}

fn parse_query(raw: Option<&str>) -> ApiResult<LogQuery> {
    let mut q = LogQuery {
        cursor: None,
        limit: MAX_LIMIT,
        forward: true,
        level: LogLevel::Debug,
        search: None,
    };
    for (name, value) in form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match &*name {
            "cursor" | "start" => {
                q.cursor = Some(
                    value
                        .parse::<i64>()
                        .ok()
                        .filter(|v| *v >= 0)
                        .ok_or_else(|| {
                            ApiError::bad_request(format!(
                                "{name} {value:?} is not a time: send milliseconds since the epoch"
                            ))
                        })?,
                )
            }
            "limit" => {
                q.limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(format!("limit {value:?}: send 1 to {MAX_LIMIT}"))
                    })?
            }
            "direction" => {
                q.forward = match &*value {
                    "forward" => true,
                    "backward" => false,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "direction {other:?}: send forward or backward"
                        )));
                    }
                }
            }
            "level" => {
                q.level = LogLevel::parse(&value).ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "level {value:?}: send debug, info, warn or error"
                    ))
                })?
            }
            "search" => q.search = Some(value.to_lowercase()),
            _ => {}
        }
    }
    Ok(q)
}

#[utoipa::path(get, path = "/v2/sandboxes/{sandboxID}/logs", tag = "sandboxes",
    security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path),
        ("cursor" = Option<i64>, Query, description = "ms since the epoch"),
        ("limit" = Option<u32>, Query, description = "1 to 1000 (default 1000)"),
        ("direction" = Option<String>, Query, description = "forward (default) or backward"),
        ("level" = Option<String>, Query, description = "lowest level: debug, info, warn, error"),
        ("search" = Option<String>, Query, description = "substring, case-insensitive")),
    responses((status = 200, body = SandboxLogs),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn sandbox_logs(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Json<SandboxLogs>> {
    let q = parse_query(raw.as_deref())?;
    let Some(row) = app.db.sandbox_of_key(&caller.0.id, &id).await? else {
        return Err(ApiError::sandbox_not_found(&id));
    };
    let mut logs = vec![entry(
        row.created_at,
        LogLevel::Info,
        "runtime",
        format!(
            "created from template {} on the {} runtime: {} vCPU, {} MiB",
            row.template_id, row.runtime, row.vcpus, row.memory_mib
        ),
    )];
    let stretches = app.db.run_stretches(&id).await?;
    for (i, stretch) in stretches.iter().enumerate() {
        let what = if i == 0 { "started" } else { "resumed" };
        logs.push(entry(
            stretch.start_ms,
            LogLevel::Info,
            "runtime",
            what.into(),
        ));
        // The last stretch of an ended sandbox ends with it (its end says why).
        let ended_with_it = row.state.is_final() && i + 1 == stretches.len();
        if let Some(end) = stretch.end_ms
            && !ended_with_it
        {
            logs.push(entry(
                end,
                LogLevel::Info,
                "runtime",
                "stopped running (paused)".into(),
            ));
        }
    }
    for snap in app.db.snapshots_of(&id).await? {
        let message = match (snap.kind.as_str(), &snap.name) {
            ("named", Some(name)) => format!("snapshot {name} taken ({})", snap.id),
            ("pause", _) => format!("paused to snapshot {}", snap.id),
            ("fork", _) => format!("checkpointed for a fork ({})", snap.id),
            (kind, _) => format!("{kind} snapshot {} taken", snap.id),
        };
        logs.push(entry(snap.at_ms, LogLevel::Info, "runtime", message));
    }
    for (child, at) in app.db.forks_of(&id).await? {
        logs.push(entry(
            at,
            LogLevel::Info,
            "runtime",
            format!("forked into {child}"),
        ));
    }
    if let Some(ended) = row.ended_at {
        let (level, what) = if row.state == DbState::Error {
            (LogLevel::Error, "ended in error")
        } else {
            (LogLevel::Info, "killed")
        };
        let reason = row.end_reason.as_deref().unwrap_or("no reason recorded");
        logs.push(entry(ended, level, "runtime", format!("{what}: {reason}")));
    }
    if let Some(live) = app.lifecycle.live(&id) {
        let now = now_ms();
        for line in live.sandbox.console_tail(CONSOLE_BYTES) {
            logs.push(entry(now, LogLevel::Info, "console", clean_line(&line)));
        }
    }
    // Stable: events of one instant keep the order they were made in.
    logs.sort_by_key(|e| e.at_ms);
    logs.retain(|e| {
        e.level >= q.level
            && q.search
                .as_deref()
                .is_none_or(|s| e.message.to_lowercase().contains(s))
    });
    if q.forward {
        if let Some(c) = q.cursor {
            logs.retain(|e| e.at_ms >= c);
        }
    } else {
        if let Some(c) = q.cursor {
            logs.retain(|e| e.at_ms <= c);
        }
        logs.reverse();
    }
    logs.truncate(q.limit);
    Ok(Json(SandboxLogs { logs }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_lose_control_characters_and_length() {
        assert_eq!(clean_line("a\u{1b}[31mred\u{7}\r"), "a[31mred");
        let long = "é".repeat(MAX_LINE);
        let cut = clean_line(&long);
        assert!(cut.len() <= MAX_LINE + '…'.len_utf8());
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn queries_are_checked_and_say_what_to_send() {
        let q = parse_query(Some(
            "cursor=5&limit=10&direction=backward&level=warn&search=OOM",
        ))
        .ok()
        .unwrap();
        assert_eq!((q.cursor, q.limit, q.forward), (Some(5), 10, false));
        assert_eq!(q.level, LogLevel::Warn);
        assert_eq!(q.search.as_deref(), Some("oom"));
        for (bad, needle) in [
            ("cursor=yesterday", "milliseconds"),
            ("limit=0", "1 to 1000"),
            ("limit=1001", "1 to 1000"),
            ("direction=up", "forward or backward"),
            ("level=loud", "debug, info, warn or error"),
        ] {
            let err = parse_query(Some(bad)).err().unwrap();
            assert!(err.public_message().contains(needle), "{bad}");
        }
        assert!(LogLevel::Error > LogLevel::Warn && LogLevel::Info > LogLevel::Debug);
    }
}
