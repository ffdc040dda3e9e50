//! `sandcell computer ...`: the daemon's Computer API (crates/server computer/) from the
//! command line: screenshots, the mouse, the keyboard, windows and launching programs in a
//! sandbox with a desktop (the `desktop` template).

use crate::daemon::Target;
use crate::sandboxes::{EXIT_FAILED, EXIT_USAGE, fail};
use sandcell_client::{ClientError, ScreenshotOptions};
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum ComputerCommand {
    /// Save a PNG of the screen (`-o -` writes it to stdout)
    Screenshot {
        #[arg(value_name = "ID")]
        id: String,
        #[arg(
            short = 'o',
            long = "output",
            default_value = "screenshot.png",
            value_name = "FILE"
        )]
        output: PathBuf,
        /// Only this part of the screen
        #[arg(long, value_name = "X,Y,WIDTH,HEIGHT", value_parser = parse_region)]
        region: Option<(u32, u32, u32, u32)>,
        /// Scaled down (0 < SCALE <= 1)
        #[arg(long, value_name = "SCALE")]
        scale: Option<f64>,
        /// Without the pointer drawn in
        #[arg(long)]
        no_pointer: bool,
    },
    /// Click (left unless --button says otherwise), at X Y or where the pointer is
    Click {
        #[arg(value_name = "ID")]
        id: String,
        x: Option<u32>,
        y: Option<u32>,
        #[arg(long, default_value = "left", value_parser = ["left", "middle", "right"])]
        button: String,
        #[arg(long)]
        double: bool,
    },
    /// Move the pointer
    Move {
        #[arg(value_name = "ID")]
        id: String,
        x: u32,
        y: u32,
    },
    /// Press at X1 Y1, move to X2 Y2, release
    Drag {
        #[arg(value_name = "ID")]
        id: String,
        x1: u32,
        y1: u32,
        x2: u32,
        y2: u32,
    },
    /// Turn the mouse wheel
    Scroll {
        #[arg(value_name = "ID")]
        id: String,
        #[arg(default_value = "down", value_parser = ["up", "down", "left", "right"])]
        direction: String,
        #[arg(long, default_value_t = 1)]
        amount: u32,
    },
    /// Type text into the focused window
    Type {
        #[arg(value_name = "ID")]
        id: String,
        text: String,
    },
    /// Press keys together: `ctrl+s`, `enter`, `alt+F4` (the `+` key itself: `ctrl+plus`)
    Key {
        #[arg(value_name = "ID")]
        id: String,
        #[arg(value_name = "KEYS")]
        keys: String,
    },
    /// List the visible windows
    Windows {
        #[arg(value_name = "ID")]
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Focus a window (its id from `windows`)
    Focus {
        #[arg(value_name = "ID")]
        id: String,
        window: u64,
    },
    /// Close a window (its program is disconnected from the display)
    Close {
        #[arg(value_name = "ID")]
        id: String,
        window: u64,
    },
    /// Start a program: a desktop entry (`xfce4-terminal`), or open a URL or a file
    Launch {
        #[arg(value_name = "ID")]
        id: String,
        /// A desktop entry's name, an http(s):// or file:// URL, or an absolute path
        #[arg(value_name = "APP|URL|PATH")]
        what: String,
    },
    /// The screen's size and the pointer's position
    Screen {
        #[arg(value_name = "ID")]
        id: String,
        #[arg(long)]
        json: bool,
    },
}

fn parse_region(s: &str) -> Result<(u32, u32, u32, u32), String> {
    let n: Vec<u32> = s
        .split(',')
        .map(|v| v.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("{s:?}: expected X,Y,WIDTH,HEIGHT in pixels"))?;
    match n[..] {
        [x, y, w, h] => Ok((x, y, w, h)),
        _ => Err(format!("{s:?}: expected four numbers, X,Y,WIDTH,HEIGHT")),
    }
}

pub async fn run(target: &Target, command: ComputerCommand) -> i32 {
    match command_result(target, command).await {
        Ok(code) => code,
        Err((e, id)) => fail(&target.explain(&e, Some(&id)), EXIT_FAILED),
    }
}

async fn command_result(
    target: &Target,
    command: ComputerCommand,
) -> Result<i32, (ClientError, String)> {
    let c = &target.client;
    let with = |id: &str| {
        let id = id.to_string();
        move |e: ClientError| (e, id)
    };
    match command {
        ComputerCommand::Screenshot {
            id,
            output,
            region,
            scale,
            no_pointer,
        } => {
            let opts = ScreenshotOptions {
                region,
                scale,
                hide_pointer: no_pointer,
            };
            let png = c.screenshot(&id, &opts).await.map_err(with(&id))?;
            if output.as_os_str() == "-" {
                use std::io::Write;
                let mut out = std::io::stdout().lock();
                if let Err(e) = out.write_all(&png).and_then(|()| out.flush()) {
                    return Ok(fail(
                        &format!("writing the screenshot to stdout: {e}"),
                        EXIT_FAILED,
                    ));
                }
            } else if let Err(e) = std::fs::write(&output, &png) {
                return Ok(fail(
                    &format!("writing the screenshot to {}: {e}", output.display()),
                    EXIT_FAILED,
                ));
            } else {
                eprintln!("{} ({} bytes)", output.display(), png.len());
            }
        }
        ComputerCommand::Click {
            id,
            x,
            y,
            button,
            double,
        } => {
            if x.is_some() != y.is_some() {
                return Ok(fail("click: give both X and Y, or neither", EXIT_USAGE));
            }
            let body = json!({ "x": x, "y": y, "button": button, "double": double });
            c.computer_action(&id, "mouse/click", &body)
                .await
                .map_err(with(&id))?;
        }
        ComputerCommand::Move { id, x, y } => {
            let body = json!({ "x": x, "y": y });
            c.computer_action(&id, "mouse/move", &body)
                .await
                .map_err(with(&id))?;
        }
        ComputerCommand::Drag { id, x1, y1, x2, y2 } => {
            let body = json!({ "from": { "x": x1, "y": y1 }, "to": { "x": x2, "y": y2 } });
            c.computer_action(&id, "mouse/drag", &body)
                .await
                .map_err(with(&id))?;
        }
        ComputerCommand::Scroll {
            id,
            direction,
            amount,
        } => {
            let body = json!({ "direction": direction, "amount": amount });
            c.computer_action(&id, "mouse/scroll", &body)
                .await
                .map_err(with(&id))?;
        }
        ComputerCommand::Type { id, text } => {
            let body = json!({ "text": text });
            c.computer_action(&id, "keyboard/type", &body)
                .await
                .map_err(with(&id))?;
        }
        ComputerCommand::Key { id, keys } => {
            let keys: Vec<&str> = keys.split('+').collect();
            let body = json!({ "keys": keys });
            c.computer_action(&id, "keyboard/press", &body)
                .await
                .map_err(with(&id))?;
        }
        ComputerCommand::Windows { id, json } => {
            let windows = c.windows(&id).await.map_err(with(&id))?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&windows).unwrap_or_default()
                );
            } else {
                println!(
                    "{:<12} {:<10} {:<20} {:<24} TITLE",
                    "WINDOW", "FOCUSED", "CLASS", "GEOMETRY"
                );
                for w in windows {
                    let geo = format!("{}x{}+{}+{}", w.width, w.height, w.x, w.y);
                    let focused = if w.focused { "yes" } else { "" };
                    println!(
                        "{:<12} {:<10} {:<20} {:<24} {}",
                        w.id, focused, w.class, geo, w.title
                    );
                }
            }
        }
        // A 404 here is as often the window as the sandbox: the daemon's message says which.
        ComputerCommand::Focus { id, window } => {
            if let Err(e) = c.window(&id, window, false).await {
                return Ok(fail(&target.explain(&e, None), EXIT_FAILED));
            }
        }
        ComputerCommand::Close { id, window } => {
            if let Err(e) = c.window(&id, window, true).await {
                return Ok(fail(&target.explain(&e, None), EXIT_FAILED));
            }
        }
        ComputerCommand::Launch { id, what } => {
            let body = if what.contains("://") {
                json!({ "url": what })
            } else if what.starts_with('/') {
                json!({ "path": what })
            } else {
                json!({ "app": what })
            };
            c.computer_action(&id, "launch", &body)
                .await
                .map_err(with(&id))?;
        }
        ComputerCommand::Screen { id, json } => {
            let size = c.screen_size(&id).await.map_err(with(&id))?;
            let cursor = c.cursor(&id).await.map_err(with(&id))?;
            if json {
                let v = json!({ "width": size.width, "height": size.height, "cursor": cursor });
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                println!(
                    "screen {}x{}, pointer at {},{}",
                    size.width, size.height, cursor.x, cursor.y
                );
            }
        }
    }
    Ok(0)
}
