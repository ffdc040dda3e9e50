//! `/sandboxes/{sandboxID}/computer/...`: screenshots, mouse, keyboard, windows and
//! launching programs in a sandbox with a desktop (our extension; E2B leaves this to its
//! desktop SDK's commands). Each handler first checks that the caller owns the running
//! sandbox (another key's is 404 whatever the request holds), then parses the request and
//! calls the service.

use crate::App;
use crate::computer::commands::{self, Button, Direction, Point, Region, ScreenSize, Window};
use crate::computer::error::ComputerError;
use crate::computer::keys;
use crate::computer::service::Target;
use crate::http::error::{ApiResult, ErrorBody};
use crate::http::extract::{ApiJson, Caller};
use crate::store::State as DbState;
use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use utoipa::ToSchema;

/// The longest text typed in one call (characters).
pub const MAX_TEXT: usize = 10_000;
const MAX_DELAY_MS: u32 = 1000;
/// The longest one `keyboard/type` may type for (the service's tool timeout is 20 s).
const MAX_TYPING_MS: u64 = 15_000;
const DEFAULT_DELAY_MS: u32 = 12;
const MAX_SCROLL: u32 = 100;
const MAX_TARGET: usize = 4096;

/// The caller's running sandbox `id`.
async fn target(app: &App, caller: &Caller, id: &str) -> ApiResult<Target> {
    let row = app
        .db
        .sandbox_of_key(&caller.0.id, id)
        .await?
        .filter(|row| row.state.is_addressable())
        .ok_or_else(|| ComputerError::SandboxNotFound(id.to_string()))?;
    if row.state != DbState::Running {
        return Err(ComputerError::NotRunning {
            id: id.to_string(),
            state: row.state.as_str().to_string(),
        }
        .into());
    }
    Ok(app.computer.target(id)?)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    pub x: u32,
    pub y: u32,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClickRequest {
    /// Where to click; both or neither (then where the pointer is).
    pub x: Option<u32>,
    pub y: Option<u32>,
    #[serde(default)]
    pub button: Button,
    /// A double click.
    #[serde(default)]
    pub double: bool,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DragRequest {
    pub from: Point,
    pub to: Point,
    #[serde(default)]
    pub button: Button,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScrollRequest {
    /// Default `down`.
    pub direction: Option<Direction>,
    /// Wheel steps, 1 to 100 (default 1).
    pub amount: Option<u32>,
    /// Where to scroll; both or neither (then where the pointer is).
    pub x: Option<u32>,
    pub y: Option<u32>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TypeRequest {
    /// Up to 10000 characters, typed as keystrokes into the focused window.
    pub text: String,
    /// Between keystrokes, 0 to 1000 (default 12).
    pub delay_ms: Option<u32>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PressRequest {
    /// Pressed together: E2B's names (`ctrl`, `enter`, `page_down`), X keysyms
    /// (`Return`), `F1`-`F24`, or one character.
    pub keys: Vec<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchRequest {
    /// A desktop entry's name (`gtk-launch`: `xfce4-terminal`, `mousepad`).
    pub app: Option<String>,
    /// An `http(s)://` or `file://` URL, opened by `xdg-open`.
    pub url: Option<String>,
    /// An absolute path in the sandbox, opened by `xdg-open` with its default program.
    pub path: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WindowList {
    pub windows: Vec<Window>,
}

/// The request's body as `T`, read after the owner check: another key's sandbox is 404
/// whatever the body, and nothing about a route's body is told before that.
fn body<T: serde::de::DeserializeOwned>(raw: serde_json::Value) -> Result<T, ComputerError> {
    serde_json::from_value(raw).map_err(|e| invalid(format!("invalid request body: {e}")))
}

fn invalid(m: impl Into<String>) -> ComputerError {
    ComputerError::Invalid(m.into())
}

/// `x` and `y` both or neither.
fn point(x: Option<u32>, y: Option<u32>) -> Result<Option<Point>, ComputerError> {
    match (x, y) {
        (Some(x), Some(y)) => Ok(Some(Point { x, y })),
        (None, None) => Ok(None),
        _ => Err(invalid(
            "give both x and y, or neither (the pointer's position)",
        )),
    }
}

/// The screenshot's query: `x`, `y`, `width`, `height` (a region: all four or none),
/// `scale` (0 < scale <= 1), `pointer` (`true` unless `false`).
fn screenshot_query(
    raw: Option<&str>,
) -> Result<(Option<Region>, bool, Option<u32>), ComputerError> {
    let (mut x, mut y, mut w, mut h, mut scale, mut pointer) = (None, None, None, None, None, true);
    for (k, v) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        let num = |v: &str| {
            v.parse::<u32>()
                .map_err(|_| invalid(format!("{k}={v:?}: expected a whole number of pixels")))
        };
        match &*k {
            "x" => x = Some(num(&v)?),
            "y" => y = Some(num(&v)?),
            "width" => w = Some(num(&v)?),
            "height" => h = Some(num(&v)?),
            "scale" => {
                let s: f64 = v
                    .parse()
                    .map_err(|_| invalid(format!("scale={v:?}: expected a number")))?;
                if !(s > 0.0 && s <= 1.0) {
                    return Err(invalid(format!("scale={v}: must be above 0 and at most 1")));
                }
                // scrot scales by whole percents.
                scale = Some(((s * 100.0).round() as u32).clamp(1, 100));
            }
            "pointer" => {
                pointer = match &*v {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    _ => return Err(invalid(format!("pointer={v:?}: expected true or false"))),
                }
            }
            other => {
                return Err(invalid(format!(
                    "unknown query parameter {other:?} (x, y, width, height, scale, pointer)"
                )));
            }
        }
    }
    let region = match (x, y, w, h) {
        (None, None, None, None) => None,
        (Some(x), Some(y), Some(width), Some(height)) => Some(Region {
            x,
            y,
            width,
            height,
        }),
        _ => return Err(invalid("a region needs all of x, y, width and height")),
    };
    Ok((region, pointer, scale))
}

/// A PNG of the screen (`image/png`).
#[utoipa::path(get, path = "/sandboxes/{sandboxID}/computer/screenshot", tag = "computer",
    security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path),
        ("x" = Option<u32>, Query), ("y" = Option<u32>, Query),
        ("width" = Option<u32>, Query), ("height" = Option<u32>, Query),
        ("scale" = Option<f64>, Query, description = "0 < scale <= 1"),
        ("pointer" = Option<bool>, Query, description = "draw the pointer (default true)")),
    responses((status = 200, content_type = "image/png", description = "The screenshot"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn screenshot(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> ApiResult<Response> {
    let t = target(&app, &caller, &id).await?;
    let (region, pointer, scale) = screenshot_query(raw.as_deref())?;
    let png = app.computer.screenshot(&t, region, pointer, scale).await?;
    Ok(([(header::CONTENT_TYPE, "image/png")], png).into_response())
}

/// The screen's size.
#[utoipa::path(get, path = "/sandboxes/{sandboxID}/computer/screen", tag = "computer",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    responses((status = 200, body = ScreenSize), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn screen(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<ScreenSize>> {
    let t = target(&app, &caller, &id).await?;
    Ok(Json(app.computer.screen_size(&t).await?))
}

/// Where the pointer is.
#[utoipa::path(get, path = "/sandboxes/{sandboxID}/computer/cursor", tag = "computer",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    responses((status = 200, body = Point), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn cursor(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<Point>> {
    let t = target(&app, &caller, &id).await?;
    Ok(Json(app.computer.cursor(&t).await?))
}

/// Moves the pointer.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/computer/mouse/move", tag = "computer",
    request_body = MoveRequest, security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path)),
    responses((status = 204), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn mouse_move(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(raw): ApiJson<serde_json::Value>,
) -> ApiResult<StatusCode> {
    let t = target(&app, &caller, &id).await?;
    let req: MoveRequest = body(raw)?;
    let p = Point { x: req.x, y: req.y };
    app.computer.act(&t, &[p], commands::move_to(p)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Clicks (left unless `button` says otherwise; `double` for a double click).
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/computer/mouse/click", tag = "computer",
    request_body = ClickRequest, security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path)),
    responses((status = 204), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn mouse_click(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(raw): ApiJson<serde_json::Value>,
) -> ApiResult<StatusCode> {
    let t = target(&app, &caller, &id).await?;
    let req: ClickRequest = body(raw)?;
    let at = point(req.x, req.y)?;
    let count = if req.double { 2 } else { 1 };
    let points: Vec<Point> = at.into_iter().collect();
    app.computer
        .act(&t, &points, commands::click(at, req.button, count))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Presses at `from`, moves to `to`, releases.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/computer/mouse/drag", tag = "computer",
    request_body = DragRequest, security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path)),
    responses((status = 204), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn mouse_drag(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(raw): ApiJson<serde_json::Value>,
) -> ApiResult<StatusCode> {
    let t = target(&app, &caller, &id).await?;
    let req: DragRequest = body(raw)?;
    app.computer
        .act(
            &t,
            &[req.from, req.to],
            commands::drag(req.from, req.to, req.button),
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Turns the wheel.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/computer/mouse/scroll", tag = "computer",
    request_body = ScrollRequest, security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path)),
    responses((status = 204), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn mouse_scroll(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(raw): ApiJson<serde_json::Value>,
) -> ApiResult<StatusCode> {
    let t = target(&app, &caller, &id).await?;
    let req: ScrollRequest = body(raw)?;
    let at = point(req.x, req.y)?;
    let amount = req.amount.unwrap_or(1);
    if !(1..=MAX_SCROLL).contains(&amount) {
        return Err(invalid(format!(
            "amount {amount} is out of range: 1 to {MAX_SCROLL}"
        ))
        .into());
    }
    let points: Vec<Point> = at.into_iter().collect();
    let direction = req.direction.unwrap_or(Direction::Down);
    app.computer
        .act(&t, &points, commands::scroll(at, direction, amount))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Types text into the focused window.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/computer/keyboard/type", tag = "computer",
    request_body = TypeRequest, security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path)),
    responses((status = 204), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn keyboard_type(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(raw): ApiJson<serde_json::Value>,
) -> ApiResult<StatusCode> {
    let t = target(&app, &caller, &id).await?;
    let req: TypeRequest = body(raw)?;
    let chars = req.text.chars().count();
    if chars == 0 || chars > MAX_TEXT {
        return Err(invalid(format!("text has {chars} characters: 1 to {MAX_TEXT}")).into());
    }
    if req
        .text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(invalid(
            "text holds control characters: type Enter and Tab as \\n and \\t, press other keys \
             with POST .../keyboard/press",
        )
        .into());
    }
    let delay = req.delay_ms.unwrap_or(DEFAULT_DELAY_MS);
    if delay > MAX_DELAY_MS {
        return Err(invalid(format!(
            "delayMs {delay} is out of range: 0 to {MAX_DELAY_MS}"
        ))
        .into());
    }
    // The typing must end within the tool's time (it would be killed half typed).
    let typing_ms = (chars as u64) * u64::from(delay.max(1));
    if typing_ms > MAX_TYPING_MS {
        return Err(invalid(format!(
            "typing {chars} characters {delay} ms apart takes {} s, over the {} s one call              may take: send less text per call, or a smaller delayMs",
            typing_ms / 1000,
            MAX_TYPING_MS / 1000
        ))
        .into());
    }
    app.computer
        .act(&t, &[], commands::type_text(&req.text, delay))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Presses keys together (`["ctrl", "s"]`).
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/computer/keyboard/press", tag = "computer",
    request_body = PressRequest, security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path)),
    responses((status = 204), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn keyboard_press(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(raw): ApiJson<serde_json::Value>,
) -> ApiResult<StatusCode> {
    let t = target(&app, &caller, &id).await?;
    let req: PressRequest = body(raw)?;
    if req.keys.is_empty() || req.keys.len() > keys::MAX_KEYS {
        return Err(invalid(format!("keys: give 1 to {} key names", keys::MAX_KEYS)).into());
    }
    let combination = keys::combination(&req.keys).map_err(|bad| {
        invalid(format!(
            "unknown key name {bad:?}: use E2B's names (ctrl, alt, shift, enter, tab, esc, \
             backspace, delete, up, page_down, f1...), an X keysym (Return, Control_L) or one \
             character"
        ))
    })?;
    app.computer
        .act(&t, &[], commands::press(&combination))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The visible top-level windows.
#[utoipa::path(get, path = "/sandboxes/{sandboxID}/computer/windows", tag = "computer",
    security(("ApiKeyAuth" = [])), params(("sandboxID" = String, Path)),
    responses((status = 200, body = WindowList), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn windows(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<WindowList>> {
    let t = target(&app, &caller, &id).await?;
    Ok(Json(WindowList {
        windows: app.computer.windows(&t).await?,
    }))
}

fn window_id(raw: &str) -> Result<u64, ComputerError> {
    raw.parse::<u64>().map_err(|_| {
        invalid(format!(
            "window id {raw:?}: expected the decimal id windows lists"
        ))
    })
}

/// Raises and focuses a window.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/computer/windows/{windowID}/focus",
    tag = "computer", security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path), ("windowID" = u64, Path)),
    responses((status = 204), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn focus_window(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path((id, window)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let t = target(&app, &caller, &id).await?;
    let window = window_id(&window)?;
    app.computer
        .window(&t, window, commands::focus(window))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Closes a window: its X client is disconnected (as `xkill` does; unsaved work in it is lost).
#[utoipa::path(delete, path = "/sandboxes/{sandboxID}/computer/windows/{windowID}",
    tag = "computer", security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path), ("windowID" = u64, Path)),
    responses((status = 204), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn close_window(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path((id, window)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let t = target(&app, &caller, &id).await?;
    let window = window_id(&window)?;
    app.computer
        .window(&t, window, commands::close(window))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What a launch request starts, checked.
fn launch_command(req: &LaunchRequest) -> Result<Vec<String>, ComputerError> {
    let clean = |what: &str, v: &str| {
        if v.is_empty() || v.len() > MAX_TARGET || v.chars().any(char::is_control) {
            Err(invalid(format!(
                "{what}: 1 to {MAX_TARGET} bytes without control characters"
            )))
        } else {
            Ok(())
        }
    };
    match (&req.app, &req.url, &req.path) {
        (Some(app), None, None) => {
            let ok = app.len() <= 128
                && !app.starts_with(['-', '.'])
                && !app.is_empty()
                && app
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
            if !ok {
                return Err(invalid(format!(
                    "app {app:?}: a desktop entry's name (letters, digits, '.', '_', '-'; such \
                     as xfce4-terminal or mousepad)"
                )));
            }
            Ok(commands::launch_app(app))
        }
        (None, Some(url), None) => {
            clean("url", url)?;
            if !["http://", "https://", "file://"]
                .iter()
                .any(|s| url.len() > s.len() && url.starts_with(s))
            {
                return Err(invalid(format!(
                    "url {url:?}: http://, https:// or file:// only"
                )));
            }
            Ok(commands::open(url))
        }
        (None, None, Some(path)) => {
            clean("path", path)?;
            if !path.starts_with('/') {
                return Err(invalid(format!("path {path:?} is not absolute")));
            }
            Ok(commands::open(path))
        }
        _ => Err(invalid("give exactly one of app, url and path")),
    }
}

/// Starts a program: a desktop entry (`app`), or `xdg-open` of a URL or a file.
#[utoipa::path(post, path = "/sandboxes/{sandboxID}/computer/launch", tag = "computer",
    request_body = LaunchRequest, security(("ApiKeyAuth" = [])),
    params(("sandboxID" = String, Path)),
    responses((status = 204, description = "Started (it did not fail within 2 s)"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 502, body = ErrorBody)))]
pub async fn launch(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    ApiJson(raw): ApiJson<serde_json::Value>,
) -> ApiResult<StatusCode> {
    let t = target(&app, &caller, &id).await?;
    let req: LaunchRequest = body(raw)?;
    let cmd = launch_command(&req)?;
    app.computer.launch(&t, cmd).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn screenshot_queries_parse_and_bad_ones_say_why() {
        assert_eq!(screenshot_query(None).unwrap(), (None, true, None));
        let (region, pointer, scale) =
            screenshot_query(Some("x=1&y=2&width=3&height=4&scale=0.5&pointer=false")).unwrap();
        assert_eq!(
            region,
            Some(Region {
                x: 1,
                y: 2,
                width: 3,
                height: 4
            })
        );
        assert_eq!((pointer, scale), (false, Some(50)));
        for bad in [
            "x=1",
            "scale=0",
            "scale=2",
            "scale=nan",
            "x=-1&y=0&width=1&height=1",
            "zoom=2",
            "pointer=maybe",
        ] {
            assert!(screenshot_query(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn launches_take_exactly_one_checked_target() {
        let req = |app: Option<&str>, url: Option<&str>, path: Option<&str>| LaunchRequest {
            app: app.map(str::to_string),
            url: url.map(str::to_string),
            path: path.map(str::to_string),
        };
        assert_eq!(
            launch_command(&req(Some("mousepad"), None, None)).unwrap(),
            ["gtk-launch", "mousepad"]
        );
        assert_eq!(
            launch_command(&req(None, Some("https://example.com/"), None)).unwrap(),
            ["xdg-open", "https://example.com/"]
        );
        assert_eq!(
            launch_command(&req(None, None, Some("/home/user/a.txt"))).unwrap()[0],
            "xdg-open"
        );
        for bad in [
            req(None, None, None),
            req(Some("a"), Some("http://x"), None),
            req(Some("--help"), None, None),
            req(Some("a b"), None, None),
            req(None, Some("javascript:alert(1)"), None),
            req(None, Some("-x"), None),
            req(None, None, Some("relative.txt")),
            req(None, None, Some("/a\nb")),
        ] {
            assert!(launch_command(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn points_need_both_coordinates() {
        assert_eq!(point(None, None).unwrap(), None);
        assert_eq!(point(Some(1), Some(2)).unwrap(), Some(Point { x: 1, y: 2 }));
        assert!(point(Some(1), None).is_err());
    }
}
