//! The file tools: read and write (text, or any bytes as base64, up to [`MAX_FILE`]), list,
//! stat, remove and mkdir, through the sandbox's envd (files API and Filesystem RPCs).

use crate::error::ToolError;
use crate::tools::json_result;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use rmcp::model::{CallToolResult, ContentBlock};
use sandcell_client::{Client, ClientError, Envd};
use sandcell_proto::agent::filesystem::{EntryInfo, FileType};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

/// The largest file read or written whole: a model's context is the limit, and the
/// request body of an HTTP call (4 MiB) must hold it as base64.
const MAX_FILE: usize = 1024 * 1024;
/// The most entries file_list returns.
const MAX_ENTRIES: usize = 1000;
const MAX_DEPTH: u32 = 5;

#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// UTF-8 text.
    #[default]
    Text,
    /// Any bytes, base64-encoded.
    Base64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// Absolute path of the file (or relative to the user's home).
    pub path: String,
    /// `text` (default; fails on bytes that are not UTF-8) or `base64`.
    #[serde(default)]
    pub encoding: Encoding,
    /// Read as this user: `user` or `root` (default: the sandbox's default user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub user: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// Absolute path of the file (or relative to the user's home).
    pub path: String,
    /// The file's new contents: text, or base64 with encoding=base64.
    pub content: String,
    /// `text` (default) or `base64`.
    #[serde(default)]
    pub encoding: Encoding,
    /// Write as this user: `user` or `root` (default: the sandbox's default user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub user: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The directory.
    pub path: String,
    /// Levels to descend: 1 (default) lists the directory's own entries, at most 5.
    #[serde(default = "one")]
    pub depth: u32,
    /// List as this user (default: the sandbox's default user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub user: Option<String>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PathArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// The path.
    pub path: String,
    /// As this user (default: the sandbox's default user).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub user: Option<String>,
}

async fn envd(client: &Client, id: &str, user: Option<String>) -> Result<Envd, ToolError> {
    Ok(client
        .connect_envd(id)
        .await
        .map_err(|e| ToolError::daemon(&e, Some(id)))?
        .as_user(user))
}

fn fs_error(e: &ClientError, id: &str, path: &str) -> ToolError {
    match e {
        ClientError::Envd {
            status, message, ..
        } if status.as_u16() == 404 => ToolError::Invalid(format!(
            "{path} does not exist in sandbox {id} ({message}); file_list shows what does"
        )),
        other => ToolError::daemon(other, Some(id)),
    }
}

fn kind(k: FileType) -> &'static str {
    match k {
        FileType::File => "file",
        FileType::Directory => "dir",
        FileType::Symlink => "symlink",
        FileType::Unspecified => "other",
    }
}

fn entry_json(e: &EntryInfo) -> Value {
    json!({
        "name": e.name,
        "path": e.path,
        "type": kind(e.kind),
        "size": e.size,
        "permissions": e.permissions,
        "owner": e.owner,
        "group": e.group,
        "modified": e.modified_time,
        "symlink_target": e.symlink_target,
    })
}

pub async fn read(client: &Client, a: ReadArgs) -> Result<CallToolResult, ToolError> {
    let id = &a.sandbox_id;
    let envd = envd(client, id, a.user).await?;
    let download = envd
        .download(&a.path)
        .await
        .map_err(|e| fs_error(&e, id, &a.path))?;
    let mut bytes = Vec::new();
    let mut download = download;
    while let Some(chunk) = download.next_chunk().await {
        let chunk = chunk.map_err(|e| ToolError::daemon(&e, Some(id)))?;
        if bytes.len() + chunk.len() > MAX_FILE {
            return Err(ToolError::Invalid(format!(
                "{} is larger than {MAX_FILE} bytes: read a part with exec (`head -c N`, \
                 `tail -c N`, `dd`) or search it with grep",
                a.path
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    let size = bytes.len();
    match a.encoding {
        Encoding::Text => {
            let text = String::from_utf8(bytes).map_err(|_| {
                ToolError::Invalid(format!(
                    "{} is not UTF-8 text: call file_read again with encoding=base64",
                    a.path
                ))
            })?;
            let mut result = CallToolResult::success(vec![ContentBlock::text(text.clone())]);
            result.structured_content = Some(json!({
                "path": a.path, "size": size, "encoding": "text", "content": text,
            }));
            Ok(result)
        }
        Encoding::Base64 => {
            let content = BASE64.encode(&bytes);
            Ok(json_result(json!({
                "path": a.path, "size": size, "encoding": "base64", "content": content,
            })))
        }
    }
}

pub async fn write(client: &Client, a: WriteArgs) -> Result<CallToolResult, ToolError> {
    let id = &a.sandbox_id;
    let bytes = match a.encoding {
        Encoding::Text => a.content.into_bytes(),
        Encoding::Base64 => BASE64.decode(a.content.trim()).map_err(|e| {
            ToolError::Invalid(format!(
                "content is not valid base64 ({e}): encode the bytes again"
            ))
        })?,
    };
    if bytes.len() > MAX_FILE {
        return Err(ToolError::Invalid(format!(
            "content is {} bytes, more than {MAX_FILE}: write the file in parts (the first \
             with file_write, then append with exec) or generate it in the sandbox",
            bytes.len()
        )));
    }
    let size = bytes.len();
    let envd = envd(client, id, a.user).await?;
    envd.upload(&a.path, std::io::Cursor::new(bytes))
        .await
        .map_err(|e| fs_error(&e, id, &a.path))?;
    Ok(json_result(
        json!({ "path": a.path, "size": size, "written": true }),
    ))
}

pub async fn list(client: &Client, a: ListArgs) -> Result<CallToolResult, ToolError> {
    if !(1..=MAX_DEPTH).contains(&a.depth) {
        return Err(ToolError::Invalid(format!(
            "depth {} is out of range: 1 to {MAX_DEPTH}",
            a.depth
        )));
    }
    let id = &a.sandbox_id;
    let envd = envd(client, id, a.user).await?;
    let entries = envd
        .list_dir(&a.path, a.depth)
        .await
        .map_err(|e| fs_error(&e, id, &a.path))?;
    let total = entries.len();
    let shown: Vec<Value> = entries.iter().take(MAX_ENTRIES).map(entry_json).collect();
    let mut out = json!({ "path": a.path, "entries": shown, "count": total });
    if total > MAX_ENTRIES {
        out["truncated"] = json!(format!(
            "only the first {MAX_ENTRIES} of {total} entries: list a subdirectory or lower depth"
        ));
    }
    Ok(json_result(out))
}

pub async fn stat(client: &Client, a: PathArgs) -> Result<CallToolResult, ToolError> {
    let id = &a.sandbox_id;
    let envd = envd(client, id, a.user).await?;
    let entry = envd
        .stat(&a.path)
        .await
        .map_err(|e| fs_error(&e, id, &a.path))?;
    Ok(json_result(match entry {
        Some(e) => {
            let mut v = entry_json(&e);
            v["exists"] = json!(true);
            v
        }
        None => json!({ "path": a.path, "exists": false }),
    }))
}

pub async fn remove(client: &Client, a: PathArgs) -> Result<CallToolResult, ToolError> {
    let id = &a.sandbox_id;
    let envd = envd(client, id, a.user).await?;
    envd.remove(&a.path)
        .await
        .map_err(|e| fs_error(&e, id, &a.path))?;
    Ok(json_result(json!({ "path": a.path, "removed": true })))
}

pub async fn mkdir(client: &Client, a: PathArgs) -> Result<CallToolResult, ToolError> {
    let id = &a.sandbox_id;
    let envd = envd(client, id, a.user).await?;
    match envd.make_dir(&a.path).await {
        Ok(e) => {
            let mut v = entry_json(&e);
            v["created"] = json!(true);
            Ok(json_result(v))
        }
        Err(ClientError::Envd { status, .. }) if status.as_u16() == 409 => {
            Ok(json_result(json!({ "path": a.path, "created": false })))
        }
        Err(e) => Err(fs_error(&e, id, &a.path)),
    }
}
