//! MCP resources: what a model may want to read about a sandbox without a tool call's
//! side effects. Two per sandbox of the caller's key:
//!
//! - `sandcell://sandboxes/{id}`: its info (`GET /sandboxes/{id}`, credentials removed);
//! - `sandcell://sandboxes/{id}/logs`: its recent log, newest first (`GET
//!   /v2/sandboxes/{id}/logs?direction=backward&limit=100`: its lifecycle events and, while it
//!   runs, the last console lines).
//!
//! Both are listed for the key's running sandboxes (at most [`MAX_LISTED`]) and offered as
//! URI templates for any other. Reads go through the REST API with the caller's key, as
//! the tools do, so another key's sandbox reads as not found.

use hyper::Method;
use rmcp::ErrorData;
use rmcp::model::{
    ListResourceTemplatesResult, ListResourcesResult, ReadResourceResult, Resource,
    ResourceContents, ResourceTemplate,
};
use sandcell_client::{Client, checked};
use serde_json::Value;

const PREFIX: &str = "sandcell://sandboxes/";
/// Sandboxes whose resources `resources/list` names; the templates reach the others.
pub const MAX_LISTED: usize = 100;
/// Log entries a read returns.
const LOG_ENTRIES: usize = 100;

/// What a resource URI names.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    Info(&'a str),
    Logs(&'a str),
}

/// `uri` as one of ours, or why not.
fn parse(uri: &str) -> Result<Target<'_>, String> {
    let rest = uri
        .strip_prefix(PREFIX)
        .ok_or_else(|| format!("unknown resource {uri:?}: sandcell resources start {PREFIX}"))?;
    let (id, logs) = match rest.split_once('/') {
        Some((id, "logs")) => (id, true),
        Some(_) => {
            return Err(format!(
                "unknown resource {uri:?}: {PREFIX}ID or {PREFIX}ID/logs"
            ));
        }
        None => (rest, false),
    };
    let id_ok = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !id_ok {
        return Err(format!("invalid sandbox id {id:?} in {uri:?}"));
    }
    Ok(if logs {
        Target::Logs(id)
    } else {
        Target::Info(id)
    })
}

pub fn templates() -> ListResourceTemplatesResult {
    ListResourceTemplatesResult::with_all_items(vec![
        ResourceTemplate::new(format!("{PREFIX}{{sandbox_id}}"), "sandbox-info")
            .with_title("Sandbox info")
            .with_description(
                "A sandbox's state, template, resources, metadata and timestamps (what \
                 sandbox_info returns).",
            )
            .with_mime_type("application/json"),
        ResourceTemplate::new(format!("{PREFIX}{{sandbox_id}}/logs"), "sandbox-logs")
            .with_title("Sandbox log")
            .with_description(
                "A sandbox's last 100 log entries, newest first: lifecycle events (created, \
                 paused, resumed, forked, ended and why) and its console's last lines.",
            )
            .with_mime_type("application/json"),
    ])
}

/// The resources of the key's running sandboxes.
pub async fn list(client: &Client) -> Result<ListResourcesResult, ErrorData> {
    let sandboxes = client
        .list_sandboxes()
        .await
        .map_err(|e| ErrorData::internal_error(crate::error::explain(&e, None), None))?;
    let mut resources = Vec::new();
    for s in sandboxes.iter().take(MAX_LISTED) {
        let id = &s.sandbox_id;
        resources.push(
            Resource::new(format!("{PREFIX}{id}"), format!("sandbox {id}"))
                .with_description(format!("info of sandbox {id} (template {})", s.template_id))
                .with_mime_type("application/json"),
        );
        resources.push(
            Resource::new(format!("{PREFIX}{id}/logs"), format!("sandbox {id} log"))
                .with_description(format!(
                    "the last {LOG_ENTRIES} log entries of sandbox {id}"
                ))
                .with_mime_type("application/json"),
        );
    }
    Ok(ListResourcesResult::with_all_items(resources))
}

/// Reads `uri`: not ours or not found is `resource_not_found` (the MCP convention for
/// resources), the daemon failing an internal error.
pub async fn read(client: &Client, uri: &str) -> Result<ReadResourceResult, ErrorData> {
    let target = parse(uri).map_err(|m| ErrorData::resource_not_found(m, None))?;
    let value = match target {
        Target::Info(id) => {
            let mut detail = get_json(client, &format!("/sandboxes/{id}"), uri, id).await?;
            if let Some(obj) = detail.as_object_mut() {
                obj.remove("envdAccessToken");
                obj.remove("trafficAccessToken");
            }
            detail
        }
        Target::Logs(id) => {
            let path = format!("/v2/sandboxes/{id}/logs?direction=backward&limit={LOG_ENTRIES}");
            get_json(client, &path, uri, id).await?
        }
    };
    let text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| Value::to_string(&value));
    Ok(ReadResourceResult::new(vec![
        ResourceContents::text(text, uri).with_mime_type("application/json"),
    ]))
}

/// `GET path` of the daemon as JSON; a 404 is the resource `uri` not found.
async fn get_json(client: &Client, path: &str, uri: &str, id: &str) -> Result<Value, ErrorData> {
    let resp = client.api(Method::GET, path, None).await.and_then(checked);
    let resp = match resp {
        Ok(resp) => resp,
        Err(e) if e.status().is_some_and(|s| s.as_u16() == 404) => {
            return Err(ErrorData::resource_not_found(
                format!("{uri}: {}", crate::error::explain(&e, Some(id))),
                None,
            ));
        }
        Err(e) => {
            return Err(ErrorData::internal_error(
                format!("reading {uri}: {}", crate::error::explain(&e, Some(id))),
                None,
            ));
        }
    };
    serde_json::from_slice(&resp.body).map_err(|e| {
        ErrorData::internal_error(
            format!("the daemon's answer to {path} is not JSON: {e}"),
            None,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_info_or_logs_of_a_safe_id() {
        assert_eq!(parse("sandcell://sandboxes/sc-1"), Ok(Target::Info("sc-1")));
        assert_eq!(
            parse("sandcell://sandboxes/sc-1/logs"),
            Ok(Target::Logs("sc-1"))
        );
        for bad in [
            "sandcell://sandboxes/",
            "sandcell://sandboxes/sc-1/files",
            "sandcell://sandboxes/../keys",
            "sandcell://sandboxes/a%2fb",
            "sandcell://sandboxes/a?x=1",
            "file:///etc/passwd",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
