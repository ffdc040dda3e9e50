//! The tool list (names, descriptions for a model, input schemas derived from the argument
//! types) and the dispatch of a `tools/call` to its tool.
//!
//! Arguments are parsed here with serde (unknown fields refused, so a misspelt argument is
//! reported rather than ignored); every failure becomes a result with `isError`. A
//! protocol error is left for what is not a tool call at all.

use crate::error::ToolError;
use crate::{Sandcell, computer, exec, files, sandboxes};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, Tool, ToolAnnotations};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// One tool: its name, what a model is told about it, its arguments' type, and hints.
fn tool<T: JsonSchema + 'static>(
    name: &'static str,
    description: &'static str,
    hints: ToolAnnotations,
) -> Tool {
    Tool::new(name, description, serde_json::Map::new())
        .with_input_schema::<T>()
        .with_annotations(hints)
}

fn reads() -> ToolAnnotations {
    ToolAnnotations::new()
        .read_only(true)
        .destructive(false)
        .open_world(false)
}

fn changes() -> ToolAnnotations {
    ToolAnnotations::new()
        .read_only(false)
        .destructive(false)
        .open_world(false)
}

fn destroys() -> ToolAnnotations {
    ToolAnnotations::new()
        .read_only(false)
        .destructive(true)
        .open_world(false)
}

/// Every tool, in the order a model meets them.
pub fn all() -> Vec<Tool> {
    use sandboxes as s;
    vec![
        tool::<s::CreateArgs>(
            "sandbox_create",
            "Create a new isolated Linux sandbox and return its sandbox_id (pass it to every \
             other tool). Use one sandbox per task; it is killed at its timeout (300 s unless \
             timeout_seconds says otherwise; extend it with sandbox_set_timeout). Optional: \
             environment variables for every command, metadata to find it again, egress rules \
             (allow_out / deny_out / allow_internet) and private networks to join.",
            changes(),
        ),
        tool::<s::ListArgs>(
            "sandbox_list",
            "List this API key's sandboxes (running ones unless state says otherwise): id, \
             template, state, start and end time, metadata. Use it to find a sandbox_id again.",
            reads(),
        ),
        tool::<s::IdArgs>(
            "sandbox_info",
            "One sandbox's details: template, state (running or paused), start and end \
             time, CPU count, memory, metadata.",
            reads(),
        ),
        tool::<s::IdArgs>(
            "sandbox_kill",
            "Kill a sandbox: its processes and files are gone for good. Call it when a task \
             is done.",
            destroys(),
        ),
        tool::<s::IdArgs>(
            "sandbox_pause",
            "Pause a running sandbox: memory, processes and files are saved to disk and it \
             stops using CPU. sandbox_resume continues it where it was.",
            changes(),
        ),
        tool::<s::ResumeArgs>(
            "sandbox_resume",
            "Resume a paused sandbox (same id, processes and files); on a running one it only \
             extends the timeout.",
            changes(),
        ),
        tool::<s::ForkArgs>(
            "sandbox_fork",
            "Fork a running sandbox into `count` new sandboxes that continue from its present \
             state (files, processes, memory); the original keeps running. Returns the new \
             sandbox ids. Use it to try alternatives from one prepared state.",
            changes(),
        ),
        tool::<s::SnapshotArgs>(
            "sandbox_snapshot",
            "Snapshot a running sandbox (it keeps running). Returns a snapshot id; pass it (or \
             the name) as `template` to sandbox_create to start new sandboxes from this state.",
            changes(),
        ),
        tool::<s::TimeoutArgs>(
            "sandbox_set_timeout",
            "Set how long from now a sandbox lives before the daemon kills it.",
            changes(),
        ),
        tool::<exec::ExecArgs>(
            "exec",
            "Run a shell command (sh -c) in a sandbox and wait for it to end. Returns the exit \
             code, stdout and stderr (each kept to its first and last 32 KiB; `truncated` says \
             when bytes were left out). Output is also streamed as progress notifications \
             while it runs. A command still running at timeout_seconds (default 60) is killed; \
             cancelling the call kills it too. For long-running servers, start them in the \
             background (`nohup CMD >/tmp/log 2>&1 &`).",
            ToolAnnotations::new()
                .read_only(false)
                .destructive(true)
                .open_world(true),
        ),
        tool::<files::ReadArgs>(
            "file_read",
            "Read a file from a sandbox: as UTF-8 text (default) or, with encoding=base64, any \
             bytes. At most 1 MiB; for larger files read a part with exec (head, tail, dd).",
            reads(),
        ),
        tool::<files::WriteArgs>(
            "file_write",
            "Write a file in a sandbox (parent directories are created; an existing file is \
             replaced). content is UTF-8 text, or base64 with encoding=base64; at most 1 MiB.",
            changes(),
        ),
        tool::<files::ListArgs>(
            "file_list",
            "List a directory in a sandbox: name, path, type (file, dir, symlink), size, \
             permissions, owner and modification time of each entry, `depth` levels down.",
            reads(),
        ),
        tool::<files::PathArgs>(
            "file_stat",
            "What is at a path in a sandbox: exists (false when nothing is), type, size, \
             permissions, owner, modification time, symlink target.",
            reads(),
        ),
        tool::<files::PathArgs>(
            "file_remove",
            "Remove a file, or a directory with everything in it, in a sandbox.",
            destroys(),
        ),
        tool::<files::PathArgs>(
            "file_mkdir",
            "Make a directory (and its missing parents) in a sandbox. created is false when it \
             already existed.",
            changes(),
        ),
        tool::<s::PortArgs>(
            "port_url",
            "The address where a TCP port of a sandbox is reachable from outside (for a web \
             server started in it), and whether anything listens on that port now.",
            reads(),
        ),
        tool::<s::NetworkArgs>(
            "network_update",
            "Replace a running sandbox's egress rules (all of them: omitted lists are cleared). \
             allow_out: destinations allowed (IP, CIDR, domain or *.domain); deny_out: IPs or \
             CIDRs refused; allow_internet=false refuses everything allow_out does not allow.",
            changes(),
        ),
        tool::<computer::ScreenshotArgs>(
            "computer_screenshot",
            "See a sandbox's desktop: a PNG screenshot of its screen (sandboxes of the \
             `desktop` template: create one with template=desktop). Take one before acting \
             and after, to check what a click or key did.",
            reads(),
        ),
        tool::<computer::ClickArgs>(
            "computer_click",
            "Click at (x, y) on a sandbox's screen, in full-size screen pixels (left button \
             unless button says right or middle; double=true for a double click).",
            changes(),
        ),
        tool::<computer::TypeArgs>(
            "computer_type",
            "Type text into the focused window of a sandbox's desktop, as keystrokes (click \
             the field first).",
            changes(),
        ),
        tool::<computer::KeyArgs>(
            "computer_key",
            "Press keys together on a sandbox's desktop: [\"ctrl\", \"s\"] to save, \
             [\"enter\"], [\"alt\", \"f4\"]. Unknown key names are refused.",
            changes(),
        ),
        tool::<computer::ScrollArgs>(
            "computer_scroll",
            "Turn the mouse wheel on a sandbox's desktop (down unless direction says up, left \
             or right), at (x, y) or where the pointer is.",
            changes(),
        ),
        tool::<computer::LaunchArgs>(
            "computer_launch",
            "Start a program on a sandbox's desktop: a desktop entry's name \
             (xfce4-terminal, mousepad), or open an http(s) URL or a file path with its \
             default program.",
            changes(),
        ),
        tool::<computer::WindowsArgs>(
            "computer_windows",
            "List the windows on a sandbox's desktop: id, title, class, position, size, and \
             which has the keyboard focus.",
            reads(),
        ),
    ]
}

/// Parses a tool's arguments (absent: `{}`).
pub fn args<T: DeserializeOwned>(
    tool: &str,
    arguments: Option<serde_json::Map<String, Value>>,
) -> Result<T, ToolError> {
    let value = Value::Object(arguments.unwrap_or_default());
    serde_json::from_value(value).map_err(|e| ToolError::Arguments {
        tool: tool.to_string(),
        problem: e.to_string(),
    })
}

/// A successful result: `value` as structured content, and as text for clients that only
/// show text.
pub fn json_result(value: Value) -> CallToolResult {
    let text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| value.to_string());
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(value);
    result
}

/// Runs the call; a tool's failure is its result with `isError`.
pub async fn call(
    server: &Sandcell,
    request: CallToolRequestParams,
    ctx: RequestContext<RoleServer>,
) -> Result<CallToolResult, ErrorData> {
    let name = request.name.to_string();
    let outcome = dispatch(server, &name, request.arguments, ctx).await;
    Ok(match outcome {
        Ok(result) => result,
        Err(e) => {
            tracing::debug!(tool = %name, "tool error: {e}");
            CallToolResult::error(vec![ContentBlock::text(e.to_string())])
        }
    })
}

async fn dispatch(
    server: &Sandcell,
    name: &str,
    arguments: Option<serde_json::Map<String, Value>>,
    ctx: RequestContext<RoleServer>,
) -> Result<CallToolResult, ToolError> {
    if !all().iter().any(|t| t.name == name) {
        return Err(ToolError::UnknownTool(name.to_string()));
    }
    let client = server.client_for(&ctx)?;
    match name {
        "sandbox_create" => sandboxes::create(&client, args(name, arguments)?).await,
        "sandbox_list" => sandboxes::list(&client, args(name, arguments)?).await,
        "sandbox_info" => sandboxes::info(&client, args(name, arguments)?).await,
        "sandbox_kill" => sandboxes::kill(&client, args(name, arguments)?).await,
        "sandbox_pause" => sandboxes::pause(&client, args(name, arguments)?).await,
        "sandbox_resume" => sandboxes::resume(&client, args(name, arguments)?).await,
        "sandbox_fork" => sandboxes::fork(&client, args(name, arguments)?).await,
        "sandbox_snapshot" => sandboxes::snapshot(&client, args(name, arguments)?).await,
        "sandbox_set_timeout" => sandboxes::set_timeout(&client, args(name, arguments)?).await,
        "exec" => exec::exec(&client, &server.running, args(name, arguments)?, &ctx).await,
        "file_read" => files::read(&client, args(name, arguments)?).await,
        "file_write" => files::write(&client, args(name, arguments)?).await,
        "file_list" => files::list(&client, args(name, arguments)?).await,
        "file_stat" => files::stat(&client, args(name, arguments)?).await,
        "file_remove" => files::remove(&client, args(name, arguments)?).await,
        "file_mkdir" => files::mkdir(&client, args(name, arguments)?).await,
        "port_url" => {
            sandboxes::port_url(&client, &server.public_url, args(name, arguments)?).await
        }
        "network_update" => sandboxes::network_update(&client, args(name, arguments)?).await,
        "computer_screenshot" => computer::screenshot(&client, args(name, arguments)?).await,
        "computer_click" => computer::click(&client, args(name, arguments)?).await,
        "computer_type" => computer::type_text(&client, args(name, arguments)?).await,
        "computer_key" => computer::key(&client, args(name, arguments)?).await,
        "computer_scroll" => computer::scroll(&client, args(name, arguments)?).await,
        "computer_launch" => computer::launch(&client, args(name, arguments)?).await,
        "computer_windows" => computer::windows(&client, args(name, arguments)?).await,
        other => Err(ToolError::UnknownTool(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tool_has_an_object_schema_and_a_description() {
        let tools = all();
        assert_eq!(tools.len(), 25);
        for t in &tools {
            assert_eq!(
                t.input_schema.get("type").and_then(Value::as_str),
                Some("object"),
                "{}",
                t.name
            );
            assert!(
                t.description.as_ref().is_some_and(|d| d.len() > 40),
                "{}",
                t.name
            );
        }
        let exec = tools
            .iter()
            .find(|t| t.name == "exec")
            .map(|t| t.input_schema.clone());
        let required = exec
            .as_ref()
            .and_then(|s| s.get("required"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        assert!(required.contains(&Value::from("command")), "{required:?}");
        assert!(
            required.contains(&Value::from("sandbox_id")),
            "{required:?}"
        );
    }

    #[test]
    fn bad_arguments_name_the_tool_and_the_field() {
        let mut m = serde_json::Map::new();
        m.insert("sandbox".into(), Value::from("x"));
        let e = args::<sandboxes::IdArgs>("sandbox_info", Some(m)).expect_err("unknown field");
        let text = e.to_string();
        assert!(text.contains("sandbox_info"), "{text}");
        assert!(text.contains("sandbox"), "{text}");
        let e = args::<sandboxes::IdArgs>("sandbox_info", None).expect_err("missing field");
        assert!(e.to_string().contains("sandbox_id"), "{e}");
    }
}
