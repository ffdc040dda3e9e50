//! The Computer API's service: each call becomes one tool run in the sandbox through its
//! agent (commands.rs says which), with `DISPLAY` set, as the sandbox's default user (the
//! one E2B's desktop SDK runs its commands as, so both drive the same session).
//!
//! A sandbox of the `desktop` template whose display nobody started (a create through curl
//! or the CLI rather than E2B's SDK, which starts it itself) gets it started at the first
//! call that finds no display: Xvfb and the xfce4 session, as the SDK starts them, then the
//! call again.

use crate::computer::commands::{self, Point, Region, ScreenSize, Window};
use crate::computer::error::ComputerError;
use crate::sandboxes::service::{Live, SandboxService};
use crate::util::random_hex;
use sandcell_envd_client::{ClientError, decode_data};
use sandcell_proto::agent::{Event, ProcessConfig, StartRequest};
use sandcell_runtime::agent_client;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// A tool's whole run (xdotool, scrot, the window listing).
const TOOL_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a launched program gets to fail before it counts as started.
const LAUNCH_GRACE: Duration = Duration::from_secs(2);
/// Xvfb to answer, then the session's three programs to run (the SDK's own limits).
const X_START_TIMEOUT: Duration = Duration::from_secs(10);
const SESSION_START_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(250);
/// The most output kept of a tool (the window list is the largest).
const MAX_OUTPUT: usize = 1 << 20;
/// The largest screenshot read back (a 4K screen's PNG is well under; the Rust client
/// reads answers up to the same size).
pub const MAX_SCREENSHOT: usize = 16 << 20;
/// Any one call to the agent besides a tool's run (start, signal, file read, remove): a
/// guest can make a file read block (a FIFO where the screenshot should be).
const AGENT_CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Largest event message read from the agent.
const MAX_ENVELOPE: usize = 2 << 20;
/// The screen a desktop started here gets (the SDK's default).
const DEFAULT_SCREEN: ScreenSize = ScreenSize {
    width: 1024,
    height: 768,
};

/// What a tool printed, once it exited 0.
struct Output {
    stdout: String,
}

/// How a run ended within its time.
enum Ran {
    Exited {
        status: i32,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    },
    /// Still running at the deadline (left running: a launched program).
    Running,
}

pub struct ComputerService {
    lifecycle: Arc<SandboxService>,
    /// One desktop start at a time per sandbox.
    starting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// One call's sandbox: its id and how to reach its agent.
pub struct Target {
    pub id: String,
    live: Arc<Live>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A tool's non-zero exit, with the start of what it printed on stderr.
fn failed(t: &Target, cmd: &[String], status: i32, stderr: &[u8]) -> ComputerError {
    ComputerError::Tool {
        id: t.id.clone(),
        what: cmd.first().cloned().unwrap_or_default(),
        status,
        // The guest's words: control characters (newlines, terminal escapes) become spaces, so
        // that they can neither forge log lines nor mislead a terminal.
        stderr: String::from_utf8_lossy(stderr)
            .trim()
            .chars()
            .take(2000)
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect(),
    }
}

/// Whether a failed X tool said it found no display (xdotool, scrot, xdpyinfo, xprop).
fn no_display(stderr: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    s.contains("can't open display")
        || s.contains("cannot open display")
        || s.contains("unable to open display")
        || s.contains("can't open x display")
        || s.contains("failed creating new xdo instance")
}

impl ComputerService {
    pub fn new(lifecycle: Arc<SandboxService>) -> ComputerService {
        ComputerService {
            lifecycle,
            starting: Mutex::new(HashMap::new()),
        }
    }

    /// The running sandbox `id` (the caller's: the API checked the owner).
    pub fn target(&self, id: &str) -> Result<Target, ComputerError> {
        let live = self
            .lifecycle
            .live(id)
            .ok_or_else(|| ComputerError::SandboxNotFound(id.to_string()))?;
        Ok(Target {
            id: id.to_string(),
            live,
        })
    }

    /// Runs `cmd` until it exits or `limit` passes; at the limit it is killed when `kill`.
    async fn run_for(
        &self,
        t: &Target,
        cmd: &[String],
        limit: Duration,
        kill: bool,
    ) -> Result<Ran, ComputerError> {
        let (program, args) = cmd
            .split_first()
            .ok_or_else(|| ComputerError::Invalid("empty command".into()))?;
        let what = program.clone();
        let agent_err = |source: ClientError| ComputerError::Agent {
            id: t.id.clone(),
            what: what.clone(),
            source: Box::new(source),
        };
        let client = agent_client(t.live.sandbox.clone())
            .with_access_token(t.live.access_token.clone())
            .with_max_envelope(MAX_ENVELOPE);
        let req = StartRequest {
            process: ProcessConfig {
                cmd: program.clone(),
                args: args.to_vec(),
                // GTK programs (gtk-launch, the session) otherwise warn on stderr about the
                // accessibility bus the image has no service for.
                envs: [
                    ("DISPLAY".to_string(), commands::DISPLAY.to_string()),
                    ("NO_AT_BRIDGE".to_string(), "1".to_string()),
                ]
                .into(),
                cwd: None,
            },
            stdin: Some(false),
            tag: None,
        };
        let started = tokio::time::timeout(AGENT_CALL_TIMEOUT, client.start(&req)).await;
        let started = started.map_err(|_| ComputerError::Timeout {
            id: t.id.clone(),
            what: format!("starting {what}"),
            secs: AGENT_CALL_TIMEOUT.as_secs(),
        })?;
        let mut stream = match started {
            Ok(stream) => stream,
            Err(e) if e.code() == Some("not_found") => {
                return Err(ComputerError::NoDesktop(t.id.clone(), program.clone()));
            }
            Err(e) => return Err(agent_err(e)),
        };
        let deadline = Instant::now() + limit;
        let (mut pid, mut stdout, mut stderr) = (None, Vec::new(), Vec::new());
        loop {
            let next = match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(next) => next,
                Err(_) => {
                    if kill && let Some(pid) = pid {
                        let kill = client.send_signal(pid, libc::SIGKILL);
                        let _ = tokio::time::timeout(AGENT_CALL_TIMEOUT, kill).await;
                    }
                    if kill {
                        return Err(ComputerError::Timeout {
                            id: t.id.clone(),
                            what,
                            secs: limit.as_secs(),
                        });
                    }
                    return Ok(Ran::Running);
                }
            };
            let event = match next {
                None => {
                    return Err(ComputerError::Tool {
                        id: t.id.clone(),
                        what,
                        status: -1,
                        stderr: "the agent's stream closed without an end event".into(),
                    });
                }
                Some(Err(e)) if e.code() == Some("not_found") => {
                    return Err(ComputerError::NoDesktop(t.id.clone(), program.clone()));
                }
                Some(Err(e)) => return Err(agent_err(e)),
                Some(Ok(ev)) => ev.event,
            };
            match event {
                Event::Start(s) => pid = Some(s.pid),
                Event::Data(d) => {
                    let (kind, bytes) = decode_data(&d).map_err(agent_err)?;
                    if stdout.len() + stderr.len() + bytes.len() > MAX_OUTPUT {
                        return Err(agent_err(ClientError::TooLarge {
                            what: format!("{what}'s output"),
                            max: MAX_OUTPUT,
                        }));
                    }
                    match kind {
                        sandcell_envd_client::OutputKind::Stderr => stderr.extend(bytes),
                        _ => stdout.extend(bytes),
                    }
                }
                Event::End(end) => {
                    return Ok(Ran::Exited {
                        status: end.shell_status(),
                        stdout,
                        stderr,
                    });
                }
                Event::Keepalive(_) => {}
            }
        }
    }

    /// Runs a tool to its end; a non-zero exit is an error with what it printed.
    async fn tool_once(&self, t: &Target, cmd: &[String]) -> Result<Output, ComputerError> {
        match self.run_for(t, cmd, TOOL_TIMEOUT, true).await? {
            Ran::Exited {
                status: 0, stdout, ..
            } => Ok(Output {
                stdout: String::from_utf8_lossy(&stdout).into_owned(),
            }),
            Ran::Exited { status, stderr, .. } => Err(failed(t, cmd, status, &stderr)),
            Ran::Running => Err(ComputerError::Timeout {
                id: t.id.clone(),
                what: cmd.first().cloned().unwrap_or_default(),
                secs: TOOL_TIMEOUT.as_secs(),
            }),
        }
    }

    /// [`Self::tool_once`], with the desktop started first if the tool found no display.
    async fn tool(&self, t: &Target, cmd: &[String]) -> Result<Output, ComputerError> {
        match self.tool_once(t, cmd).await {
            Err(ComputerError::Tool { stderr, .. }) if no_display(&stderr) => {
                self.start_desktop(t).await?;
                self.tool_once(t, cmd).await
            }
            other => other,
        }
    }

    /// Starts Xvfb and the xfce4 session unless the display answers already.
    async fn start_desktop(&self, t: &Target) -> Result<(), ComputerError> {
        let gate = lock(&self.starting)
            .entry(t.id.clone())
            .or_default()
            .clone();
        let result = {
            let _one = gate.lock().await;
            self.start_desktop_now(t).await
        };
        // Forgotten once nobody else waits on it (the map's reference and ours are left):
        // a caller queued behind this start reuses the same gate.
        {
            let mut starting = lock(&self.starting);
            if Arc::strong_count(&gate) <= 2 {
                starting.remove(&t.id);
            }
        }
        result
    }

    async fn start_desktop_now(&self, t: &Target) -> Result<(), ComputerError> {
        let failed = |why: String| ComputerError::DesktopDidNotStart {
            id: t.id.clone(),
            why,
        };
        if self.succeeds(t, &commands::display_ready()).await? {
            // Started by someone else meanwhile, or only the session is missing.
            if self.succeeds(t, &commands::session_ready()).await? {
                return Ok(());
            }
        } else {
            tracing::info!(sandbox = %t.id, "computer API: starting the sandbox's desktop");
            self.spawn(t, &commands::start_x(DEFAULT_SCREEN)).await?;
            if !self
                .wait_for(t, &commands::display_ready(), X_START_TIMEOUT)
                .await?
            {
                return Err(failed(format!(
                    "Xvfb did not answer within {} s",
                    X_START_TIMEOUT.as_secs()
                )));
            }
        }
        self.spawn(t, &commands::start_session()).await?;
        if !self
            .wait_for(t, &commands::session_ready(), SESSION_START_TIMEOUT)
            .await?
        {
            return Err(failed(format!(
                "the xfce4 session did not start within {} s",
                SESSION_START_TIMEOUT.as_secs()
            )));
        }
        Ok(())
    }

    /// Starts `cmd` and leaves it running (a server, a session, a launched program); it is
    /// an error when it exits non-zero within [`LAUNCH_GRACE`].
    async fn spawn(&self, t: &Target, cmd: &[String]) -> Result<(), ComputerError> {
        match self.run_for(t, cmd, LAUNCH_GRACE, false).await? {
            Ran::Running | Ran::Exited { status: 0, .. } => Ok(()),
            Ran::Exited { status, stderr, .. } => Err(failed(t, cmd, status, &stderr)),
        }
    }

    async fn succeeds(&self, t: &Target, cmd: &[String]) -> Result<bool, ComputerError> {
        match self.run_for(t, cmd, TOOL_TIMEOUT, true).await? {
            Ran::Exited { status, .. } => Ok(status == 0),
            Ran::Running => Ok(false),
        }
    }

    async fn wait_for(
        &self,
        t: &Target,
        cmd: &[String],
        limit: Duration,
    ) -> Result<bool, ComputerError> {
        let deadline = Instant::now() + limit;
        loop {
            if self.succeeds(t, cmd).await? {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(POLL).await;
        }
    }

    pub async fn screen_size(&self, t: &Target) -> Result<ScreenSize, ComputerError> {
        let out = self.tool(t, &commands::screen_size()).await?;
        commands::parse_screen_size(&out.stdout).ok_or_else(|| ComputerError::Tool {
            id: t.id.clone(),
            what: "xdotool getdisplaygeometry".into(),
            status: 0,
            stderr: format!("unexpected answer {:?}", out.stdout.trim()),
        })
    }

    pub async fn cursor(&self, t: &Target) -> Result<Point, ComputerError> {
        let out = self.tool(t, &commands::cursor()).await?;
        commands::parse_cursor(&out.stdout).ok_or_else(|| ComputerError::Tool {
            id: t.id.clone(),
            what: "xdotool getmouselocation".into(),
            status: 0,
            stderr: format!("unexpected answer {:?}", out.stdout.trim()),
        })
    }

    /// Refuses points off the screen (xdotool would clamp them to its edge silently).
    async fn on_screen(&self, t: &Target, points: &[Point]) -> Result<(), ComputerError> {
        if points.is_empty() {
            return Ok(());
        }
        let screen = self.screen_size(t).await?;
        match points.iter().find(|p| !screen.contains(**p)) {
            None => Ok(()),
            Some(p) => Err(ComputerError::Invalid(format!(
                "({}, {}) is off the screen: it is {}x{} (x from 0 to {}, y from 0 to {})",
                p.x,
                p.y,
                screen.width,
                screen.height,
                screen.width - 1,
                screen.height - 1
            ))),
        }
    }

    /// Runs an input action whose points must be on the screen.
    pub async fn act(
        &self,
        t: &Target,
        points: &[Point],
        cmd: Vec<String>,
    ) -> Result<(), ComputerError> {
        self.on_screen(t, points).await?;
        self.tool(t, &cmd).await.map(|_| ())
    }

    /// A PNG of the screen, or of `region`, scaled to `percent` when it is below 100.
    pub async fn screenshot(
        &self,
        t: &Target,
        region: Option<Region>,
        pointer: bool,
        percent: Option<u32>,
    ) -> Result<Vec<u8>, ComputerError> {
        if let Some(r) = region {
            let screen = self.screen_size(t).await?;
            if !r.fits(screen) {
                return Err(ComputerError::Invalid(format!(
                    "the region {}x{} at ({}, {}) is not inside the {}x{} screen",
                    r.width, r.height, r.x, r.y, screen.width, screen.height
                )));
            }
        }
        let token = random_hex(8).map_err(crate::error::Error::io("getrandom for a screenshot"))?;
        let path = format!("/tmp/sandcell-screenshot-{token}.png");
        let thumb = percent.filter(|p| *p < 100);
        let cmd = commands::screenshot(&path, region, pointer, thumb);
        let result = self.screenshot_to(t, &cmd, &path, thumb.is_some()).await;
        let client =
            agent_client(t.live.sandbox.clone()).with_access_token(t.live.access_token.clone());
        let _ = tokio::time::timeout(AGENT_CALL_TIMEOUT, client.remove(&path)).await;
        if thumb.is_some() {
            let thumb = commands::thumb_path(&path);
            let _ = tokio::time::timeout(AGENT_CALL_TIMEOUT, client.remove(&thumb)).await;
        }
        result
    }

    async fn screenshot_to(
        &self,
        t: &Target,
        cmd: &[String],
        path: &str,
        thumb: bool,
    ) -> Result<Vec<u8>, ComputerError> {
        self.tool(t, cmd).await?;
        let read = if thumb {
            commands::thumb_path(path)
        } else {
            path.to_string()
        };
        let client =
            agent_client(t.live.sandbox.clone()).with_access_token(t.live.access_token.clone());
        let agent_err = |source| ComputerError::Agent {
            id: t.id.clone(),
            what: format!("reading the screenshot {read}"),
            source: Box::new(source),
        };
        let read_all = async {
            client
                .read_file(&read)
                .await
                .map_err(agent_err)?
                .to_vec(MAX_SCREENSHOT)
                .await
                .map_err(agent_err)
        };
        let png = tokio::time::timeout(AGENT_CALL_TIMEOUT, read_all)
            .await
            .map_err(|_| ComputerError::Timeout {
                id: t.id.clone(),
                what: format!("reading the screenshot {read}"),
                secs: AGENT_CALL_TIMEOUT.as_secs(),
            })??;
        if !png.starts_with(b"\x89PNG\r\n\x1a\n") {
            return Err(ComputerError::Tool {
                id: t.id.clone(),
                what: "scrot".into(),
                status: 0,
                stderr: format!("{read} is not a PNG"),
            });
        }
        Ok(png)
    }

    pub async fn windows(&self, t: &Target) -> Result<Vec<Window>, ComputerError> {
        let out = self.tool(t, &commands::list_windows()).await?;
        Ok(commands::parse_windows(&out.stdout))
    }

    /// Focuses or closes window `window` (refused when it is not on the screen).
    pub async fn window(
        &self,
        t: &Target,
        window: u64,
        cmd: Vec<String>,
    ) -> Result<(), ComputerError> {
        if !self.windows(t).await?.iter().any(|w| w.id == window) {
            return Err(ComputerError::NoWindow {
                id: t.id.clone(),
                window,
            });
        }
        self.tool(t, &cmd).await.map(|_| ())
    }

    /// Starts a program (gtk-launch, xdg-open) and leaves it running.
    pub async fn launch(&self, t: &Target, cmd: Vec<String>) -> Result<(), ComputerError> {
        // The display first: a launch into no display fails late and says little.
        if !self.succeeds(t, &commands::display_ready()).await? {
            self.start_desktop(t).await?;
        }
        match self.spawn(t, &cmd).await {
            Err(ComputerError::Tool { stderr, .. }) if stderr.contains("no such application") => {
                Err(ComputerError::Invalid(format!(
                    "no application {:?} in sandbox {}: `app` names a desktop entry \
                     (/usr/share/applications/NAME.desktop), such as xfce4-terminal or mousepad",
                    cmd.last().cloned().unwrap_or_default(),
                    t.id
                )))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::no_display;

    #[test]
    fn the_tools_missing_display_messages_are_recognised() {
        assert!(no_display(
            "Error: Can't open display: :0\nFailed creating new xdo instance"
        ));
        assert!(no_display(
            "scrot: Can't open X display. It *is* running, yeah?"
        ));
        assert!(no_display(
            "giblib error: Can't open X display. It *is* running, yeah?"
        ));
        assert!(no_display("xdpyinfo:  unable to open display \":0\"."));
        assert!(!no_display(
            "X Error of failed request:  BadWindow (invalid Window parameter)"
        ));
    }
}
