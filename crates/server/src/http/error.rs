//! The one place where errors become HTTP: [`ApiError`], the type every handler returns,
//! renders as E2B does:
//! `{"code": <HTTP status>, "message": "..."}` with E2B's status codes; each service's error
//! (and the daemon's host [`Error`], defined in `crate::error`) converts into it here.
//!
//! Every answer carries an `x-request-id` header ([`request_id`]). A 5xx answer's message
//! names what failed with host paths left out, and its body also carries the request id
//! (`requestId`, and at the end of the message, which is what the SDKs show); the daemon's
//! log line with the same id has the full message.

use axum::Json;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

pub use crate::error::Error;

/// An answer other than success, as E2B's API gives it. `message` is the whole story (what
/// the log gets); a 5xx answer shows it without host paths ([`ApiError::public_message`]).
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
    /// 5xx answers: the id of the request, also in the daemon's log line about it (and in
    /// the `x-request-id` header of every answer).
    #[serde(rename = "requestId", skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

pub type ApiResult<T> = Result<T, ApiError>;

/// The response header naming the request (see [`request_id`]).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

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

impl ApiError {
    /// What the client is shown: 5xx messages without host paths (the log has them).
    pub fn public_message(&self) -> String {
        if self.status.is_server_error() {
            without_host_paths(&self.message)
        } else {
            self.message.clone()
        }
    }

    fn body(&self, request_id: Option<&str>) -> ErrorBody {
        let request_id = request_id.filter(|_| self.status.is_server_error());
        let mut message = self.public_message();
        if let Some(id) = request_id {
            message.push_str(&format!(" (request id {id})"));
        }
        ErrorBody {
            code: self.status.as_u16(),
            message,
            request_id: request_id.map(str::to_string),
        }
    }
}

/// `message` with every absolute path of two or more components (`/var/lib/x`, also
/// inside quotes or parentheses) replaced by `<path>`. Single components such as the
/// agent's `/init` route stay: they are names, not places on the host.
fn without_host_paths(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(start) = rest.find('/') {
        let (before, from) = rest.split_at(start);
        out.push_str(before);
        let preceded_by_word = before
            .chars()
            .next_back()
            .is_some_and(|c| !(c.is_whitespace() || "\"'`([{<=:,".contains(c)));
        let len = from
            .find(|c: char| c.is_whitespace() || "\"'`)]}>,;".contains(c))
            .unwrap_or(from.len());
        let (word, after) = from.split_at(len);
        // `a/b` and `http://x/y` are not host paths; a trailing `:` ends the path.
        let word_path = word.trim_end_matches([':', '.']);
        let components = word_path.split('/').filter(|c| !c.is_empty()).count();
        if preceded_by_word || word.starts_with("//") || components < 2 {
            out.push_str(word);
        } else {
            out.push_str("<path>");
            out.push_str(&word[word_path.len()..]);
        }
        rest = after;
    }
    out.push_str(rest);
    out
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
            // The sandbox's own state (its guest's doing) prevents it; it runs on as it was.
            Error::Runtime(sandcell_runtime::Error::Refused { .. }) => {
                ApiError::conflict(e.to_string())
            }
            _ => ApiError::internal(e.to_string()),
        }
    }
}

impl From<crate::sandboxes::error::SandboxError> for ApiError {
    fn from(e: crate::sandboxes::error::SandboxError) -> ApiError {
        use crate::sandboxes::error::SandboxError;
        match e {
            SandboxError::Invalid(m) => ApiError::bad_request(m),
            SandboxError::TemplateNotFound(_) => ApiError::not_found(e.to_string()),
            SandboxError::Admission(a) if a.is_host() => ApiError::unavailable(a.to_string()),
            SandboxError::Admission(a) => ApiError::too_many(a.to_string()),
            SandboxError::Network(e) => e.into(),
            SandboxError::Host(e) => e.into(),
            SandboxError::Agent(e) => e.into(),
            SandboxError::Template(e) => e.into(),
            SandboxError::Volume(e) => e.into(),
            SandboxError::Stopping => ApiError::unavailable(e.to_string()),
            SandboxError::Snapshot(_) => ApiError::internal(e.to_string()),
            SandboxError::TemplateUnreadable(m) | SandboxError::Restore(m) => ApiError::internal(m),
        }
    }
}

impl From<crate::sandboxes::error::InitError> for ApiError {
    fn from(e: crate::sandboxes::error::InitError) -> ApiError {
        use crate::sandboxes::error::InitError;
        match e {
            // The proxy's own answer (502 and the like), as it gave it.
            InitError::Unreachable(answer) => answer,
            InitError::Entropy(_) | InitError::Refused { .. } | InitError::Timeout { .. } => {
                ApiError::internal(e.to_string())
            }
        }
    }
}

impl From<crate::snapshots::error::SnapshotError> for ApiError {
    fn from(e: crate::snapshots::error::SnapshotError) -> ApiError {
        use crate::snapshots::error::SnapshotError;
        match e {
            SnapshotError::SandboxNotFound(id) => ApiError::sandbox_not_found(&id),
            SnapshotError::AlreadyPaused(_) | SnapshotError::Paused(_) => {
                ApiError::conflict(e.to_string())
            }
            SnapshotError::InvalidName(_)
            | SnapshotError::FilesOnlyWithoutDisk(_)
            | SnapshotError::NameOfTemplate(_)
            | SnapshotError::ForkCount(_) => ApiError::bad_request(e.to_string()),
            // E2B: 503 when it cannot be paused now and keeps running.
            SnapshotError::PauseFailedStillRunning { .. } => ApiError::unavailable(e.to_string()),
            SnapshotError::Encode(_)
            | SnapshotError::PauseFailed { .. }
            | SnapshotError::PausedWithoutSnapshot { .. }
            | SnapshotError::Handle(_) => ApiError::internal(e.to_string()),
            SnapshotError::Sandbox(e) => e.into(),
            SnapshotError::Runtime(e) => Error::Runtime(e).into(),
            SnapshotError::Host(e) => e.into(),
        }
    }
}

impl From<crate::templates::error::TemplateError> for ApiError {
    fn from(e: crate::templates::error::TemplateError) -> ApiError {
        use crate::templates::error::TemplateError;
        match e {
            TemplateError::InvalidName(_)
            | TemplateError::NoTags
            | TemplateError::TooManyTags
            | TemplateError::InvalidTag(_)
            | TemplateError::InvalidTargetTag(_) => ApiError::bad_request(e.to_string()),
            TemplateError::NotFound(_)
            | TemplateError::NoSuchTag { .. }
            | TemplateError::TagOfReplacedBuild { .. } => ApiError::not_found(e.to_string()),
            TemplateError::InstalledImage(_) => ApiError::bad_request(e.to_string()),
            TemplateError::NotOwner(_) => ApiError::new(StatusCode::FORBIDDEN, e.to_string()),
            TemplateError::NameTaken(_)
            | TemplateError::BeingBuilt(_)
            | TemplateError::InUse { .. }
            | TemplateError::ImageInUse(_) => ApiError::conflict(e.to_string()),
            TemplateError::GoneBeforeStart { .. }
            | TemplateError::StartFailed { .. }
            | TemplateError::RemovalFailed { .. }
            | TemplateError::ListingSnapshots(_)
            | TemplateError::Snapshot(_) => ApiError::internal(e.to_string()),
            TemplateError::Host(e) => e.into(),
        }
    }
}

impl From<crate::networks::service::NetworkError> for ApiError {
    fn from(e: crate::networks::service::NetworkError) -> ApiError {
        use crate::networks::service::NetworkError;
        match e {
            NetworkError::NetworksOff
            | NetworkError::Rules(_)
            | NetworkError::BadMask
            | NetworkError::Transform(_)
            | NetworkError::Proxy(_) => ApiError::bad_request(e.to_string()),
            NetworkError::UnknownNetwork(_) => ApiError::not_found(e.to_string()),
            NetworkError::Internal(e) => e.into(),
        }
    }
}

impl From<crate::secrets::service::SecretsError> for ApiError {
    fn from(e: crate::secrets::service::SecretsError) -> ApiError {
        use crate::secrets::service::SecretsError;
        match e {
            SecretsError::InvalidName(_)
            | SecretsError::InvalidMetadata(_)
            | SecretsError::InvalidValue(_) => ApiError::bad_request(e.to_string()),
            SecretsError::NotFound(_) => ApiError::not_found(e.to_string()),
            SecretsError::Exists(_) | SecretsError::Contended(_) => {
                ApiError::conflict(e.to_string())
            }
            SecretsError::TooMany => ApiError::too_many(e.to_string()),
            SecretsError::Crypto(_) | SecretsError::DaemonRunning => {
                ApiError::internal(e.to_string())
            }
            SecretsError::Host(e) => e.into(),
        }
    }
}

impl From<crate::volumes::service::VolumeError> for ApiError {
    fn from(e: crate::volumes::service::VolumeError) -> ApiError {
        use crate::volumes::service::VolumeError;
        match e {
            VolumeError::Disabled => ApiError::new(StatusCode::NOT_IMPLEMENTED, e.to_string()),
            VolumeError::InvalidName(_) | VolumeError::InvalidMount(_) => {
                ApiError::bad_request(e.to_string())
            }
            VolumeError::NotFound(_) => ApiError::not_found(e.to_string()),
            VolumeError::Unauthorized => ApiError::unauthorized(e.to_string()),
            VolumeError::Exists(_) | VolumeError::InUse { .. } | VolumeError::Refused(_) => {
                ApiError::conflict(e.to_string())
            }
            // The bucket's endpoint, its S3 keys and messages, the other daemon's host: the
            // operator's to read (logged in the request's span, with its id), not the tenant's.
            VolumeError::Storage(_) => {
                tracing::error!("{e}");
                ApiError::bad_gateway("volume storage failed; try again later")
            }
            VolumeError::AlreadyHere(_) => ApiError::conflict(e.to_string()),
            VolumeError::LeaseLost(_) => {
                tracing::error!("{e}");
                ApiError::conflict("the volume is mounted on another node")
            }
            VolumeError::Shared(s) => {
                use crate::volumes::bucket::BucketError;
                use crate::volumes::shared::SharedError;
                match s {
                    SharedError::Held { .. } => {
                        tracing::warn!("{s}");
                        ApiError::conflict(
                            "the volume is mounted on another node (one node at a time); \
                             try again once it is unmounted there",
                        )
                    }
                    SharedError::Diverged { .. } => {
                        tracing::error!("{s}");
                        ApiError::conflict(
                            "the volume has changes on this node that were never published, \
                             and another node published newer ones: not mounted here",
                        )
                    }
                    // The volume is not there, or not the caller's to adopt: alike.
                    SharedError::NoMetadata(id) | SharedError::BadToken(id) => {
                        ApiError::not_found(VolumeError::NotFound(id).to_string())
                    }
                    SharedError::Bucket(BucketError::Unreachable { .. }) => {
                        tracing::warn!("{s}");
                        ApiError::new(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "volume storage unavailable; try again later",
                        )
                    }
                    _ => {
                        tracing::error!("{s}");
                        ApiError::bad_gateway("volume storage failed; try again later")
                    }
                }
            }
            VolumeError::OwnStorage(s) => {
                if s.is_client() {
                    ApiError::bad_request(s.to_string())
                } else {
                    tracing::error!("{s}");
                    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, s.to_string())
                }
            }
            VolumeError::Host(e) => e.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body(None))).into_response();
        // For [`request_id`], which renders 5xx answers again with the id.
        if self.status.is_server_error() {
            response.extensions_mut().insert(self);
        }
        response
    }
}

/// Answers the request's id (made by [`super::trace::span`]) in [`REQUEST_ID_HEADER`]. A
/// 5xx [`ApiError`] answer is logged with the id and its full message, and its body
/// names the id.
pub async fn request_id(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let id = req
        .extensions()
        .get::<super::trace::RequestId>()
        .map(|r| r.0.clone())
        .unwrap_or_default();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let mut response = next.run(req).await;
    if let Some(error) = response.extensions_mut().remove::<ApiError>() {
        // In the request's span (its id, method and path); the full message, paths and all.
        tracing::error!(
            "request {id}: {method} {path}: {} {}",
            error.status.as_u16(),
            error.message
        );
        let headers = std::mem::take(response.headers_mut());
        response = (error.status, Json(error.body(Some(&id)))).into_response();
        for (name, value) in &headers {
            if name != axum::http::header::CONTENT_LENGTH {
                response.headers_mut().insert(name, value.clone());
            }
        }
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, value);
    }
    response
}

impl From<crate::computer::error::ComputerError> for ApiError {
    fn from(e: crate::computer::error::ComputerError) -> ApiError {
        use crate::computer::error::ComputerError;
        match e {
            ComputerError::SandboxNotFound(_) | ComputerError::NoWindow { .. } => {
                ApiError::not_found(e.to_string())
            }
            ComputerError::NotRunning { .. } => ApiError::conflict(e.to_string()),
            ComputerError::NoDesktop(..) | ComputerError::Invalid(_) => {
                ApiError::bad_request(e.to_string())
            }
            // The sandbox's side failed: its tools, its X server, its agent.
            ComputerError::DesktopDidNotStart { .. }
            | ComputerError::Tool { .. }
            | ComputerError::Timeout { .. }
            | ComputerError::Agent { .. } => {
                tracing::warn!("computer API: {e}");
                ApiError::bad_gateway(e.to_string())
            }
            ComputerError::Host(e) => e.into(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn host_paths_are_left_out_of_5xx_messages() {
        let e = ApiError::internal(
            "creating /var/lib/sandcell/sandboxes/sc-1/upper: No such file or directory \
             (snapshot \"/run/sandcell/x\"); the agent did not answer /init; see a/b or \
             http://host/x/y",
        );
        assert_eq!(
            e.public_message(),
            "creating <path>: No such file or directory (snapshot \"<path>\"); the agent \
             did not answer /init; see a/b or http://host/x/y"
        );
        let e = ApiError::bad_request("no agent at /var/lib/sandcell/images/x/rootfs");
        assert_eq!(
            e.public_message(),
            e.message,
            "4xx messages are left as they are"
        );
    }

    #[test]
    fn volume_storage_details_stay_in_the_log() {
        use crate::volumes::bucket::BucketError;
        use crate::volumes::service::VolumeError;
        use crate::volumes::shared::SharedError;
        let answer = |e: SharedError| ApiError::from(VolumeError::from(e));
        let e = answer(SharedError::Held {
            id: "vol-1".into(),
            holder: "daemon-abc".into(),
            host: "node7.internal".into(),
            secs: 30,
        });
        assert_eq!(e.status, StatusCode::CONFLICT);
        assert!(!e.message.contains("node7") && !e.message.contains("daemon-abc"));
        let e = answer(
            BucketError::Unreachable {
                endpoint: "http://10.0.0.5:8333".into(),
                detail: "error sending request: connection refused".into(),
            }
            .into(),
        );
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.message, "volume storage unavailable; try again later");
        let e = answer(
            BucketError::Status {
                method: "PUT",
                key: "vol-1/sandcell-meta/lease.json".into(),
                status: 500,
                message: "InternalError: disk".into(),
            }
            .into(),
        );
        assert_eq!(e.status, StatusCode::BAD_GATEWAY);
        assert!(!e.message.contains("lease.json") && !e.message.contains("InternalError"));
    }

    #[test]
    fn service_errors_keep_their_statuses_and_messages() {
        use crate::sandboxes::error::InitError;
        use crate::snapshots::error::SnapshotError;
        use crate::templates::error::TemplateError;
        let answer = |e: ApiError| (e.status.as_u16(), e.message);
        assert_eq!(
            answer(SnapshotError::SandboxNotFound("sc-1".into()).into()),
            answer(ApiError::sandbox_not_found("sc-1"))
        );
        assert_eq!(
            answer(SnapshotError::AlreadyPaused("sc-1".into()).into()),
            (409, "sandbox sc-1 is already paused".into())
        );
        let still_running = SnapshotError::PauseFailedStillRunning {
            id: "sc-1".into(),
            why: "busy".into(),
        };
        assert_eq!(
            answer(still_running.into()),
            (
                503,
                "pausing sandbox sc-1 failed: busy; the sandbox keeps running".into()
            )
        );
        assert_eq!(answer(SnapshotError::ForkCount(0).into()).0, 400);
        // Refused for the guest's own doing: 409, and the cause (a guest path) is kept.
        let refused = SnapshotError::Runtime(sandcell_runtime::Error::Refused {
            runtime: sandcell_runtime::RuntimeKind::Gvisor,
            id: "sc-1".into(),
            op: "checkpoint",
            why: "a socket bound in /run/sandcell-host (x.sock)".into(),
        });
        let (status, message) = answer(refused.into());
        assert_eq!(status, 409);
        assert!(message.contains("/run/sandcell-host (x.sock)"), "{message}");
        assert_eq!(
            answer(
                TemplateError::NoSuchTag {
                    name: "web".into(),
                    tag: "v1".into()
                }
                .into()
            ),
            (404, "template 'web' has no tag 'v1'".into())
        );
        assert_eq!(answer(TemplateError::NoTags.into()).0, 400);
        let in_use = TemplateError::InUse {
            name: "web".into(),
            users: vec!["sandbox sc-1 (running)".into(), "snapshot snap-1".into()],
            others: 0,
        };
        assert_eq!(
            answer(in_use.into()),
            (
                409,
                "template 'web' is in use by sandbox sc-1 (running), snapshot snap-1".into()
            )
        );
        // Other keys' sandboxes are counted, never named.
        let in_use = TemplateError::InUse {
            name: "web".into(),
            users: vec![],
            others: 2,
        };
        assert_eq!(
            answer(in_use.into()),
            (
                409,
                "template 'web' is in use by 2 sandboxes or snapshots of other keys".into()
            )
        );
        assert_eq!(answer(TemplateError::NotOwner("web".into()).into()).0, 403);
        // The proxy's answer goes through as it is; the agent's own failures are 500s.
        let gone = ApiError::bad_gateway("sandbox sc-1 is not reachable");
        assert_eq!(ApiError::from(InitError::Unreachable(gone.clone())), gone);
        let refused = InitError::Refused {
            id: "sc-1".into(),
            status: StatusCode::BAD_REQUEST,
        };
        assert_eq!(
            answer(refused.into()),
            (
                500,
                "sandbox sc-1: the agent answered /init with 400 Bad Request".into()
            )
        );
    }

    #[test]
    fn the_request_id_is_in_5xx_bodies_only() {
        let body = |e: ApiError| serde_json::to_value(e.body(Some("abc"))).unwrap();
        let b = body(ApiError::internal("reading /a/b: denied"));
        assert_eq!(b["code"], 500);
        assert_eq!(b["message"], "reading <path>: denied (request id abc)");
        assert_eq!(b["requestId"], "abc");
        let b = body(ApiError::not_found("no such sandbox"));
        assert_eq!(
            b,
            serde_json::json!({"code": 404, "message": "no such sandbox"})
        );
    }
}
