//! What fails inside the daemon below its services: the database, the runtime, host files,
//! the lifecycle's state machine, an agent's answers. Services wrap it in their own errors;
//! `http/error.rs` alone decides which HTTP answer each becomes.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("database {what}: {source}")]
    Db {
        what: String,
        #[source]
        source: sqlx::Error,
    },

    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),

    #[error(transparent)]
    Runtime(#[from] sandcell_runtime::Error),

    /// The secrets key ring (its file, or a stored value that does not open).
    #[error(transparent)]
    Secrets(#[from] crate::secrets::crypto::CryptoError),

    /// The volumes' bucket configuration (`serve --s3-*`).
    #[error("volumes: {0}")]
    S3Config(#[from] crate::volumes::config::ConfigError),

    /// The HTTPS port's certificate (`--domain`, `--tls-cert`, the daemon's CA).
    #[error("TLS for --domain: {0}")]
    Tls(#[from] crate::tls::TlsError),

    /// The egress CA's files (interception of HTTPS to rule domains).
    #[error("the egress CA: {0}")]
    EgressCa(#[from] sandcell_runtime::net::tls_ca::CaError),

    /// TLS interception's setup (`--egress-extra-ca`, the upstream trust store).
    #[error("egress TLS interception: {0}")]
    EgressTls(#[from] sandcell_runtime::net::intercept::InterceptError),

    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    /// A state change the lifecycle's state machine forbids (a bug, never input).
    #[error("sandbox {id}: no transition from {from} to {to}")]
    Transition {
        id: String,
        from: &'static str,
        to: &'static str,
    },

    /// The agent of a sandbox answered something we cannot use.
    #[error("sandbox {id}: agent {what}")]
    Agent { id: String, what: String },
}

impl Error {
    pub(crate) fn db(what: impl Into<String>) -> impl FnOnce(sqlx::Error) -> Error {
        let what = what.into();
        move |source| Error::Db { what, source }
    }

    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}
