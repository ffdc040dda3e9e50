//! What a template built through the template API (`images/<name>/e2b.json`,
//! templates/builds.rs) gives the sandboxes created from it: its `cpuCount`/`memoryMB` as
//! their default size, and E2B's `startCmd` and `readyCmd`: when a sandbox is created from it, the
//! start command is launched in the background (`/bin/sh -c`, as the template's default
//! user, in its working directory) and the ready command is run until it exits 0; only then
//! does the create answer. A ready command that never succeeds within [`READY_TIMEOUT`]
//! fails the create (the sandbox is killed).
//!
//! E2B runs them once at build time and snapshots the result, so that creates restore a
//! running start command; here they run at each create (sandboxes restored from snapshots
//! or forks already have it running and skip this).

use crate::sandboxes::service::SandboxService;
use crate::store::SandboxRow;
use crate::templates::builds::{E2B_FILE, E2bRecord};
use crate::templates::error::TemplateError;
use sandcell_envd_client::{ClientError, ProcessStream};
use sandcell_proto::agent::{Event, ProcessConfig, StartRequest};
use sandcell_runtime::{Sandbox, agent_client};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the ready command gets to succeed.
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Between two runs of the ready command.
const READY_INTERVAL: Duration = Duration::from_millis(300);
/// Largest `e2b.json` read.
const MAX_RECORD_BYTES: u64 = 1 << 20;
/// Largest event message read from the agent.
const MAX_ENVELOPE: usize = 1 << 20;

/// `e2b.json` of the template, if it was built through the template API.
pub fn record(lifecycle: &SandboxService, template: &str) -> Option<E2bRecord> {
    use std::io::Read;
    if !crate::sandboxes::service::valid_template_name(template) {
        return None;
    }
    let path = lifecycle.dirs().images().join(template).join(E2B_FILE);
    let mut bytes = Vec::new();
    std::fs::File::open(&path)
        .ok()?
        .take(MAX_RECORD_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// A create's `cpuCount` and `memoryMB`, else those the template (`rec`) was built with.
pub fn default_size(
    rec: Option<&E2bRecord>,
    cpu_count: Option<u32>,
    memory_mb: Option<u32>,
) -> (Option<u32>, Option<u32>) {
    match rec {
        Some(rec) => (cpu_count.or(rec.cpu_count), memory_mb.or(rec.memory_mb)),
        None => (cpu_count, memory_mb),
    }
}

fn shell(cmd: &str, tag: &str) -> StartRequest {
    StartRequest {
        process: ProcessConfig {
            cmd: "/bin/sh".into(),
            args: vec!["-c".into(), cmd.to_string()],
            envs: Default::default(),
            cwd: None,
        },
        stdin: Some(false),
        tag: Some(tag.to_string()),
    }
}

/// Runs the start and ready commands of the new sandbox `row`'s template (`rec`); on failure
/// it is killed and the create fails with the reason.
pub async fn after_create(
    lifecycle: &Arc<SandboxService>,
    row: &SandboxRow,
    rec: Option<&E2bRecord>,
) -> Result<(), TemplateError> {
    let Some(rec) = rec else {
        return Ok(());
    };
    if rec.start_cmd.is_none() && rec.ready_cmd.is_none() {
        return Ok(());
    }
    let Some(live) = lifecycle.live(&row.id) else {
        return Err(TemplateError::GoneBeforeStart {
            sandbox: row.id.clone(),
        });
    };
    let result = run(&live.sandbox, live.access_token.as_deref(), rec).await;
    if let Err(problem) = result {
        let failed = TemplateError::StartFailed {
            sandbox: row.id.clone(),
            template: row.template_id.clone(),
            problem,
        };
        let _ = lifecycle.kill(&row.id, &failed.to_string()).await;
        return Err(failed);
    }
    Ok(())
}

/// The agent's `Start` of `/bin/sh -c cmd` (with the sandbox's access token), as a stream
/// of events.
struct Process {
    stream: ProcessStream,
    what: String,
}

impl Process {
    async fn start(
        sandbox: &Arc<dyn Sandbox>,
        token: Option<&str>,
        cmd: &str,
        tag: &str,
    ) -> Result<Process, String> {
        let what = format!("{tag} {cmd:?}");
        let client = agent_client(sandbox.clone())
            .with_access_token(token.map(str::to_string))
            .with_max_envelope(MAX_ENVELOPE);
        let stream = client
            .start(&shell(cmd, tag))
            .await
            .map_err(|e| format!("{what}: {e}"))?;
        Ok(Process { stream, what })
    }

    /// The next event; `None` at the end of the stream. An error the agent reports at the
    /// end (the command could not be run) ends the stream without an exit status, as before
    /// the client did the reading: the ready command is then tried again.
    async fn next(&mut self) -> Result<Option<Event>, String> {
        match self.stream.next().await {
            None | Some(Err(ClientError::Rpc { .. })) => Ok(None),
            Some(Ok(ev)) => Ok(Some(ev.event)),
            Some(Err(e)) => Err(format!("{}: {e}", self.what)),
        }
    }
}

async fn run(
    sandbox: &Arc<dyn Sandbox>,
    token: Option<&str>,
    rec: &E2bRecord,
) -> Result<(), String> {
    if let Some(cmd) = &rec.start_cmd {
        let mut process = Process::start(sandbox, token, cmd, "startCmd").await?;
        // Started once the agent says so; the stream is then let go (the process runs on).
        match process.next().await? {
            Some(Event::Start(_)) => {}
            _ => return Err(format!("startCmd {cmd:?}: the agent did not start it")),
        }
    }
    let Some(ready) = &rec.ready_cmd else {
        return Ok(());
    };
    let begun = Instant::now();
    loop {
        let mut process = Process::start(sandbox, token, ready, "readyCmd").await?;
        let mut status = None;
        while let Some(event) = process.next().await? {
            if let Event::End(end) = event {
                status = Some(end.shell_status());
            }
        }
        if status == Some(0) {
            return Ok(());
        }
        if begun.elapsed() > READY_TIMEOUT {
            return Err(format!(
                "readyCmd {ready:?} did not succeed within {READY_TIMEOUT:?} (last exit status \
                 {status:?})"
            ));
        }
        tokio::time::sleep(READY_INTERVAL).await;
    }
}
