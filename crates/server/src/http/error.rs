//! Errors: [`Error`] for what fails inside the daemon (database, runtime, files), and
//! [`ApiError`], the one type every handler returns, which renders as E2B does:
//! `{"code": <HTTP status>, "message": "..."}` with E2B's status codes.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

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

/// An answer other than success, as E2B's API gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The HTTP status again.
    pub code: u16,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNAUTHORIZED, message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }

    pub fn sandbox_not_found(id: &str) -> ApiError {
        ApiError::not_found(format!(
            "sandbox \"{id}\" doesn't exist or you don't have access to it"
        ))
    }

    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, message)
    }

    pub fn too_many(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, message)
    }

    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    pub fn bad_gateway(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_GATEWAY, message)
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        // Logged here because the client gets the message but the operator needs it too.
        tracing::error!("error: {e}");
        match &e {
            Error::Runtime(sandcell_runtime::Error::Unavailable { .. }) => {
                ApiError::unavailable(e.to_string())
            }
            Error::Runtime(sandcell_runtime::Error::Image { .. }) => {
                ApiError::bad_request(e.to_string())
            }
            _ => ApiError::internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            code: self.status.as_u16(),
            message: self.message,
        };
        (self.status, Json(body)).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
