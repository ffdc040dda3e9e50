//! What creating, starting or restoring a sandbox fails with. Services return it; only
//! http/error.rs turns it into an HTTP answer. A create from a template's memory snapshot
//! falls back to a boot on the failures [`SandboxError::falls_back_to_boot`] names.

use crate::http::error::{ApiError, Error};
use crate::networks::service::NetworkError;

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
    /// The key runs as many sandboxes as it may.
    #[error(
        "you have reached the maximum number of concurrent sandboxes ({limit}) for this API key"
    )]
    LimitReached { limit: u32 },
    #[error(transparent)]
    Network(#[from] NetworkError),
    /// The database, the runtime or the host failed.
    #[error(transparent)]
    Host(#[from] Error),
    /// The sandbox's agent did not take its identity (`/init`); `answer` is how the proxy
    /// or the agent said so.
    #[error("{}", answer.message)]
    Agent { answer: ApiError },
    /// A snapshot's record cannot be restored from (never completed, unreadable handle).
    #[error("{0}")]
    Snapshot(String),
    /// Every restore attempt ended with an agent that did not answer.
    #[error("{0}")]
    Restore(String),
    /// From a part that still answers in HTTP terms (template tags, start commands).
    #[error("{}", .0.message)]
    Api(ApiError),
}

impl From<ApiError> for SandboxError {
    fn from(e: ApiError) -> SandboxError {
        SandboxError::Api(e)
    }
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
            | SandboxError::Agent { .. }
            | SandboxError::Snapshot(_)
            | SandboxError::Restore(_)
            | SandboxError::TemplateUnreadable(_)
            | SandboxError::Network(NetworkError::Internal(_)) => true,
            SandboxError::Invalid(_)
            | SandboxError::TemplateNotFound(_)
            | SandboxError::LimitReached { .. }
            | SandboxError::Network(_)
            | SandboxError::Api(_) => false,
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
            SandboxError::Agent {
                answer: ApiError::bad_gateway("gone")
            }
            .falls_back_to_boot()
        );
        assert!(!SandboxError::LimitReached { limit: 1 }.falls_back_to_boot());
        assert!(!SandboxError::Invalid("timeout".into()).falls_back_to_boot());
        let image = sandcell_runtime::Error::Image {
            image: "t".into(),
            problem: "no rootfs".into(),
        };
        assert!(!SandboxError::from(image).falls_back_to_boot());
    }
}
