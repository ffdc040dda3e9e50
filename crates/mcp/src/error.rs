//! Tool errors: what a model reads in a result with `isError`. Each message says what
//! failed, on what, and which tool or argument to use next.

use sandcell_client::ClientError;

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("invalid arguments for {tool}: {problem}. The tool's input schema lists the fields.")]
    Arguments { tool: String, problem: String },
    #[error("unknown tool {0:?}: list the tools (tools/list) for the names this server has")]
    UnknownTool(String),
    /// A request to the HTTP server without an API key (the route refuses these first).
    #[error(
        "this request carries no API key: send it as `Authorization: Bearer KEY` or `X-API-KEY: KEY`"
    )]
    NoKey,
    /// A value the tool refuses (too large, out of range, not text, ...).
    #[error("{0}")]
    Invalid(String),
    /// The daemon or the sandbox refused or failed; the message is [`explain`]'s.
    #[error("{0}")]
    Daemon(String),
}

impl ToolError {
    /// A daemon error, explained for a call about `sandbox` (if any).
    pub fn daemon(e: &ClientError, sandbox: Option<&str>) -> ToolError {
        ToolError::Daemon(explain(e, sandbox))
    }
}

/// What went wrong with a call to the daemon, and what to do about it.
pub fn explain(error: &ClientError, sandbox: Option<&str>) -> String {
    let status = error.status().map(|s| s.as_u16());
    match (error, status) {
        (ClientError::Connect { addr, source }, _) => format!(
            "the Sandcell daemon at {addr} does not answer ({source}); it may be stopped: \
             retry later or ask the user to start `sandcell serve`"
        ),
        (ClientError::Api { message, .. }, Some(401)) => format!(
            "the daemon refused the API key ({message}); ask the user for a valid Sandcell API key"
        ),
        (ClientError::Api { message, .. }, Some(403)) => {
            format!("not allowed for this API key: {message}")
        }
        (ClientError::Api { message, .. }, Some(404)) => match sandbox {
            Some(id) => format!(
                "no sandbox {id} for this API key ({message}); it may have been killed or \
                 reached its timeout: call sandbox_list to see the live ones, or \
                 sandbox_create for a new one"
            ),
            None => format!("not found: {message}"),
        },
        (ClientError::Api { message, .. }, Some(409)) => format!(
            "{message} (a conflict with the sandbox's state: sandbox_info shows it; a paused \
             sandbox needs sandbox_resume first)"
        ),
        (ClientError::Api { message, .. }, Some(429)) => format!(
            "{message}: kill sandboxes you no longer need (sandbox_list, sandbox_kill) and retry"
        ),
        (ClientError::Api { message, .. }, Some(400)) => {
            format!("the daemon refused the request: {message}")
        }
        (ClientError::Api { status, message }, _) => {
            format!("the daemon failed ({status}): {message}")
        }
        (ClientError::Envd { message, .. }, Some(502..=504)) => match sandbox {
            Some(id) => format!(
                "sandbox {id} does not answer ({message}): is it still running? sandbox_info \
                 shows its state; a paused one needs sandbox_resume"
            ),
            None => message.clone(),
        },
        (ClientError::Envd { message, .. }, Some(404)) => match sandbox {
            Some(id) => format!("not found in sandbox {id}: {message}"),
            None => format!("not found: {message}"),
        },
        (ClientError::Envd { message, .. }, Some(401 | 403)) => format!(
            "the sandbox refused the call ({message}); check the user (`root` or `user`) and \
             the path's permissions"
        ),
        (ClientError::Envd { message, .. }, _) => message.clone(),
        (ClientError::Rpc { message, .. }, _) => message.clone(),
        (other, _) => format!("talking to the Sandcell daemon failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::StatusCode;

    #[test]
    fn a_missing_sandbox_says_what_to_call() {
        let e = ClientError::Api {
            status: StatusCode::NOT_FOUND,
            message: "sandbox sb-1 not found".into(),
        };
        let text = explain(&e, Some("sb-1"));
        assert!(text.contains("no sandbox sb-1"), "{text}");
        assert!(text.contains("sandbox_list"), "{text}");
    }

    #[test]
    fn a_quota_says_to_kill_sandboxes() {
        let e = ClientError::Api {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: "at most 1 sandbox".into(),
        };
        assert!(explain(&e, None).contains("sandbox_kill"));
    }
}
