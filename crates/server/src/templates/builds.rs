//! E2B template builds (the routes are in templates/api.rs): an E2B build request (base,
//! steps, start and ready commands) as Dockerfile text for crates/image's template builder,
//! the build run on a blocking thread with the gVisor [`GvisorRunner`], and its state and
//! logs: in memory while the daemon runs, in SQLite (migration 6) once it ends, so that
//! `GET .../status` still answers after a restart (a build the restart cut short is
//! `error`, reason `interrupted`).
//!
//! The request and its mapping to a Dockerfile: templates/plan.rs.

use crate::App;
use crate::error::Error;
use crate::sandboxes::service::SandboxService;
use crate::store::Db;
use crate::templates::memory_snapshot::{self, TakeError};
use crate::templates::plan::{BuildStart, Plan, registry_auth};
use crate::util::now_ms;
use sandcell_image::Limits;
use sandcell_image::registry::PullOptions;
use sandcell_image::template::{self, BuildEvent, BuildLog, TemplateBuild};
use sandcell_proto::sync::lock;
use sandcell_runtime::build_disk::BuildDisk;
use sandcell_runtime::build_steps::{GvisorRunner, StepDeadlines};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Log entries kept per build (later output is dropped, with a note).
const MAX_LOG_ENTRIES: usize = 20_000;
/// A longer output line is cut.
const MAX_LINE_BYTES: usize = 4096;
/// How many of the last log entries an error's `reason` carries.
const REASON_LOG_ENTRIES: usize = 20;
/// E2B's name of what comes after the steps.
pub const FINALIZE_STEP: &str = "finalize";
/// Where `startCmd`/`readyCmd` are kept in the built image's directory.
pub const E2B_FILE: &str = "e2b.json";
/// The RUN sandboxes' size when `POST /v3/templates` gave none, and the largest.
const DEFAULT_BUILD_MEMORY_MIB: u32 = 1024;
const MAX_BUILD_MEMORY_MIB: u32 = 8192;
const DEFAULT_BUILD_VCPUS: u8 = 2;
const MAX_BUILD_VCPUS: u32 = 8;

/// `waiting` (made, not started), `building`, `ready`, `error` (E2B's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Waiting,
    Building,
    Ready,
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Waiting => "waiting",
            Status::Building => "building",
            Status::Ready => "ready",
            Status::Error => "error",
        }
    }

    pub(crate) fn parse(s: &str) -> Status {
        match s {
            "waiting" => Status::Waiting,
            "building" => Status::Building,
            "ready" => Status::Ready,
            _ => Status::Error,
        }
    }

    pub fn is_final(self) -> bool {
        matches!(self, Status::Ready | Status::Error)
    }
}

/// `debug < info < warn < error`.
pub fn level_rank(level: &str) -> u8 {
    match level {
        "debug" => 0,
        "info" => 1,
        "warn" => 2,
        _ => 3,
    }
}

#[derive(Debug, Clone)]
pub struct LogEntry {
    pub timestamp_ms: i64,
    pub level: &'static str,
    pub message: String,
    pub step: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Reason {
    pub message: String,
    pub step: Option<String>,
}

/// A build's state as the status route shows it.
#[derive(Debug, Clone)]
pub struct BuildReport {
    pub template_id: String,
    pub key_id: String,
    pub status: Status,
    pub logs: Vec<LogEntry>,
    pub reason: Option<Reason>,
}

#[derive(Debug)]
struct Progress {
    status: Status,
    logs: Vec<LogEntry>,
    reason: Option<Reason>,
    /// The E2B step running now.
    step: Option<String>,
    /// Output not ended by a newline yet.
    partial: Vec<u8>,
}

/// A build of this daemon's lifetime.
#[derive(Debug)]
pub struct Build {
    pub build_id: String,
    pub template_id: String,
    pub key_id: String,
    pub cpu_count: Option<u32>,
    pub memory_mb: Option<u32>,
    progress: Mutex<Progress>,
    /// Host directories no log line or reason may name ([`redact_paths`]).
    hidden: Arc<Vec<String>>,
}

impl Build {
    fn lock(&self) -> std::sync::MutexGuard<'_, Progress> {
        // A panic while holding it leaves plain data: still usable.
        lock(&self.progress)
    }

    pub fn status(&self) -> Status {
        self.lock().status
    }

    pub fn report(&self) -> BuildReport {
        let p = self.lock();
        BuildReport {
            template_id: self.template_id.clone(),
            key_id: self.key_id.clone(),
            status: p.status,
            logs: p.logs.clone(),
            reason: p.reason.clone(),
        }
    }

    fn push(p: &mut Progress, level: &'static str, message: String) {
        if p.logs.len() >= MAX_LOG_ENTRIES {
            return;
        }
        let mut message = message;
        if message.len() > MAX_LINE_BYTES {
            let mut cut = MAX_LINE_BYTES;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push('…');
        }
        if p.logs.len() + 1 == MAX_LOG_ENTRIES {
            message = format!(
                "(log limit of {MAX_LOG_ENTRIES} entries reached; later output is dropped)"
            );
        }
        let step = p.step.clone();
        p.logs.push(LogEntry {
            timestamp_ms: now_ms(),
            level,
            message,
            step,
        });
    }

    pub fn log(&self, level: &'static str, message: impl Into<String>) {
        let mut p = self.lock();
        self.flush_partial(&mut p);
        Build::push(&mut p, level, redact_paths(&message.into(), &self.hidden));
    }

    fn flush_partial(&self, p: &mut Progress) {
        if !p.partial.is_empty() {
            let line = String::from_utf8_lossy(&std::mem::take(&mut p.partial)).into_owned();
            Build::push(p, "info", redact_paths(&line, &self.hidden));
        }
    }

    fn output(&self, bytes: &[u8]) {
        let mut p = self.lock();
        p.partial.extend_from_slice(bytes);
        while let Some(nl) = p.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = p.partial.drain(..=nl).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            let text = redact_paths(text.trim_end_matches('\r'), &self.hidden);
            Build::push(&mut p, "info", text);
        }
        if p.partial.len() > MAX_LINE_BYTES {
            self.flush_partial(&mut p);
        }
    }

    fn set_step(&self, step: Option<String>) {
        let mut p = self.lock();
        self.flush_partial(&mut p);
        p.step = step;
    }

    fn set_status(&self, status: Status, reason: Option<Reason>) {
        let mut p = self.lock();
        self.flush_partial(&mut p);
        p.status = status;
        if let Some(mut reason) = reason {
            reason.message = redact_paths(&reason.message, &self.hidden);
            p.reason = Some(reason);
        }
    }
}

/// `text` with every path under one of the `hidden` directories (the daemon's data and run
/// dirs: overlay mounts, layer and sandbox directories, with their ids) as `<path>`: a
/// tenant's build log and reason say what failed, not where on the host. A path ends at
/// whitespace, a quote, `:`, `,`, `;` or `)`.
pub fn redact_paths(text: &str, hidden: &[String]) -> String {
    let mut out = text.to_string();
    for dir in hidden.iter().filter(|d| d.len() > 1) {
        let mut done = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(at) = rest.find(dir.as_str()) {
            let after = &rest[at + dir.len()..];
            // `/var/lib/sandcell` must not match `/var/lib/sandcellx`.
            let boundary = after
                .chars()
                .next()
                .is_none_or(|c| c == '/' || ends_path(c));
            if !boundary {
                done.push_str(&rest[..at + dir.len()]);
                rest = after;
                continue;
            }
            let end = after.find(ends_path).unwrap_or(after.len());
            done.push_str(&rest[..at]);
            done.push_str("<path>");
            rest = &after[end..];
        }
        done.push_str(rest);
        out = done;
    }
    out
}

fn ends_path(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | ':' | ',' | ';' | ')' | '`')
}

/// The limits of builds (`sandcell serve --build-timeout`, `--build-step-timeout`,
/// `--build-start-timeout`; how many builds and uploads a key may have are its quotas,
/// keys/quota.rs).
#[derive(Debug, Clone)]
pub struct BuildLimits {
    /// A build running longer fails (its RUN sandbox killed).
    pub build_timeout: Duration,
    /// A RUN step or pull running longer fails the build.
    pub step_timeout: Duration,
    /// A build not started within it after its request expires (its name is freed).
    pub start_timeout: Duration,
    /// What a build's RUN steps may write on the host, in MiB (0: no limit;
    /// sandcell_runtime::build_disk).
    pub disk_mib: u32,
    /// The data disk's free space a RUN step's disk leaves (`--min-free-disk-mib`).
    pub host_reserve_mib: u64,
}

impl Default for BuildLimits {
    fn default() -> BuildLimits {
        BuildLimits {
            build_timeout: Duration::from_secs(1800),
            step_timeout: Duration::from_secs(900),
            start_timeout: Duration::from_secs(1800),
            disk_mib: 10240,
            host_reserve_mib: 2048,
        }
    }
}

/// The host directories build logs must not name: the data and run dirs, and where the
/// data dir's images link to (installed images are often symbolic links to another tree,
/// which build errors name resolved).
pub fn host_dirs(dirs: &sandcell_runtime::Dirs) -> Vec<PathBuf> {
    let mut out = vec![dirs.data.clone(), dirs.run.clone()];
    if let Ok(entries) = std::fs::read_dir(dirs.images()) {
        for entry in entries.flatten() {
            let linked = entry.file_type().is_ok_and(|t| t.is_symlink());
            if let Some(parent) = linked
                .then(|| std::fs::canonicalize(entry.path()).ok())
                .flatten()
                .and_then(|target| target.parent().map(Path::to_path_buf))
                && !out.contains(&parent)
            {
                out.push(parent);
            }
        }
    }
    out
}

/// One daemon's template builds (in [`App`]).
pub struct Builds {
    /// The builds of this daemon's lifetime, by build id.
    live: Mutex<HashMap<String, Arc<Build>>>,
    /// Each key's turns: at most `limits.per_key` of its builds run at once, so one key's
    /// builds (a `RUN sleep infinity`) never hold up another key's. Builds share the layer
    /// cache safely (crates/image: a shared cache lock, blobs and layers appear by rename).
    turns: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// Registries `fromImage` is pulled from over plain HTTP (`sandcell serve
    /// --insecure-registry`).
    insecure_registries: Vec<String>,
    pub limits: BuildLimits,
    /// The host directories build logs never name (the data and run dirs).
    hidden: Arc<Vec<String>>,
}

impl Builds {
    pub fn new(
        insecure_registries: Vec<String>,
        limits: BuildLimits,
        hidden: Vec<PathBuf>,
    ) -> Builds {
        // A path may appear as given or resolved (symbolic links on the way).
        let mut dirs: Vec<String> = Vec::new();
        for dir in hidden {
            let resolved = std::fs::canonicalize(&dir).ok();
            for d in std::iter::once(dir).chain(resolved) {
                let text = d.to_string_lossy().trim_end_matches('/').to_string();
                if !text.is_empty() && !dirs.contains(&text) {
                    dirs.push(text);
                }
            }
        }
        // Longer first: a run dir inside the data dir is redacted whole.
        dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
        Builds {
            live: Mutex::new(HashMap::new()),
            turns: Mutex::new(HashMap::new()),
            insecure_registries,
            limits,
            hidden: Arc::new(dirs),
        }
    }

    /// Key `key_id`'s turns: its `builds` quota (keys/quota.rs; `None`: no limit), fixed
    /// when the key's first build runs.
    fn turns_of(&self, key_id: &str, quota: Option<u64>) -> Arc<tokio::sync::Semaphore> {
        let most = tokio::sync::Semaphore::MAX_PERMITS;
        let cap = quota
            .map_or(most, |q| usize::try_from(q).unwrap_or(most).min(most))
            .max(1);
        lock(&self.turns)
            .entry(key_id.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(cap)))
            .clone()
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Build>>> {
        lock(&self.live)
    }

    pub fn find(&self, build_id: &str) -> Option<Arc<Build>> {
        self.live().get(build_id).cloned()
    }

    /// A build of `template_id` not ended yet, if any.
    pub fn active_for(&self, template_id: &str) -> Option<Arc<Build>> {
        self.live()
            .values()
            .find(|b| b.template_id == template_id && !b.status().is_final())
            .cloned()
    }
}

impl Builds {
    /// A new build (status `waiting`), recorded.
    pub async fn create(
        &self,
        db: &Db,
        build_id: String,
        template_id: String,
        key_id: String,
        cpu_count: Option<u32>,
        memory_mb: Option<u32>,
    ) -> Result<Arc<Build>, Error> {
        db.insert_template_build(
            &build_id,
            &template_id,
            &key_id,
            cpu_count,
            memory_mb,
            now_ms(),
        )
        .await?;
        let build = Arc::new(Build {
            build_id: build_id.clone(),
            template_id,
            key_id,
            cpu_count,
            memory_mb,
            progress: Mutex::new(Progress {
                status: Status::Waiting,
                logs: Vec::new(),
                reason: None,
                step: None,
                partial: Vec::new(),
            }),
            hidden: self.hidden.clone(),
        });
        self.live().insert(build_id, build.clone());
        Ok(build)
    }
}

/// Expires `build` if it is still `waiting` (never started) after the start timeout: it
/// becomes `error` saying so, and a name it claimed and never built is free again.
pub fn expire_unstarted(app: Arc<App>, build: Arc<Build>) {
    let after = app.builds.limits.start_timeout;
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        {
            let mut p = build.lock();
            if p.status != Status::Waiting {
                return;
            }
            // Under the lock: a start now finds it ended (builds::start checks the same).
            p.status = Status::Error;
        }
        let message = format!(
            "the build was not started within {} s of its request: request it again",
            after.as_secs()
        );
        build.log("error", format!("build failed: {message}"));
        build.set_status(
            Status::Error,
            Some(Reason {
                message,
                step: None,
            }),
        );
        finish(&app, &build).await;
    });
}

/// Records `build`'s end and lets go of it; a first build that failed frees its name.
async fn finish(app: &App, build: &Build) {
    match record_status(&app.db, build).await {
        // Recorded: the status route reads it from the database from now on.
        Ok(()) => {
            app.builds.live().remove(&build.build_id);
        }
        Err(e) => tracing::warn!("template build {}: {e}", build.build_id),
    }
    let built = app
        .lifecycle
        .dirs()
        .images()
        .join(&build.template_id)
        .exists();
    if build.status() == Status::Error
        && !built
        && app.builds.active_for(&build.template_id).is_none()
        && let Err(e) = app
            .db
            .release_template(&build.template_id, Some(&build.key_id))
            .await
    {
        tracing::warn!("template {}: {e}", build.template_id);
    }
}

/// At start: builds a previous daemon left unfinished are `error: interrupted`.
pub async fn mark_interrupted(db: &Db) -> Result<u64, Error> {
    db.mark_interrupted_builds(now_ms()).await
}

/// A build of an earlier daemon, from the database.
pub async fn load(db: &Db, build_id: &str) -> Result<Option<BuildReport>, Error> {
    db.template_build(build_id).await
}

async fn record_status(db: &Db, build: &Build) -> Result<(), Error> {
    let report = build.report();
    db.record_build_status(
        &build.build_id,
        &report,
        report.status.is_final().then(now_ms),
    )
    .await
}

/// Where the caller's uploaded COPY archives are extracted (`<hash>/`): the build context.
pub fn files_dir(data: &Path, key_id: &str) -> PathBuf {
    data.join("cache/e2b-files").join(key_id)
}

/// Build events as log entries, each with the E2B step it belongs to.
struct ApiLog {
    build: Arc<Build>,
    steps: Vec<String>,
}

impl BuildLog for ApiLog {
    fn event(&self, event: BuildEvent) {
        match event {
            BuildEvent::Step {
                number,
                total,
                text,
            } => {
                let step = number
                    .checked_sub(1)
                    .and_then(|i| self.steps.get(i))
                    .cloned();
                self.build.set_step(step);
                self.build.log("info", format!("[{number}/{total}] {text}"));
            }
            BuildEvent::Cached => self.build.log("info", "CACHED"),
            BuildEvent::Output(bytes) => self.build.output(&bytes),
            BuildEvent::Note(note) => self.build.log("info", note),
            BuildEvent::Exporting { layers } => {
                self.build.set_step(Some(FINALIZE_STEP.into()));
                self.build
                    .log("info", format!("exporting {layers} layers to the template"));
            }
        }
    }
}

/// `images/<name>/e2b.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct E2bRecord {
    pub build_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_cmd: Option<String>,
    /// The size of sandboxes created from it when the create names none
    /// (`POST /v3/templates`'s `cpuCount` and `memoryMB`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_count: Option<u32>,
    #[serde(default, rename = "memoryMB", skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u32>,
    /// The template's memory snapshot, once taken (templates/memory_snapshot.rs).
    #[serde(
        default,
        rename = "snapshotID",
        skip_serializing_if = "Option::is_none"
    )]
    pub snapshot_id: Option<String>,
}

/// Runs the build in the background; its status and logs tell how it went. `false`: it
/// was started already (only a `waiting` build starts, once).
pub fn start(app: Arc<App>, build: Arc<Build>, plan: Plan, req: BuildStart) -> bool {
    {
        let mut p = build.lock();
        if p.status != Status::Waiting {
            return false;
        }
        p.status = Status::Building;
    }
    build.log(
        "info",
        format!(
            "building template {} ({} steps)",
            build.template_id,
            req.steps.len()
        ),
    );
    tokio::spawn(async move {
        let _ = record_status(&app.db, &build).await;
        let result = run(&app, &build, plan, &req).await;
        match result {
            Ok(()) => {
                build.set_step(None);
                build.log("info", format!("template {} is ready", build.template_id));
                build.set_status(Status::Ready, None);
            }
            Err((message, step)) => {
                build.log("error", format!("build failed: {message}"));
                build.set_status(Status::Error, Some(Reason { message, step }));
            }
        }
        finish(&app, &build).await;
    });
    true
}

async fn run(app: &App, build: &Arc<Build>, plan: Plan, req: &BuildStart) -> Result<(), StepError> {
    let quota = match app.db.key_by_id(&build.key_id).await {
        Ok(Some(key)) => {
            crate::keys::quota::quotas_of(&key, &app.lifecycle.admission.key_defaults).builds
        }
        _ => None,
    };
    let turns = app.builds.turns_of(&build.key_id, quota);
    let limits = &app.builds.limits;
    if turns.available_permits() == 0 {
        build.log(
            "info",
            "waiting for a turn: this key runs as many builds at once as it may",
        );
    }
    let _turn = turns
        .acquire_owned()
        .await
        .map_err(|e| (format!("waiting for a build turn: {e}"), None))?;
    // The deadline counts from the build's turn, not its time in line.
    let deadlines = StepDeadlines {
        step: Some(limits.step_timeout),
        build: Some((Instant::now() + limits.build_timeout, limits.build_timeout)),
    };
    let dirs = app.lifecycle.dirs().clone();
    // The daemon's registry: build sandboxes take from its warm pool too.
    let runtime = sandcell_runtime::gvisor::GvisorRuntime::new(
        dirs.clone(),
        app.lifecycle.networks.registry().clone(),
    )
    .await
    .map_err(|e| (format!("RUN steps need the gvisor runtime: {e}"), None))?;
    let runner = GvisorRunner {
        runtime: Arc::new(runtime),
        handle: tokio::runtime::Handle::current(),
        memory_mib: build.memory_mb.map_or(DEFAULT_BUILD_MEMORY_MIB, |m| {
            m.clamp(128, MAX_BUILD_MEMORY_MIB)
        }),
        vcpus: build.cpu_count.map_or(DEFAULT_BUILD_VCPUS, |c| {
            u8::try_from(c.clamp(1, MAX_BUILD_VCPUS)).unwrap_or(DEFAULT_BUILD_VCPUS)
        }),
        data_dir: dirs.data.clone(),
        pull: PullOptions {
            auth: registry_auth(req).map_err(|e| (e, None))?,
            insecure_registries: app.builds.insecure_registries.clone(),
            ..PullOptions::default()
        },
        // The daemon's network settings (pool, DNS); none under `serve --no-network`.
        network: app
            .lifecycle
            .networks
            .settings()
            .map(|s| sandcell_runtime::NetworkSpec {
                egress: sandcell_runtime::net::EgressSpec::default(),
                config: s.config.clone(),
            }),
        deadlines,
        disk: (limits.disk_mib > 0)
            .then(|| BuildDisk::new(limits.disk_mib, limits.host_reserve_mib)),
    };
    // Read before the build replaces the template's directory.
    let previous = crate::templates::start::record(&app.lifecycle, &build.template_id);
    let built = build_image(build, &plan, &dirs, runner).await?;
    let step = || build.lock().step.clone();
    let mut record = E2bRecord {
        build_id: build.build_id.clone(),
        start_cmd: req.start_cmd.clone(),
        ready_cmd: req.ready_cmd.clone(),
        cpu_count: build.cpu_count,
        memory_mb: build.memory_mb,
        snapshot_id: None,
    };
    let lifecycle = &app.lifecycle;
    if keep_memory_snapshot(lifecycle, build, previous.as_ref(), &built, &mut record).await? {
        return Ok(());
    }
    memory_snapshot::record_in(lifecycle, &build.template_id, &record)
        .map_err(|e| (e.to_string(), step()))?;
    // The previous build's snapshot restores the previous image: retired either way.
    if let Some(old) = previous.and_then(|p| p.snapshot_id) {
        memory_snapshot::retire(lifecycle, &old).await;
    }
    take_memory_snapshot(app, build, req, record).await
}

/// The failure of a build step: the message and the step it happened in.
type StepError = (String, Option<String>);

/// Builds the template's image from `plan`'s Dockerfile on a blocking thread (RUN steps in
/// gVisor sandboxes through `runner`), its log into `build`.
async fn build_image(
    build: &Arc<Build>,
    plan: &Plan,
    dirs: &sandcell_runtime::Dirs,
    runner: GvisorRunner,
) -> Result<template::TemplateRecord, StepError> {
    let context = files_dir(&dirs.data, &build.key_id);
    std::fs::create_dir_all(&context)
        .map_err(|e| (format!("creating {}: {e}", context.display()), None))?;
    let existing = dirs.images().join(&build.template_id);
    let request = TemplateBuild {
        data_dir: dirs.data.clone(),
        name: build.template_id.clone(),
        dockerfile: plan.dockerfile.clone(),
        // Stable across builds: it is part of what an unchanged rebuild is recognised by
        // (the image crate then keeps the image instead of exporting it again).
        dockerfile_path: PathBuf::from(format!("e2b-template:{}", build.template_id)),
        context,
        build_args: Default::default(),
        agent: None,
        // A template of that name built before is replaced (POST /v3/templates refused
        // other kinds of images).
        force: template::read_record(&existing).is_some(),
        no_cache: plan.no_cache,
        limits: Limits::default(),
    };
    let log = ApiLog {
        build: build.clone(),
        steps: plan.steps.clone(),
    };
    let outcome = tokio::task::spawn_blocking(move || template::build(&request, &runner, &log))
        .await
        .map_err(|e| (format!("the build thread failed: {e}"), None))?;
    let step = || build.lock().step.clone();
    outcome.map_err(|e| match e {
        // Its output is in the log already.
        // A step that filled its disk says so in the reason too (build_disk.rs's line).
        sandcell_image::Error::StepFailed {
            step: text,
            code,
            output,
            ..
        } => {
            let full_prefix = sandcell_runtime::build_disk::FULL_PREFIX;
            let full = output.lines().rev().find(|l| l.starts_with(full_prefix));
            match full {
                Some(full) => (
                    format!("{text}: exit status {code}: {}", full.trim()),
                    step(),
                ),
                None => (format!("{text}: exit status {code}"), step()),
            }
        }
        // A registry's answer is not ours to pass on whole (its body could be anything
        // a registry, or what it redirected to, sent): status and a short, plain text.
        sandcell_image::Error::Registry { reference, source } => (
            format!("pulling {reference}: {}", short_text(&source.to_string())),
            step(),
        ),
        other => (other.to_string(), step()),
    })
}

/// The first line of `text`, printable characters only, at most 200 of them.
fn short_text(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let mut out: String = line.chars().filter(|c| !c.is_control()).take(200).collect();
    if line.chars().count() > 200 {
        out.push('…');
    }
    out
}

/// Keeps the previous build's memory snapshot when the image was kept (unchanged) and so is
/// everything the snapshot was taken with: the snapshot still is the template's state.
/// `true`: kept (and recorded in `record`).
async fn keep_memory_snapshot(
    lifecycle: &SandboxService,
    build: &Build,
    previous: Option<&E2bRecord>,
    built: &template::TemplateRecord,
    record: &mut E2bRecord,
) -> Result<bool, StepError> {
    let step = || build.lock().step.clone();
    if let Some(prev) = previous.filter(|_| built.export_skipped)
        && let Some(id) = prev.snapshot_id.as_deref()
        && prev.start_cmd == record.start_cmd
        && prev.ready_cmd == record.ready_cmd
        && prev.cpu_count == record.cpu_count
        && prev.memory_mb == record.memory_mb
        && memory_snapshot::is_current(lifecycle, id).await
    {
        record.snapshot_id = Some(id.to_string());
        memory_snapshot::record_in(lifecycle, &build.template_id, record)
            .map_err(|e| (e.to_string(), step()))?;
        build.log(
            "info",
            format!("memory snapshot {id} kept: the template did not change"),
        );
        return Ok(true);
    }
    Ok(false)
}

/// E2B semantics: the template is its state once the start command runs and the ready
/// command succeeded, so creates restore it (templates/memory_snapshot.rs). A template
/// whose start or ready command fails fails the build; one that cannot be snapshotted is
/// kept without (its sandboxes boot).
async fn take_memory_snapshot(
    app: &App,
    build: &Build,
    req: &BuildStart,
    mut record: E2bRecord,
) -> Result<(), StepError> {
    let lifecycle = &app.lifecycle;
    let step = || build.lock().step.clone();
    build.set_step(Some("snapshot".into()));
    build.log(
        "info",
        match (&req.start_cmd, &req.ready_cmd) {
            (None, None) => "taking the template's memory snapshot".to_string(),
            (start, ready) => format!(
                "taking the template's memory snapshot once the start command ({}) runs and \
                 the ready command ({}) succeeds",
                start.as_deref().unwrap_or("none"),
                ready.as_deref().unwrap_or("none")
            ),
        },
    );
    let key = app
        .db
        .key_by_id(&build.key_id)
        .await
        .map_err(|e| (e.to_string(), step()))?
        .ok_or_else(|| (format!("API key {} is gone", build.key_id), step()))?;
    match memory_snapshot::take(
        lifecycle,
        &key,
        &build.template_id,
        &build.build_id,
        memory_snapshot::Reach::Builder,
    )
    .await
    {
        Ok(snapshot_id) => {
            build.log("info", format!("memory snapshot {snapshot_id} taken"));
            record.snapshot_id = Some(snapshot_id);
            memory_snapshot::record_in(lifecycle, &build.template_id, &record)
                .map_err(|e| (e.to_string(), step()))?;
        }
        Err(TakeError::Template(message)) => return Err((message, step())),
        Err(TakeError::NoSnapshot(message)) => build.log(
            "warn",
            format!(
                "no memory snapshot ({message}): sandboxes from this template boot and run \
                 its start command"
            ),
        ),
    }
    Ok(())
}

/// Prunes the template build caches of `data` (layers no template uses, uploaded COPY
/// archives) older than `days`, an hour after the start and then daily. A prune never runs
/// during a build (the cache lock: sandcell_image::template::prune); it is tried again an
/// hour later then.
pub async fn prune_caches_daily(data: PathBuf, days: u32) {
    use sandcell_image::template::prune::{PruneError, PruneOptions, prune};
    const HOUR: std::time::Duration = std::time::Duration::from_secs(3600);
    let mut wait = HOUR;
    loop {
        tokio::time::sleep(wait).await;
        let dir = data.clone();
        let options = PruneOptions {
            older_than_days: days,
            dry_run: false,
        };
        let result = tokio::task::spawn_blocking(move || prune(&dir, &options)).await;
        wait = HOUR * 24;
        match result {
            Ok(Ok(p)) if p.layers.is_empty() && p.uploads.is_empty() => {}
            Ok(Ok(p)) => tracing::info!(
                "pruned {} template layer(s) and {} upload(s) older than {days} \
                 days ({} bytes)",
                p.layers.len(),
                p.uploads.len(),
                p.bytes
            ),
            Ok(Err(PruneError::Busy { .. })) => wait = HOUR,
            Ok(Err(e)) => tracing::warn!("pruning the template caches: {e}"),
            Err(e) => tracing::warn!("pruning the template caches: {e}"),
        }
    }
}

/// The last entries of a log, for an error's `reason`.
pub fn reason_entries(logs: &[LogEntry]) -> &[LogEntry] {
    &logs[logs.len().saturating_sub(REASON_LOG_ENTRIES)..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_answers_are_cut_short() {
        let body = format!(
            "Server error: 500, message: {}\n<html>\x1b[31m",
            "x".repeat(300)
        );
        let short = short_text(&body);
        assert!(short.starts_with("Server error: 500"), "{short}");
        assert!(
            short.chars().count() <= 201 && !short.contains("html"),
            "{short}"
        );
    }

    #[test]
    fn host_paths_are_redacted_and_the_rest_kept() {
        let hidden = vec![
            "/var/lib/sandcell/run".to_string(),
            "/var/lib/sandcell".to_string(),
        ];
        let text = "mounting overlay on /var/lib/sandcell/run/sc-12ab/rootfs: EBUSY, \
                    lower \"/var/lib/sandcell/cache/layers/9f/tree\" (RUN mkdir /srv/app)";
        assert_eq!(
            redact_paths(text, &hidden),
            "mounting overlay on <path>: EBUSY, lower \"<path>\" (RUN mkdir /srv/app)"
        );
        assert_eq!(redact_paths("/var/lib/sandcell", &hidden), "<path>");
        assert_eq!(
            redact_paths("/var/lib/sandcellx/a stays", &hidden),
            "/var/lib/sandcellx/a stays"
        );
        assert_eq!(
            redact_paths("at /var/lib/sandcell/images/x: gone", &hidden),
            "at <path>: gone"
        );
    }
}
