//! What a Computer API call fails with. The service returns it; http/error.rs alone makes
//! it an HTTP answer.

#[derive(Debug, thiserror::Error)]
pub enum ComputerError {
    #[error("sandbox \"{0}\" doesn't exist or you don't have access to it")]
    SandboxNotFound(String),
    #[error("sandbox {id} is {state}: the computer API needs it running (resume it first)")]
    NotRunning { id: String, state: String },
    /// The sandbox has no `xdotool`/`scrot`/`Xvfb`.
    #[error(
        "sandbox {0}'s template has no desktop ({1} is not in it): create the sandbox from the \
         `desktop` template, or a template built on it"
    )]
    NoDesktop(String, String),
    /// Input the API refuses before anything runs.
    #[error("{0}")]
    Invalid(String),
    #[error("no window {window} on sandbox {id}'s screen (GET .../computer/windows lists them)")]
    NoWindow { id: String, window: u64 },
    #[error("sandbox {id}: starting its desktop failed: {why}")]
    DesktopDidNotStart { id: String, why: String },
    /// A tool in the sandbox failed (its exit status and what it printed).
    #[error("sandbox {id}: {what} failed (exit status {status}): {stderr}")]
    Tool {
        id: String,
        what: String,
        status: i32,
        stderr: String,
    },
    #[error("sandbox {id}: {what} did not finish within {secs} s")]
    Timeout { id: String, what: String, secs: u64 },
    /// The sandbox's agent could not be reached or answered nonsense.
    #[error("sandbox {id}: {what}: {source}")]
    Agent {
        id: String,
        what: String,
        #[source]
        source: Box<sandcell_envd_client::ClientError>,
    },
    #[error(transparent)]
    Host(#[from] crate::error::Error),
}
