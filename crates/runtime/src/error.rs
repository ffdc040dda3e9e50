//! Errors of the runtimes. Each names the runtime and what failed on what, and where the user
//! can do something about it, says what.

use crate::{AGENT_PORT, RuntimeKind, SandboxExit};
use std::io;
use std::path::PathBuf;
use std::time::Duration;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{runtime} runtime: {what}: {source}")]
    Io {
        runtime: RuntimeKind,
        what: String,
        #[source]
        source: io::Error,
    },

    /// The VMM's jail (opt-in, microvm/jail/) could not be set up: the create fails.
    #[error("{runtime} runtime: the VMM's jail cannot be set up: {source}")]
    Jail {
        runtime: RuntimeKind,
        #[source]
        source: crate::microvm::jail::JailError,
    },

    /// A host operation that belongs to no runtime in particular (directories, ids).
    #[error("{what}: {source}")]
    Host {
        what: String,
        #[source]
        source: io::Error,
    },

    /// A tool or file the runtime needs is missing or unusable; `hint` says what to do.
    #[error("{runtime} runtime: {what}; {hint}")]
    Unavailable {
        runtime: RuntimeKind,
        what: String,
        hint: String,
    },

    #[error("image {image}: {problem}")]
    Image { image: String, problem: String },

    #[error("{runtime} runtime: invalid sandbox spec: {problem}")]
    InvalidSpec {
        runtime: RuntimeKind,
        problem: String,
    },

    #[error("{runtime} runtime: `{command}` failed ({status}): {stderr}")]
    Command {
        runtime: RuntimeKind,
        command: String,
        status: String,
        stderr: String,
    },

    #[error("cgroup {path}: {what}: {source}")]
    Cgroup {
        path: PathBuf,
        what: String,
        #[source]
        source: io::Error,
    },

    #[error(
        "{runtime} runtime: sandbox {id}: the agent did not accept connections within {timeout:?}{console}"
    )]
    BootTimeout {
        runtime: RuntimeKind,
        id: String,
        timeout: Duration,
        console: String,
    },

    #[error("{runtime} runtime: sandbox {id} ended while starting: {exit}{console}")]
    EndedDuringStart {
        runtime: RuntimeKind,
        id: String,
        exit: SandboxExit,
        console: String,
    },

    #[error("{runtime} runtime: sandbox {id} is {state}; cannot {op}")]
    WrongState {
        runtime: RuntimeKind,
        id: String,
        state: String,
        op: &'static str,
    },

    #[error(
        "{runtime} runtime: port {port} is not reachable (only the agent's port {AGENT_PORT} is, for now)"
    )]
    PortUnsupported { runtime: RuntimeKind, port: u32 },

    #[error("{runtime} runtime: connecting to port {port} of sandbox {id}: {problem}")]
    Connect {
        runtime: RuntimeKind,
        id: String,
        port: u32,
        problem: String,
    },

    #[error("{runtime} runtime: sandbox {id}: control socket {path}: {problem}")]
    Control {
        runtime: RuntimeKind,
        id: String,
        path: PathBuf,
        problem: String,
    },

    /// [`crate::Runtime::adopt`] found the sandbox ended (its leftovers are removed).
    #[error("{runtime} runtime: sandbox {id} cannot be adopted: {problem}")]
    Gone {
        runtime: RuntimeKind,
        id: String,
        problem: String,
    },

    /// A snapshot that cannot be used: missing, corrupt, of another version or runtime.
    #[error("snapshot {path}: {problem}")]
    Snapshot { path: PathBuf, problem: String },

    /// What this runtime (or this version of its tools) cannot do; `why` says what instead.
    #[error("{runtime} runtime: cannot {op}: {why}")]
    Unsupported {
        runtime: RuntimeKind,
        op: &'static str,
        why: String,
    },

    /// What the sandbox's own state prevents now (something its guest did); it was left as
    /// it was and runs on. `why` names the cause and what to do.
    #[error("{runtime} runtime: sandbox {id} cannot {op} now: {why}")]
    Refused {
        runtime: RuntimeKind,
        id: String,
        op: &'static str,
        why: String,
    },
}

impl Error {
    pub(crate) fn io(runtime: RuntimeKind, what: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            runtime,
            what: what.into(),
            source,
        }
    }

    pub(crate) fn host(what: impl Into<String>, source: io::Error) -> Error {
        Error::Host {
            what: what.into(),
            source,
        }
    }
}
