//! What each Computer API call runs in the sandbox: the argument vectors (never a shell
//! line built from input: every value is one argv entry, after `--` where a tool takes
//! options) and the parsers of the tools' answers. Pure, so unit-tested without a sandbox.

use serde::Serialize;
use utoipa::ToSchema;

/// The X display the desktop template's sandboxes run (E2B's desktop SDK uses `:0` too).
pub const DISPLAY: &str = ":0";

/// A mouse button, as the API names it and as X numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, ToSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum Button {
    #[default]
    Left,
    Middle,
    Right,
}

impl Button {
    fn number(self) -> &'static str {
        match self {
            Button::Left => "1",
            Button::Middle => "2",
            Button::Right => "3",
        }
    }
}

/// Which way the wheel turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Up,
    Down,
    Left,
    Right,
}

impl Direction {
    /// X's wheel buttons.
    fn button(self) -> &'static str {
        match self {
            Direction::Up => "4",
            Direction::Down => "5",
            Direction::Left => "6",
            Direction::Right => "7",
        }
    }
}

/// A point on the screen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Serialize, ToSchema)]
pub struct Point {
    pub x: u32,
    pub y: u32,
}

/// The screen's size in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
pub struct ScreenSize {
    pub width: u32,
    pub height: u32,
}

impl ScreenSize {
    pub fn contains(&self, p: Point) -> bool {
        p.x < self.width && p.y < self.height
    }
}

/// A rectangle of the screen (a screenshot's region).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

impl Region {
    /// Whether it lies inside the screen and is not empty.
    pub fn fits(&self, screen: ScreenSize) -> bool {
        self.width > 0
            && self.height > 0
            && u64::from(self.x) + u64::from(self.width) <= u64::from(screen.width)
            && u64::from(self.y) + u64::from(self.height) <= u64::from(screen.height)
    }
}

/// A top-level window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Window {
    /// X's window id, in decimal (what the window routes take).
    pub id: u64,
    pub title: String,
    /// WM_CLASS's class part (`Mousepad`, `Xfce4-terminal`); empty when unset.
    pub class: String,
    pub x: i32,
    pub y: i32,
    pub width: u32,
    pub height: u32,
    /// The window with the keyboard focus.
    pub focused: bool,
}

fn argv(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_string()).collect()
}

pub fn screen_size() -> Vec<String> {
    argv(&["xdotool", "getdisplaygeometry"])
}

pub fn cursor() -> Vec<String> {
    argv(&["xdotool", "getmouselocation", "--shell"])
}

pub fn move_to(p: Point) -> Vec<String> {
    let (x, y) = (p.x.to_string(), p.y.to_string());
    argv(&["xdotool", "mousemove", &x, &y])
}

/// `xdotool [mousemove X Y] click --repeat N BUTTON`: the pointer moved to `at` first when
/// given, then `repeat` presses of X's button `button` (a click, or wheel steps).
fn presses_at(at: Option<Point>, repeat: &str, button: &str) -> Vec<String> {
    let mut cmd = vec!["xdotool".to_string()];
    if let Some(p) = at {
        cmd.extend(argv(&["mousemove", &p.x.to_string(), &p.y.to_string()]));
    }
    cmd.extend(argv(&["click", "--repeat", repeat, button]));
    cmd
}

/// A click (`count` 1 or 2) of `button`, at `at` when given, else where the pointer is.
pub fn click(at: Option<Point>, button: Button, count: u8) -> Vec<String> {
    presses_at(at, &count.to_string(), button.number())
}

/// Press at `from`, move to `to`, release (one xdotool run, so nothing comes between).
pub fn drag(from: Point, to: Point, button: Button) -> Vec<String> {
    let b = button.number();
    argv(&[
        "xdotool",
        "mousemove",
        &from.x.to_string(),
        &from.y.to_string(),
        "mousedown",
        b,
        "mousemove",
        &to.x.to_string(),
        &to.y.to_string(),
        "mouseup",
        b,
    ])
}

pub fn scroll(at: Option<Point>, direction: Direction, amount: u32) -> Vec<String> {
    presses_at(at, &amount.to_string(), direction.button())
}

/// Types `text` as keystrokes, `delay_ms` between them.
pub fn type_text(text: &str, delay_ms: u32) -> Vec<String> {
    argv(&[
        "xdotool",
        "type",
        "--delay",
        &delay_ms.to_string(),
        "--",
        text,
    ])
}

/// Presses the keys of `combination` (`Control_L+s`) together.
pub fn press(combination: &str) -> Vec<String> {
    argv(&["xdotool", "key", "--clearmodifiers", "--", combination])
}

/// A PNG of the screen (or `region`) into `path`; with `thumb_percent`, scrot also writes
/// the scaled copy [`thumb_path`] of it.
pub fn screenshot(
    path: &str,
    region: Option<Region>,
    pointer: bool,
    thumb_percent: Option<u32>,
) -> Vec<String> {
    let mut cmd = argv(&["scrot", "--overwrite"]);
    if pointer {
        cmd.push("--pointer".into());
    }
    if let Some(r) = region {
        cmd.push("--autoselect".into());
        cmd.push(format!("{},{},{},{}", r.x, r.y, r.width, r.height));
    }
    if let Some(p) = thumb_percent {
        cmd.push("--thumb".into());
        cmd.push(p.to_string());
    }
    cmd.push(path.to_string());
    cmd
}

/// Where scrot writes the scaled copy of a screenshot written to `path` (`x.png`: `x-thumb.png`).
pub fn thumb_path(path: &str) -> String {
    match path.strip_suffix(".png") {
        Some(stem) => format!("{stem}-thumb.png"),
        None => format!("{path}-thumb"),
    }
}

/// Every window the window manager manages (`_NET_CLIENT_LIST`) that is on the screen
/// (mapped), a line each (see [`parse_windows`]); the focused one is `_NET_ACTIVE_WINDOW`.
/// A fixed script, no input in it. Positions are xwininfo's absolute ones (xdotool's
/// getwindowgeometry counts a reparenting window manager's frame twice). Titles lose
/// their tabs and newlines. Without a display it fails with xprop's message (so the
/// desktop gets started) rather than listing nothing.
pub fn list_windows() -> Vec<String> {
    const SCRIPT: &str = r##"clients=$(xprop -root _NET_CLIENT_LIST) || exit 1
active=$(xprop -root _NET_ACTIVE_WINDOW 2>/dev/null | sed -n 's/^.*# \(0x[0-9a-fA-F]*\).*$/\1/p')
echo "focus $(( ${active:-0} ))"
case "$clients" in *"#"*) ;; *) exit 0 ;; esac
for w in $(echo "${clients#*#}" | tr ',' ' '); do
  info=$(xwininfo -id "$w" 2>/dev/null) || continue
  case "$info" in *IsViewable*) ;; *) continue ;; esac
  geo=$(echo "$info" | sed -n 's/^ *Absolute upper-left X: *\(-*[0-9]*\)$/X=\1/p; s/^ *Absolute upper-left Y: *\(-*[0-9]*\)$/Y=\1/p; s/^ *Width: *\([0-9]*\)$/WIDTH=\1/p; s/^ *Height: *\([0-9]*\)$/HEIGHT=\1/p' | tr '\n' ' ')
  class=$(xprop -id "$w" WM_CLASS 2>/dev/null | sed -n 's/^WM_CLASS([^)]*) = "[^"]*", "\(.*\)"$/\1/p')
  title=$(xdotool getwindowname "$w" 2>/dev/null | tr '\t\n' '  ')
  printf 'window\t%s\t%s\t%s\t%s\n' "$(( w ))" "$geo" "$class" "$title"
done"##;
    argv(&["/bin/sh", "-c", SCRIPT])
}

pub fn focus(window: u64) -> Vec<String> {
    argv(&["xdotool", "windowactivate", &window.to_string()])
}

/// Disconnects the window's X client (as `xkill` does): the program usually exits.
pub fn close(window: u64) -> Vec<String> {
    argv(&["xdotool", "windowkill", &window.to_string()])
}

/// `gtk-launch APP` (a desktop entry's name).
pub fn launch_app(app: &str) -> Vec<String> {
    argv(&["gtk-launch", app])
}

/// `xdg-open TARGET` (a URL or a file).
pub fn open(target: &str) -> Vec<String> {
    argv(&["xdg-open", target])
}

/// Whether `xdpyinfo` finds the display: the probe for a started desktop.
pub fn display_ready() -> Vec<String> {
    argv(&["xdpyinfo", "-display", DISPLAY])
}

/// The X server, as E2B's desktop SDK starts it.
pub fn start_x(size: ScreenSize) -> Vec<String> {
    let screen = format!("{}x{}x24", size.width, size.height);
    argv(&[
        "Xvfb",
        DISPLAY,
        "-ac",
        "-screen",
        "0",
        &screen,
        "-retro",
        "-dpi",
        "96",
        "-nolisten",
        "tcp",
        "-nolisten",
        "unix",
    ])
}

pub fn start_session() -> Vec<String> {
    argv(&["startxfce4"])
}

/// Exits 0 once the session's window manager and desktop run (the SDK waits for the same).
pub fn session_ready() -> Vec<String> {
    argv(&[
        "/bin/sh",
        "-c",
        "pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null && pgrep -x xfdesktop >/dev/null",
    ])
}

/// `W H` from `xdotool getdisplaygeometry`.
pub fn parse_screen_size(out: &str) -> Option<ScreenSize> {
    let mut parts = out.split_whitespace();
    let width = parts.next()?.parse().ok()?;
    let height = parts.next()?.parse().ok()?;
    (parts.next().is_none() && width > 0 && height > 0).then_some(ScreenSize { width, height })
}

/// `X=..`, `Y=..` lines of `xdotool getmouselocation --shell`.
pub fn parse_cursor(out: &str) -> Option<Point> {
    let (mut x, mut y) = (None, None);
    for line in out.lines() {
        match line.split_once('=') {
            Some(("X", v)) => x = v.trim().parse().ok(),
            Some(("Y", v)) => y = v.trim().parse().ok(),
            _ => {}
        }
    }
    Some(Point { x: x?, y: y? })
}

/// The most windows listed.
pub const MAX_WINDOWS: usize = 500;
/// The longest title kept (characters).
const MAX_TITLE: usize = 1024;

/// What [`list_windows`] printed. Lines that do not parse are skipped (a window that closed
/// between the search and its geometry).
pub fn parse_windows(out: &str) -> Vec<Window> {
    let mut focus = 0u64;
    let mut windows = Vec::new();
    for line in out.lines() {
        if let Some(f) = line.strip_prefix("focus ") {
            focus = f.trim().parse().unwrap_or(0);
            continue;
        }
        let mut fields = line.splitn(5, '\t');
        let (Some("window"), Some(id), Some(geo), Some(class), title) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let Ok(id) = id.parse::<u64>() else { continue };
        let field = |name: &str| {
            geo.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        };
        let (Some(x), Some(y), Some(w), Some(h)) = (
            field("X").and_then(|v| v.parse().ok()),
            field("Y").and_then(|v| v.parse().ok()),
            field("WIDTH").and_then(|v| v.parse().ok()),
            field("HEIGHT").and_then(|v| v.parse().ok()),
        ) else {
            continue;
        };
        windows.push(Window {
            id,
            title: title.unwrap_or("").trim().chars().take(MAX_TITLE).collect(),
            class: class.trim().chars().take(MAX_TITLE).collect(),
            x,
            y,
            width: w,
            height: h,
            focused: id == focus,
        });
        if windows.len() == MAX_WINDOWS {
            break;
        }
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_is_one_argument_after_the_options() {
        let cmd = type_text("-rf; $(reboot)", 12);
        assert_eq!(
            cmd,
            ["xdotool", "type", "--delay", "12", "--", "-rf; $(reboot)"]
        );
        assert_eq!(
            press("Control_L+s"),
            ["xdotool", "key", "--clearmodifiers", "--", "Control_L+s"]
        );
    }

    #[test]
    fn clicks_move_first_and_repeat() {
        let p = Point { x: 10, y: 20 };
        assert_eq!(
            click(Some(p), Button::Right, 2),
            [
                "xdotool",
                "mousemove",
                "10",
                "20",
                "click",
                "--repeat",
                "2",
                "3"
            ]
        );
        assert_eq!(
            click(None, Button::Left, 1),
            ["xdotool", "click", "--repeat", "1", "1"]
        );
        assert_eq!(
            scroll(None, Direction::Up, 3),
            ["xdotool", "click", "--repeat", "3", "4"]
        );
    }

    #[test]
    fn screenshots_name_region_and_thumbnail() {
        let r = Region {
            x: 1,
            y: 2,
            width: 30,
            height: 40,
        };
        assert_eq!(
            screenshot("/tmp/s.png", Some(r), true, Some(50)),
            [
                "scrot",
                "--overwrite",
                "--pointer",
                "--autoselect",
                "1,2,30,40",
                "--thumb",
                "50",
                "/tmp/s.png"
            ]
        );
        assert_eq!(thumb_path("/tmp/s.png"), "/tmp/s-thumb.png");
    }

    #[test]
    fn regions_must_fit_the_screen() {
        let screen = ScreenSize {
            width: 1024,
            height: 768,
        };
        assert!(
            Region {
                x: 0,
                y: 0,
                width: 1024,
                height: 768
            }
            .fits(screen)
        );
        assert!(
            !Region {
                x: 1,
                y: 0,
                width: 1024,
                height: 768
            }
            .fits(screen)
        );
        assert!(
            !Region {
                x: 0,
                y: 0,
                width: 0,
                height: 10
            }
            .fits(screen)
        );
        assert!(
            !Region {
                x: u32::MAX,
                y: 0,
                width: 2,
                height: 10
            }
            .fits(screen)
        );
        assert!(screen.contains(Point { x: 1023, y: 767 }));
        assert!(!screen.contains(Point { x: 1024, y: 0 }));
    }

    #[test]
    fn tool_answers_parse() {
        assert_eq!(
            parse_screen_size("1024 768\n"),
            Some(ScreenSize {
                width: 1024,
                height: 768
            })
        );
        assert_eq!(parse_screen_size("1024\n"), None);
        assert_eq!(parse_screen_size("0 0"), None);
        assert_eq!(
            parse_cursor("X=321\nY=234\nSCREEN=0\nWINDOW=123\n"),
            Some(Point { x: 321, y: 234 })
        );
        assert_eq!(parse_cursor("X=1\n"), None);
    }

    #[test]
    fn windows_parse_and_bad_lines_are_skipped() {
        let out = "focus 41943044\n\
            window\t41943044\tX=10 Y=20 WIDTH=640 HEIGHT=480 \tMousepad\tnote.txt - Mousepad \n\
            window\tnot-a-number\tX=1\tA\tB\n\
            window\t12\tX=1 Y=2\tA\tno size\n\
            window\t7\tX=-5 Y=0 WIDTH=1024 HEIGHT=30 \t\t\n";
        let w = parse_windows(out);
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].id, 41943044);
        assert_eq!(
            (w[0].x, w[0].y, w[0].width, w[0].height),
            (10, 20, 640, 480)
        );
        assert_eq!(w[0].class, "Mousepad");
        assert_eq!(w[0].title, "note.txt - Mousepad");
        assert!(w[0].focused);
        assert_eq!((w[1].x, w[1].title.as_str(), w[1].focused), (-5, "", false));
    }
}
