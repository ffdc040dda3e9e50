//! `exec`: a shell command in a sandbox (envd's Start stream through the daemon's proxy),
//! its output streamed to the client as progress notifications while it runs, and kept in
//! the result with its exit code.
//!
//! The command is killed (SIGKILL to its process group, through envd) when its timeout
//! passes, when the client cancels the call (`notifications/cancelled`, or an HTTP client
//! going away), and when the call's future is dropped without either (the server shutting
//! down): [`KillOnDrop`]. A model that cancelled a call must not leave a process behind.

use crate::error::ToolError;
use rmcp::RoleServer;
use rmcp::model::{CallToolResult, ContentBlock, ProgressNotificationParam};
use rmcp::service::RequestContext;
use sandcell_client::{Client, ClientError, Envd, Output, decode_data};
use sandcell_proto::agent::process::StartRequest;
use sandcell_proto::agent::{EndEvent, Event, ProcessConfig};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// Default and largest timeout of a command.
const DEFAULT_TIMEOUT_SECS: u64 = 60;
const MAX_TIMEOUT_SECS: u64 = 3600;
/// Bytes kept of each of stdout and stderr: this much of the start, as much of the end.
const KEEP_HEAD: usize = 32 * 1024;
const KEEP_TAIL: usize = 32 * 1024;
/// The largest progress message (one output chunk, cut here).
const MAX_PROGRESS_MESSAGE: usize = 8 * 1024;
/// How long the end of a killed command is waited for.
const KILL_GRACE: Duration = Duration::from_secs(10);
/// SIGKILL: a cancelled or timed-out command gets no chance to linger.
const SIGKILL: i32 = 9;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// The sandbox's id.
    pub sandbox_id: String,
    /// A shell command line, run as `sh -c COMMAND` (pipes, redirections and && work).
    pub command: String,
    /// Working directory (default: the user's home).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub cwd: Option<String>,
    /// Run as this user: `user` (default in most templates) or `root`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "String")]
    pub user: Option<String>,
    /// Extra environment variables for this command.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Seconds before the command is killed (default 60, at most 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "u64")]
    pub timeout_seconds: Option<u64>,
}

/// How many `exec` calls run a command, for a server that must not exit under them.
#[derive(Debug, Clone)]
pub struct Running(tokio::sync::watch::Sender<usize>);

impl Default for Running {
    fn default() -> Self {
        Running(tokio::sync::watch::Sender::new(0))
    }
}

impl Running {
    /// Counts one command until the returned guard drops.
    fn enter(&self) -> RunningGuard {
        self.0.send_modify(|n| *n += 1);
        RunningGuard(self.0.clone())
    }

    /// Waits until no command runs, at most the time a killed one is given to end.
    pub async fn wait_idle(&self) {
        let mut rx = self.0.subscribe();
        let idle = rx.wait_for(|n| *n == 0);
        if tokio::time::timeout(KILL_GRACE + Duration::from_secs(5), idle)
            .await
            .is_err()
        {
            tracing::warn!("exiting with exec calls still running in sandboxes");
        }
    }
}

struct RunningGuard(tokio::sync::watch::Sender<usize>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Kills the process when dropped before [`KillOnDrop::disarm`]: the call's future went
/// away (cancelled or shut down) while the process ran.
struct KillOnDrop {
    envd: Envd,
    pid: Option<u32>,
}

impl KillOnDrop {
    fn disarm(&mut self) {
        self.pid = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.pid.take() {
            let envd = self.envd.clone();
            // Drop cannot wait; a runtime is there while a tool call is (rmcp's tasks).
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    if let Err(e) = envd.send_signal(pid, SIGKILL).await {
                        tracing::warn!("killing process {pid} of an abandoned exec: {e}");
                    }
                });
            }
        }
    }
}

/// Head and tail of one output stream.
#[derive(Debug, Default)]
struct Kept {
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: usize,
}

impl Kept {
    fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len();
        let room = KEEP_HEAD.saturating_sub(self.head.len());
        let n = room.min(bytes.len());
        self.head.extend_from_slice(&bytes[..n]);
        bytes = &bytes[n..];
        self.tail.extend(bytes);
        while self.tail.len() > KEEP_TAIL {
            self.tail.pop_front();
        }
    }

    fn omitted(&self) -> usize {
        self.total - self.head.len() - self.tail.len()
    }

    fn text(&self) -> String {
        let mut out = String::from_utf8_lossy(&self.head).into_owned();
        if self.omitted() > 0 {
            out.push_str(&format!("\n[... {} bytes omitted ...]\n", self.omitted()));
        }
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        out.push_str(&String::from_utf8_lossy(&tail));
        out
    }
}

/// How the command ended.
enum Ending {
    End(EndEvent),
    TimedOut,
    Cancelled,
    /// The stream broke: the sandbox went away, or the daemon.
    Lost(ClientError),
}

pub async fn exec(
    client: &Client,
    running: &Running,
    a: ExecArgs,
    ctx: &RequestContext<RoleServer>,
) -> Result<CallToolResult, ToolError> {
    let _running = running.enter();
    let secs = a.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECS);
    if secs == 0 || secs > MAX_TIMEOUT_SECS {
        return Err(ToolError::Invalid(format!(
            "timeout_seconds {secs} is out of range: 1 to {MAX_TIMEOUT_SECS}"
        )));
    }
    if a.command.trim().is_empty() {
        return Err(ToolError::Invalid(
            "command is empty: give a shell command line".into(),
        ));
    }
    let id = &a.sandbox_id;
    let envd = client
        .connect_envd(id)
        .await
        .map_err(|e| ToolError::daemon(&e, Some(id)))?
        .as_user(a.user.clone());
    let request = StartRequest {
        process: ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), a.command.clone()],
            envs: a.env.clone(),
            cwd: a.cwd.clone(),
        },
        pty: None,
        tag: None,
        stdin: Some(false),
    };
    let mut stream = envd
        .start(&request)
        .await
        .map_err(|e| start_error(&e, id))?;
    let progress = ctx.meta.get_progress_token();
    let mut guard = KillOnDrop {
        envd: envd.clone(),
        pid: None,
    };
    let (mut stdout, mut stderr) = (Kept::default(), Kept::default());
    let mut sent = 0usize;
    let deadline = tokio::time::sleep(Duration::from_secs(secs));
    tokio::pin!(deadline);
    // Set once the process was told to die: then only its end is waited for, KILL_GRACE
    // (the grace timer is re-armed then; until then it is past the command's own timeout).
    let mut killed: Option<Ending> = None;
    let grace = tokio::time::sleep(Duration::from_secs(MAX_TIMEOUT_SECS * 2));
    tokio::pin!(grace);
    let ending = loop {
        let event = tokio::select! {
            event = stream.next() => event,
            _ = &mut deadline, if killed.is_none() => {
                killed = Some(Ending::TimedOut);
                kill_now(&envd, guard.pid).await;
                grace.as_mut().reset(tokio::time::Instant::now() + KILL_GRACE);
                continue;
            }
            _ = ctx.ct.cancelled(), if killed.is_none() => {
                tracing::info!("exec in sandbox {id} cancelled by the client: killing process {:?}", guard.pid);
                killed = Some(Ending::Cancelled);
                kill_now(&envd, guard.pid).await;
                grace.as_mut().reset(tokio::time::Instant::now() + KILL_GRACE);
                continue;
            }
            _ = &mut grace => break killed.take().unwrap_or(Ending::Cancelled),
        };
        match event {
            Some(Ok(message)) => match message.event {
                Event::Start(start) => guard.pid = Some(start.pid),
                Event::Data(data) => {
                    let (kind, bytes) =
                        decode_data(&data).map_err(|e| ToolError::daemon(&e, Some(id)))?;
                    if bytes.is_empty() {
                        continue;
                    }
                    match kind {
                        Output::Stderr => stderr.push(&bytes),
                        Output::Stdout | Output::Pty => stdout.push(&bytes),
                    }
                    sent += bytes.len();
                    if let (Some(token), None) = (&progress, &killed) {
                        let mut text = String::from_utf8_lossy(
                            &bytes[..bytes.len().min(MAX_PROGRESS_MESSAGE)],
                        )
                        .into_owned();
                        if matches!(kind, Output::Stderr) {
                            text.insert_str(0, "[stderr] ");
                        }
                        let note = ProgressNotificationParam::new(token.clone(), sent as f64)
                            .with_message(text);
                        if let Err(e) = ctx.peer.notify_progress(note).await {
                            tracing::debug!("exec progress notification not sent: {e}");
                        }
                    }
                }
                Event::End(end) => break killed.take().unwrap_or(Ending::End(end)),
                Event::Keepalive(_) => {}
            },
            Some(Err(e)) if guard.pid.is_none() => return Err(start_error(&e, id)),
            Some(Err(e)) => break killed.take().unwrap_or(Ending::Lost(e)),
            None => {
                break killed.take().unwrap_or(Ending::Lost(ClientError::Body(
                    "the process stream ended without an end event".into(),
                )));
            }
        }
    };
    // The process ended, or was killed and waited for: nothing to kill on drop.
    guard.disarm();
    Ok(result(id, secs, ending, &stdout, &stderr))
}

async fn kill_now(envd: &Envd, pid: Option<u32>) {
    if let Some(pid) = pid
        && let Err(e) = envd.send_signal(pid, SIGKILL).await
    {
        tracing::warn!(
            "killing process {pid} in sandbox {}: {e}",
            envd.sandbox_id()
        );
    }
}

/// Why a command could not start: a command error the model can fix, or the sandbox's.
fn start_error(e: &ClientError, id: &str) -> ToolError {
    match e {
        ClientError::Rpc { message, .. } => ToolError::Invalid(format!(
            "the command could not start in sandbox {id}: {message} (check cwd and user)"
        )),
        ClientError::Envd {
            status, message, ..
        } if status.is_client_error() && status.as_u16() != 404 => ToolError::Invalid(format!(
            "the command could not start in sandbox {id}: {message} (check cwd and user)"
        )),
        other => ToolError::daemon(other, Some(id)),
    }
}

fn result(id: &str, secs: u64, ending: Ending, stdout: &Kept, stderr: &Kept) -> CallToolResult {
    let truncated = stdout.omitted() > 0 || stderr.omitted() > 0;
    let (exit_code, status, is_error) = match &ending {
        Ending::End(end) => (Some(end.shell_status()), end.status.clone(), false),
        Ending::TimedOut => (
            None,
            format!("killed: still running after timeout_seconds={secs}"),
            false,
        ),
        Ending::Cancelled => (None, "killed: the call was cancelled".to_string(), false),
        Ending::Lost(e) => (
            None,
            format!("lost the command: {} ", crate::error::explain(e, Some(id))),
            true,
        ),
    };
    let (out, err) = (stdout.text(), stderr.text());
    let mut text = match exit_code {
        Some(code) => format!("exit code {code}"),
        None => status.clone(),
    };
    if truncated {
        text.push_str(" (output truncated: the middle of long output was left out)");
    }
    text.push_str("\n--- stdout ---\n");
    text.push_str(&out);
    if !err.is_empty() {
        text.push_str("\n--- stderr ---\n");
        text.push_str(&err);
    }
    let structured = json!({
        "sandbox_id": id,
        "exit_code": exit_code,
        "status": status,
        "timed_out": matches!(ending, Ending::TimedOut),
        "stdout": out,
        "stderr": err,
        "truncated": truncated,
        "stdout_bytes": stdout.total,
        "stderr_bytes": stderr.total,
    });
    let mut result = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text)])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text)])
    };
    result.structured_content = Some(structured);
    result
}

/// Runs `command` (as the default user) and returns its stdout; for tools that read a
/// sandbox's state (port_url).
pub async fn capture(client: &Client, id: &str, command: &str) -> Result<String, ToolError> {
    let envd = client
        .connect_envd(id)
        .await
        .map_err(|e| ToolError::daemon(&e, Some(id)))?;
    let request = StartRequest {
        process: ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), command.to_string()],
            envs: BTreeMap::new(),
            cwd: None,
        },
        pty: None,
        tag: None,
        stdin: Some(false),
    };
    let mut stream = envd
        .start(&request)
        .await
        .map_err(|e| start_error(&e, id))?;
    let mut kept = Kept::default();
    let read = async {
        while let Some(event) = stream.next().await {
            let event = event.map_err(|e| ToolError::daemon(&e, Some(id)))?;
            if let Event::Data(d) = event.event
                && let Ok((Output::Stdout, bytes)) = decode_data(&d)
            {
                kept.push(&bytes);
            }
        }
        Ok::<(), ToolError>(())
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .map_err(|_| ToolError::Daemon(format!("sandbox {id} took over 20 s to answer")))??;
    Ok(kept.text())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_output_keeps_its_head_and_tail() {
        let mut k = Kept::default();
        k.push(&vec![b'a'; KEEP_HEAD]);
        k.push(&vec![b'b'; 1000]);
        k.push(&vec![b'c'; KEEP_TAIL]);
        assert_eq!(k.omitted(), 1000);
        let text = k.text();
        assert!(text.starts_with("aaa"));
        assert!(text.ends_with("ccc"));
        assert!(text.contains("[... 1000 bytes omitted ...]"));
        assert!(!text.contains("bb"));
    }

    #[test]
    fn short_output_is_kept_whole() {
        let mut k = Kept::default();
        k.push(b"hello ");
        k.push(b"world");
        assert_eq!(k.omitted(), 0);
        assert_eq!(k.text(), "hello world");
    }
}
