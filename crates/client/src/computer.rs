//! The daemon's Computer API (`/sandboxes/{id}/computer/...`): what the CLI's `sandcell
//! computer` and the MCP server's computer tools call.

use crate::{Client, ClientError, checked, form_encode};
use bytes::Bytes;
use hyper::Method;
use serde::{Deserialize, Serialize};

/// A screenshot's options (all optional: the whole screen, pointer drawn, full size).
#[derive(Debug, Clone, Default)]
pub struct ScreenshotOptions {
    /// `(x, y, width, height)`.
    pub region: Option<(u32, u32, u32, u32)>,
    /// 0 < scale <= 1.
    pub scale: Option<f64>,
    pub hide_pointer: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScreenSize {
    pub width: u32,
    pub height: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    pub x: u32,
    pub y: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub id: u64,
    pub title: String,
    pub class: String,
    pub x: i32,
    pub y: i32,
    pub width: u32,
    pub height: u32,
    pub focused: bool,
}

#[derive(Deserialize)]
struct WindowList {
    windows: Vec<Window>,
}

impl Client {
    /// A PNG of the sandbox's screen.
    pub async fn screenshot(
        &self,
        id: &str,
        opts: &ScreenshotOptions,
    ) -> Result<Bytes, ClientError> {
        let mut params = Vec::new();
        if let Some((x, y, w, h)) = opts.region {
            params.push(format!("x={x}&y={y}&width={w}&height={h}"));
        }
        if let Some(s) = opts.scale {
            params.push(format!("scale={}", form_encode(&s.to_string())));
        }
        if opts.hide_pointer {
            params.push("pointer=false".into());
        }
        let mut path = format!("/sandboxes/{}/computer/screenshot", form_encode(id));
        if !params.is_empty() {
            path = format!("{path}?{}", params.join("&"));
        }
        Ok(checked(self.api(Method::GET, &path, None).await?)?.body)
    }

    /// `POST /sandboxes/{id}/computer/{action}` with `body` (`mouse/click`, `keyboard/type`,
    /// `launch`, ...): the action is done when this returns.
    pub async fn computer_action(
        &self,
        id: &str,
        action: &str,
        body: &serde_json::Value,
    ) -> Result<(), ClientError> {
        let path = format!("/sandboxes/{}/computer/{action}", form_encode(id));
        self.call_no_content(Method::POST, &path, Some(body)).await
    }

    pub async fn screen_size(&self, id: &str) -> Result<ScreenSize, ClientError> {
        let path = format!("/sandboxes/{}/computer/screen", form_encode(id));
        self.call(Method::GET, &path, None).await
    }

    pub async fn cursor(&self, id: &str) -> Result<Point, ClientError> {
        let path = format!("/sandboxes/{}/computer/cursor", form_encode(id));
        self.call(Method::GET, &path, None).await
    }

    pub async fn windows(&self, id: &str) -> Result<Vec<Window>, ClientError> {
        let path = format!("/sandboxes/{}/computer/windows", form_encode(id));
        let list: WindowList = self.call(Method::GET, &path, None).await?;
        Ok(list.windows)
    }

    /// Focuses (`close: false`) or closes window `window`.
    pub async fn window(&self, id: &str, window: u64, close: bool) -> Result<(), ClientError> {
        let base = format!("/sandboxes/{}/computer/windows/{window}", form_encode(id));
        if close {
            self.call_no_content(Method::DELETE, &base, None).await
        } else {
            self.call_no_content(Method::POST, &format!("{base}/focus"), None)
                .await
        }
    }
}
