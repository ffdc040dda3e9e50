//! The guest agent's protocol: E2B's envd, faithfully enough that "The daemon" forwards the
//! SDKs' requests unchanged.
//!
//! - Connect server streams (`application/connect+json`, one request [`envelope`], answer a
//!   stream of envelopes closed by an end-of-stream one, [`envelope::FLAG_END_STREAM`]):
//!   `process.Process/Start` ([`process::StartRequest`]) and `/Connect` answer
//!   [`ProcessEvent`]s; `filesystem.Filesystem/WatchDir` answers
//!   [`filesystem::WatchDirResponse`]s. `process.Process/StreamInput` is a client stream.
//! - Connect unary calls (`application/json`): `process.Process/{List, Update, SendInput,
//!   SendSignal, CloseStdin}` ([`process`]) and `filesystem.Filesystem/{Stat, MakeDir, Move,
//!   ListDir, Remove, CreateWatcher, GetWatcherEvents, RemoveWatcher}` ([`filesystem`]).
//!   Errors: an HTTP status and [`ConnectError`].
//! - REST: `GET /files?path=&username=` streams a file, `POST /files` writes one or more
//!   (octet-stream or multipart, optionally gzip) answering [`EntryInfo`]s; `GET /health`
//!   (204), `GET /envs`, `POST /init` ([`InitRequest`]). Errors: [`RestError`].
//! - Users: `Authorization: Basic base64(user:)` on RPCs, `username` on `/files`.
//! - Ours: `POST /sandcell/poweroff`.
//!
//! Bytes travel base64-encoded, as protobuf's JSON mapping does for `bytes` fields. The
//! [`StartRequest`] and selector types at this level are the subset our own client sends.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub mod envelope;
pub mod filesystem;
pub mod net;
pub mod process;

pub const START_PATH: &str = "/process.Process/Start";
pub const SEND_INPUT_PATH: &str = "/process.Process/SendInput";
pub const CLOSE_STDIN_PATH: &str = "/process.Process/CloseStdin";
pub const SEND_SIGNAL_PATH: &str = "/process.Process/SendSignal";
pub const FILES_PATH: &str = "/files";
pub const HEALTH_PATH: &str = "/health";
/// envd's `POST /init` ([`InitRequest`]) and `GET /envs` (a JSON map of the default env vars).
pub const INIT_PATH: &str = "/init";
pub const ENVS_PATH: &str = "/envs";
/// Where the agent in a sandbox publishes the default environment at each `/init` (the
/// agent's `--env-file`; a restored template's start command reads it).
pub const ENV_FILE_PATH: &str = "/run/sandcell/env.json";
/// The header carrying the access token set by `/init` (envd's name).
pub const ACCESS_TOKEN_HEADER: &str = "X-Access-Token";
/// The header `/init` answers with the envd version the agent implements.
pub const ENVD_VERSION_HEADER: &str = "X-Envd-Version";
/// The envd version the agent implements, answered in `X-Envd-Version` on `/init` (where
/// envd reports it to the orchestrator) and meant for the control plane's `envdVersion`.
///
/// The SDKs switch features on by this version: 0.1.4 recursive watch, 0.3.0 `stdin` on
/// Start, 0.4.0 default user (no `user:` Authorization forced), 0.5.2 CloseStdin, 0.5.7
/// octet-stream and gzip uploads, 0.6.2 file metadata (X-Metadata-* headers, xattrs),
/// 0.6.3 `includeEntry` on watch events, 0.6.4 `allowNetworkMounts`. The agent implements all
/// of them, and 0.6.4 is the newest version any SDK (Python `e2b` 2.63, npm `e2b` 2.51)
/// gates on.
pub const ENVD_VERSION: &str = "0.6.4";
pub const CONNECT_JSON: &str = "application/connect+json";
/// Ours, not envd's: answer 204, then sync and power the VM off (the agent must be PID 1;
/// otherwise the agent just exits).
pub const POWEROFF_PATH: &str = "/sandcell/poweroff";
/// Ours: answer 204, then close every connection and the listening socket, and listen again
/// only once the file [`RESUME_MARKER`] appears next to the (Unix) socket. gVisor cannot
/// checkpoint a sandbox that holds a bound or connected host socket, so the runtime calls
/// this before `runsc checkpoint`; the restored agent (and the original one, if the
/// checkpoint failed) finds the marker the runtime put in its new socket directory.
pub const CHECKPOINT_HOLD_PATH: &str = "/sandcell/checkpoint-hold";
/// See [`CHECKPOINT_HOLD_PATH`]: the file name, in the directory of the agent's socket.
pub const RESUME_MARKER: &str = "agent.resume";
/// See [`CHECKPOINT_HOLD_PATH`]: written by the agent next to its socket once it holds no
/// host socket any more (connections closed, listener dropped): what the runtime waits for
/// before `runsc checkpoint`. (A refused connect is no proof: the listening host socket may
/// outlive the agent's descriptor in gVisor's gofer for a while.)
pub const HELD_MARKER: &str = "agent.held";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcessConfig {
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartRequest {
    pub process: ProcessConfig,
    /// When true the process's stdin stays open for `SendInput` until `CloseStdin`;
    /// otherwise it reads from /dev/null (envd opens a pipe when the field is absent; every
    /// SDK that knows the field sends it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `{"event": {...}}`: one message of the Start stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEvent {
    pub event: Event,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Event {
    Start(StartEvent),
    Data(DataEvent),
    End(EndEvent),
    Keepalive(Keepalive),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartEvent {
    pub pid: u32,
}

/// Exactly one of the fields is set; values are base64.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataEvent {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<String>,
}

/// How the process ended, as envd reports it (Go's `os.ProcessState`): `exitCode` -1 and
/// `status` "signal: killed" for a process killed by a signal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    #[serde(default)]
    pub exit_code: i32,
    #[serde(default)]
    pub exited: bool,
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl EndEvent {
    /// The signal that ended the process, parsed back from `status`.
    pub fn signal(&self) -> Option<i32> {
        parse_signal_status(&self.status)
    }

    /// The status a shell would report: the exit code, or 128 + the signal number.
    pub fn shell_status(&self) -> i32 {
        match self.signal() {
            Some(sig) if !self.exited => 128 + sig,
            _ => self.exit_code,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Keepalive {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSelector {
    pub pid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendInputRequest {
    pub process: ProcessSelector,
    pub input: ProcessInput,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInput {
    /// base64
    pub stdin: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloseStdinRequest {
    pub process: ProcessSelector,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendSignalRequest {
    pub process: ProcessSelector,
    /// envd's enum names: "SIGNAL_SIGTERM", "SIGNAL_SIGKILL".
    pub signal: String,
}

/// One entry of the `POST /files` answer (envd's `EntryInfo`): `{"name","type","path"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryInfo {
    pub name: String,
    /// "file" or "dir".
    #[serde(rename = "type")]
    pub kind: String,
    pub path: String,
    /// The file's user metadata (envd >= 0.6.2), when it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

/// `POST /init`: what the control plane hands a fresh (or resumed) sandbox. Fields envd has
/// that the agent ignores (volume mounts, E2B's `caBundle`: ours is `sandcellCaBundle`,
/// hyperloop) are accepted and dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitRequest {
    /// Replaces the env vars set by a previous `/init` (envd >= 0.6 semantics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_vars: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token: Option<String>,
    /// RFC 3339; the guest clock is set from it when it is off by more than envd's margins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_workdir: Option<String>,
    /// Our extension: the sandbox id the host knows this agent by. When it differs from
    /// the one the agent last got (a sandbox restored from a template, a pause or a fork is a
    /// new identity in an old memory image), the agent starts over as a fresh sandbox: the
    /// access-token rule and the replay guard are reset, `E2B_SANDBOX_ID` changes. Only the
    /// host can send it: the daemon's proxy refuses `/init` from users.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandcell_sandbox_id: Option<String>,
    /// Our extension: hex of fresh random bytes (at most [`MAX_INIT_ENTROPY`]) the agent
    /// mixes into the guest kernel's RNG and credits, then forces a reseed, so that sandboxes
    /// restored from one snapshot never share RNG state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandcell_entropy: Option<String>,
    /// Our extension, microVMs only: the guest's new addressing, exactly in the format of the
    /// `sandcell.net=` kernel parameter (`ip=A/P,gw=G[,mtu=N][,dns=D][,if=NAME]`, IPv4). A VM
    /// restored as another sandbox lands in that sandbox's network: the agent readdresses
    /// its interface (`if=`, else the first that is not `lo`): every default route goes, the
    /// new address and netmask replace the old, MTU set when given, link up, `gw` becomes
    /// the default route, `/etc/resolv.conf` rewritten when `dns` is given. Host-only like
    /// `sandcellSandboxId`: applied before the token rule and whatever the timestamp, and an
    /// `/init` carrying none of envd's fields (nor a sandbox id) changes nothing else (the
    /// runtime's own, which cannot know the token). Idempotent. Answers 400 when malformed
    /// (the message names `sandcellNet`), 409 when the agent did not configure the network
    /// at boot (not a microVM's init with `sandcell.net=`: gVisor, a host process), 500 when
    /// an ioctl failed (named, with the interface).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandcell_net: Option<String>,
    /// Our extension: PEM certificates (at most [`MAX_INIT_CA_BUNDLE`] bytes) the guest's
    /// system trust store is to trust besides its own, installed by an agent that owns the
    /// guest's root (`--trust-root`) and replaced by the next `/init` that carries one: the
    /// daemon's egress CA when it intercepts TLS for secrets injection (issue 17). Empty:
    /// take out what an earlier one installed. 400 when it holds anything but certificates
    /// (the message names `sandcellCaBundle`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandcell_ca_bundle: Option<String>,
}

/// Largest `sandcellEntropy` accepted, in bytes.
pub const MAX_INIT_ENTROPY: usize = 512;

/// Largest `sandcellCaBundle` accepted, in bytes.
pub const MAX_INIT_CA_BUNDLE: usize = 64 * 1024;

/// Where an agent that owns the guest's root finds its system trust store (`--trust-root`).
pub const TRUST_ROOT: &str = "/";

/// envd's REST error body (`/files`, `/init`, auth failures): `{"code": 404, "message"}`,
/// the code being the HTTP status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestError {
    pub code: u16,
    pub message: String,
}

/// A Connect error body: `{"code": "not_found", "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectError {
    pub code: String,
    pub message: String,
}

/// The end-of-stream message: `{}` or `{"error": {...}}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndOfStream {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ConnectError>,
}

/// Go's names for the signals (`syscall.Signal.String()`), which envd puts in `status`.
const SIGNAL_NAMES: &[(i32, &str)] = &[
    (1, "hangup"),
    (2, "interrupt"),
    (3, "quit"),
    (4, "illegal instruction"),
    (5, "trace/breakpoint trap"),
    (6, "aborted"),
    (7, "bus error"),
    (8, "floating point exception"),
    (9, "killed"),
    (10, "user defined signal 1"),
    (11, "segmentation fault"),
    (12, "user defined signal 2"),
    (13, "broken pipe"),
    (14, "alarm clock"),
    (15, "terminated"),
];

/// `status` for a process ended by `sig`: "signal: killed", or "signal N" for the rest.
pub fn signal_status(sig: i32) -> String {
    match SIGNAL_NAMES.iter().find(|(n, _)| *n == sig) {
        Some((_, name)) => format!("signal: {name}"),
        None => format!("signal: signal {sig}"),
    }
}

pub fn parse_signal_status(status: &str) -> Option<i32> {
    let name = status.strip_prefix("signal: ")?;
    if let Some(n) = name.strip_prefix("signal ") {
        return n.parse().ok();
    }
    SIGNAL_NAMES
        .iter()
        .find(|(_, s)| *s == name)
        .map(|(n, _)| *n)
}

/// envd's signal enum name to a signal number.
pub fn signal_from_enum(name: &str) -> Option<i32> {
    match name {
        "SIGNAL_SIGTERM" | "15" => Some(15),
        "SIGNAL_SIGKILL" | "9" => Some(9),
        "SIGNAL_SIGINT" => Some(2),
        "SIGNAL_SIGHUP" => Some(1),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_status_round_trips() {
        for sig in 1..=31 {
            assert_eq!(parse_signal_status(&signal_status(sig)), Some(sig));
        }
        assert_eq!(signal_status(9), "signal: killed");
        assert_eq!(parse_signal_status("exit status 1"), None);
    }

    #[test]
    fn events_use_envd_json_shape() {
        let ev = ProcessEvent {
            event: Event::Start(StartEvent { pid: 7 }),
        };
        assert_eq!(
            serde_json::to_string(&ev).unwrap(),
            r#"{"event":{"start":{"pid":7}}}"#
        );
        let end: ProcessEvent =
            serde_json::from_str(r#"{"event":{"end":{"exitCode":-1,"status":"signal: killed"}}}"#)
                .unwrap();
        match end.event {
            Event::End(e) => assert_eq!(e.shell_status(), 137),
            other => panic!("unexpected {other:?}"),
        }
        let ka: ProcessEvent = serde_json::from_str(r#"{"event":{"keepalive":{}}}"#).unwrap();
        assert_eq!(ka.event, Event::Keepalive(Keepalive {}));
    }
}
