//! `sudo` where setuid programs cannot elevate: gVisor's sentry ignores setuid bits and runs
//! every task with "no new privileges" (gVisor issues #212, #5299), so Debian's sudo fails for
//! `user` there. The agent is root and PID 1; it runs the command instead.
//!
//! ```text
//! user's shell ── sudo (this binary, by argv[0]) ──[ \0sandcell-sudo: request + fds 0,1,2 ]──▶ agent
//!       ◀── exit status, re-raised signal ──────────────────────────────────────────────────┘
//! ```
//! - [`client`]: `/usr/local/bin/sudo` in `base` is a link to the agent binary; run as `sudo` it
//!   parses sudo's command line ([`args`]), connects to the service and sends the request with
//!   its own stdin, stdout and stderr, forwards the signals it gets (Ctrl-C included), and exits
//!   as the command did. Where no service listens (a microVM: a real kernel, setuid works) it
//!   executes `/usr/bin/sudo` with the same arguments.
//! - [`service`]: the agent's side (`sandcell-agent --sudo-service`, given by the gvisor
//!   runtime): checks who asks (the kernel-checked credentials of the message: root or a member
//!   of group `sudo`, Debian's `%sudo` rule; `base`'s is NOPASSWD and its user has no password),
//!   builds the command line and environment as sudo's defaults do (env_reset, secure_path,
//!   `-i`, `-s`, `-E`, `-u`, `-g`, `VAR=value`) and runs it as the target user on the caller's
//!   descriptors, in a session of its own (no controlling terminal: the caller's session keeps
//!   it).
//! - [`socket`]: the abstract `SOCK_SEQPACKET` socket both sides use.
//!
//! Inside a sandbox root is not a boundary the host relies on (the sandbox is); the service
//! gives `user` what E2B's template gives it, and nothing to anyone sudo would refuse.

pub mod args;
pub mod client;
pub mod service;
pub mod socket;

use serde::{Deserialize, Serialize};

/// The abstract socket name (`\0sandcell-sudo`).
pub const SOCKET_NAME: &str = "sandcell-sudo";

/// Largest request: the caller's environment and the command line.
pub const MAX_REQUEST: usize = 256 * 1024;

/// Largest control or reply message.
pub const MAX_MESSAGE: usize = 4096;

/// What runs: the command itself, the target's login shell (`-i`), or a shell (`-s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Command,
    Login,
    Shell,
}

/// Which of the caller's variables survive (`env_reset` keeps a short list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preserve {
    /// sudo's default: the `env_keep` list only.
    Default,
    /// `-E`: all of them.
    All,
    /// `--preserve-env=A,B`: the list and these.
    Names(Vec<String>),
}

/// The one request a client sends (with its stdin, stdout and stderr attached).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// `-u`: a name or `#uid`; root when absent.
    pub user: Option<String>,
    /// `-g`: a group name or `#gid` for the primary group.
    pub group: Option<String>,
    pub mode: Mode,
    /// The command and its arguments (may be empty for `-i`/`-s`).
    pub command: Vec<String>,
    pub preserve: Preserve,
    /// `VAR=value` operands before the command.
    pub set_env: Vec<(String, String)>,
    /// The caller's environment.
    pub env: Vec<(String, String)>,
    /// The caller's working directory.
    pub cwd: String,
    /// `-D DIR`.
    pub chdir: Option<String>,
}

/// What the client sends while the command runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Control {
    /// A signal the client got, for the command's process group.
    Signal(i32),
}

/// The service's one answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reply {
    Exit(i32),
    Signal(i32),
    /// sudo's own failure (refused, unknown user, command not found): printed as
    /// `sudo: MESSAGE`, exit status 1.
    Error(String),
}
