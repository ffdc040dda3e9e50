//! The computer tools: a sandbox's desktop (the `desktop` template) seen through
//! screenshots and driven with the mouse and keyboard, one call each to the daemon's
//! Computer API (crates/server computer/). Screenshots come back as MCP image content, so a
//! model sees the screen itself.

use crate::error::ToolError;
use crate::tools::json_result;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use rmcp::model::{CallToolResult, ContentBlock};
use sandcell_client::{Client, ScreenshotOptions};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScreenshotArgs {
    pub sandbox_id: String,
    /// Scale the picture down (0 < scale <= 1; default 1, full size). Coordinates for the
    /// other computer tools are always full-size screen pixels.
    #[serde(default)]
    pub scale: Option<f64>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClickArgs {
    pub sandbox_id: String,
    /// Screen pixels from the left edge.
    pub x: u32,
    /// Screen pixels from the top edge.
    pub y: u32,
    /// left (default), right or middle.
    #[serde(default)]
    pub button: Option<String>,
    /// A double click.
    #[serde(default)]
    pub double: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TypeArgs {
    pub sandbox_id: String,
    /// Typed as keystrokes into the focused window (\n types Enter).
    pub text: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KeyArgs {
    pub sandbox_id: String,
    /// Pressed together, such as ["ctrl", "s"] or ["enter"]: ctrl, alt, shift, super,
    /// enter, tab, esc, backspace, delete, up, down, left, right, page_up, page_down,
    /// home, end, f1-f12, or one character.
    pub keys: Vec<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ScrollArgs {
    pub sandbox_id: String,
    /// up, down (default), left or right.
    #[serde(default)]
    pub direction: Option<String>,
    /// Wheel steps, 1 to 100 (default 3).
    #[serde(default)]
    pub amount: Option<u32>,
    /// Where to scroll (default: where the pointer is); both x and y, or neither.
    #[serde(default)]
    pub x: Option<u32>,
    #[serde(default)]
    pub y: Option<u32>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchArgs {
    pub sandbox_id: String,
    /// A desktop entry's name (xfce4-terminal, mousepad), an http(s):// URL, or an
    /// absolute path of a file in the sandbox to open with its default program.
    pub target: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WindowsArgs {
    pub sandbox_id: String,
}

pub async fn screenshot(client: &Client, a: ScreenshotArgs) -> Result<CallToolResult, ToolError> {
    let opts = ScreenshotOptions {
        scale: a.scale,
        ..Default::default()
    };
    let id = a.sandbox_id.as_str();
    let png = client
        .screenshot(id, &opts)
        .await
        .map_err(|e| ToolError::daemon(&e, Some(id)))?;
    let size = client
        .screen_size(id)
        .await
        .map_err(|e| ToolError::daemon(&e, Some(id)))?;
    let text = format!(
        "screenshot of sandbox {id}: the screen is {}x{} pixels ({} bytes of PNG)",
        size.width,
        size.height,
        png.len()
    );
    Ok(CallToolResult::success(vec![
        ContentBlock::image(BASE64.encode(&png), "image/png"),
        ContentBlock::text(text),
    ]))
}

async fn action(
    client: &Client,
    id: &str,
    action: &str,
    body: Value,
) -> Result<CallToolResult, ToolError> {
    client
        .computer_action(id, action, &body)
        .await
        .map_err(|e| ToolError::daemon(&e, Some(id)))?;
    Ok(json_result(json!({ "sandbox_id": id, "done": action })))
}

pub async fn click(client: &Client, a: ClickArgs) -> Result<CallToolResult, ToolError> {
    let button = a.button.unwrap_or_else(|| "left".into());
    let body = json!({ "x": a.x, "y": a.y, "button": button, "double": a.double });
    action(client, &a.sandbox_id, "mouse/click", body).await
}

pub async fn type_text(client: &Client, a: TypeArgs) -> Result<CallToolResult, ToolError> {
    action(
        client,
        &a.sandbox_id,
        "keyboard/type",
        json!({ "text": a.text }),
    )
    .await
}

pub async fn key(client: &Client, a: KeyArgs) -> Result<CallToolResult, ToolError> {
    action(
        client,
        &a.sandbox_id,
        "keyboard/press",
        json!({ "keys": a.keys }),
    )
    .await
}

pub async fn scroll(client: &Client, a: ScrollArgs) -> Result<CallToolResult, ToolError> {
    let body = json!({
        "direction": a.direction.unwrap_or_else(|| "down".into()),
        "amount": a.amount.unwrap_or(3),
        "x": a.x,
        "y": a.y,
    });
    action(client, &a.sandbox_id, "mouse/scroll", body).await
}

pub async fn launch(client: &Client, a: LaunchArgs) -> Result<CallToolResult, ToolError> {
    let t = a.target;
    let body = if t.contains("://") {
        json!({ "url": t })
    } else if t.starts_with('/') {
        json!({ "path": t })
    } else {
        json!({ "app": t })
    };
    action(client, &a.sandbox_id, "launch", body).await
}

pub async fn windows(client: &Client, a: WindowsArgs) -> Result<CallToolResult, ToolError> {
    let id = a.sandbox_id.as_str();
    let windows = client
        .windows(id)
        .await
        .map_err(|e| ToolError::daemon(&e, Some(id)))?;
    Ok(json_result(json!({ "sandbox_id": id, "windows": windows })))
}
