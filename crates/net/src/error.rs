//! Errors of this crate: each says what failed and on what.

use crate::policy::PolicyError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("bad egress policy: {0}")]
    Policy(#[from] PolicyError),
    /// A refused `egressProxy` (tunnel.rs).
    #[error("{0}")]
    Proxy(#[from] crate::tunnel::ProxyError),
    #[error("no free address block left in the sandbox pool {0}")]
    PoolExhausted(String),
    #[error("bad network configuration: {0}")]
    Config(String),
    #[error("could not read {what}: {problem}")]
    Parse { what: String, problem: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}
