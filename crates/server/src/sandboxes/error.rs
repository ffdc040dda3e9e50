//! What creating, starting or restoring a sandbox fails with. Services return it; only
//! http/error.rs turns it into an HTTP answer. A create from a template's memory snapshot
//! falls back to a boot on the failures [`SandboxError::falls_back_to_boot`] names.

use crate::http::error::{ApiError, Error};
use crate::networks::service::NetworkError;
use crate::snapshots::error::HandleError;
use crate::templates::error::TemplateError;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The request asks for something malformed or out of this server's bounds.
    #[error("{0}")]
    Invalid(String),
    #[error("template '{0}' not found")]
    TemplateNotFound(String),
    /// The template's directory is there but cannot be used as an image.
    #[error("{0}")]
    TemplateUnreadable(String),
    /// Past the key's quotas or the host's capacity (sandboxes/admission.rs).
    #[error(transparent)]
    Admission(#[from] crate::sandboxes::admission::AdmissionError),
    #[error(transparent)]
    Network(#[from] NetworkError),
    /// The database, the runtime or the host failed.
    #[error(transparent)]
    Host(#[from] Error),
    /// The sandbox's agent did not take its identity (`/init`).
    #[error(transparent)]
    Agent(#[from] InitError),
    /// A snapshot's record cannot be restored from (never completed, unreadable handle).
    #[error(transparent)]
    Snapshot(#[from] HandleError),
    /// Every restore attempt ended with an agent that did not answer.
    #[error("{0}")]
    Restore(String),
    /// Resolving the template (its tag, its memory snapshot) or running its start and
    /// ready commands.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The create's `volumeMounts` (volumes/).
    #[error(transparent)]
    Volume(#[from] crate::volumes::service::VolumeError),
    /// The daemon is stopping (sandboxes/stopping.rs).
    #[error("the daemon is stopping: create the sandbox again once it has restarted")]
    Stopping,
}

/// What giving a sandbox's agent its identity (envd's `POST /init`) fails with.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("getrandom for /init: {0}")]
    Entropy(#[source] std::io::Error),
    /// The request did not reach the agent, as the proxy (http/proxy.rs, which speaks
    /// HTTP to the sandbox and answers in its terms) said.
    #[error("{}", .0.message)]
    Unreachable(ApiError),
    #[error("sandbox {id}: the agent answered /init with {status}")]
    Refused {
        id: String,
        status: axum::http::StatusCode,
    },
    #[error("sandbox {id}: the agent did not answer /init within {after:?}")]
    Timeout { id: String, after: Duration },
}

impl From<sandcell_runtime::Error> for SandboxError {
    fn from(e: sandcell_runtime::Error) -> SandboxError {
        SandboxError::Host(e.into())
    }
}

impl SandboxError {
    /// Whether a create from a template's memory snapshot that failed so should boot the
    /// template instead (the template works without its snapshot: a boot runs its start
    /// command): when the host or the restored sandbox failed, not when the request is
    /// wrong or over its limits (a boot would fail the same way).
    pub fn falls_back_to_boot(&self) -> bool {
        match self {
            // A broken image is the template's problem, not the snapshot's.
            SandboxError::Host(Error::Runtime(sandcell_runtime::Error::Image { .. })) => false,
            SandboxError::Host(_)
            | SandboxError::Agent(_)
            | SandboxError::Snapshot(_)
            | SandboxError::Restore(_)
            | SandboxError::TemplateUnreadable(_)
            | SandboxError::Network(NetworkError::Internal(_)) => true,
            SandboxError::Invalid(_)
            | SandboxError::TemplateNotFound(_)
            | SandboxError::Admission(_)
            | SandboxError::Network(_)
            | SandboxError::Template(_)
            | SandboxError::Volume(_)
            | SandboxError::Stopping => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_host_and_restore_failures_fall_back_to_a_boot() {
        let io = || Error::Io {
            what: "restoring".into(),
            source: std::io::Error::other("x"),
        };
        assert!(SandboxError::Host(io()).falls_back_to_boot());
        assert!(SandboxError::Restore("no answer".into()).falls_back_to_boot());
        assert!(
            SandboxError::Agent(InitError::Unreachable(ApiError::bad_gateway("gone")))
                .falls_back_to_boot()
        );
        let quota = crate::sandboxes::admission::AdmissionError::KeyQuota {
            quota: "sandboxes",
            limit: 1,
            used: 1,
            asked: 1,
        };
        assert!(!SandboxError::from(quota).falls_back_to_boot());
        assert!(!SandboxError::Invalid("timeout".into()).falls_back_to_boot());
        let image = sandcell_runtime::Error::Image {
            image: "t".into(),
            problem: "no rootfs".into(),
        };
        assert!(!SandboxError::from(image).falls_back_to_boot());
    }
}
