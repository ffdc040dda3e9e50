//! `sandcell template build`: a Dockerfile built into a Sandcell image without Docker.
//!
//! Every step that changes files produces a **layer**: a directory in overlayfs's upper-layer
//! format (new and changed files as they are, deletions as 0/0 character devices, replaced
//! directories marked opaque), kept in `<data-dir>/cache/layers/<key>/tree/` where `key` is
//! the sha256 of the parent's key, the instruction as expanded and its inputs (for COPY and
//! ADD the paths, modes and content hashes of the files; for RUN the environment, ARG values,
//! working directory and user it runs with). A step whose key exists is not run again
//! (`CACHED`), so an unchanged rebuild only re-exports the result.
//!
//! - RUN runs in a Sandcell sandbox ([`StepRunner`]: the gVisor runner shared by the CLI
//!   and the daemon) whose root is a host overlayfs: the stage's layers (top first) above its
//!   base tree as lowers, the new layer as upper. Its network is the runner's (by default a
//!   sandbox network with open egress; `--network none`: loopback only).
//! - COPY, ADD and WORKDIR are done on the host through the same kind of overlay mount,
//!   by the [`Unpacker`] (paths resolved inside the image; sources read inside the context
//!   or the earlier stage, see [`context`]).
//! - ENV, ARG, USER, EXPOSE, LABEL, ENTRYPOINT and CMD only change the image config.
//!
//! The result (the last stage) is flattened: each layer exported with [`crate::diff`] and
//! applied in order by the [`Unpacker`], then the agent, mount points, `config.json` and
//! the ext4 image are added as for a pulled image ([`crate::build`]), and the whole renamed
//! into `<data-dir>/images/<name>/` with a [`TEMPLATE_FILE`] describing the build. Stages
//! are built in order, those the last stage does not need skipped ([`needed`]); `COPY
//! --from` reads an earlier stage through a read-only overlay of its layers, or an image's
//! tree (an installed one, or a registry image unpacked: [`trees`]). `FROM scratch` starts
//! from an empty tree. `ADD <URL>` downloads ([`fetch`]) on every build unless
//! `--checksum` pins the content (then a cached layer is used without downloading).

pub mod context;
mod fetch;
mod fsops;
mod needed;
pub mod prune;
mod trees;

use crate::build as image_build;
use crate::cache::unique;
use crate::digest::{Digest, Hasher};
use crate::dockerfile::{self, Command, Dockerfile, Instruction, Stage, words};
use crate::progress::NoProgress;
use crate::spec::ResolvedImage;
use crate::unpack::Unpacker;
use crate::{Error, IMAGE_CONFIG_FILE, ImageDefaults, Limits, Result, store, valid_name};
use context::{CopyPlan, CopyRequest, Ignore};
use fsops::{Mount, RootDir};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// What a Dockerfile-built image carries beside `config.json`.
pub const TEMPLATE_FILE: &str = "template.json";
/// Left in every RUN layer by the runtime (the agent socket's mount point): removed.
const RUNTIME_MOUNT_POINT: &str = "run/sandcell-host";

/// One RUN step for the [`StepRunner`].
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The stage's base tree (has the agent at [`crate::build::AGENT_PATH`]).
    pub base: PathBuf,
    /// The stage's layers above it, top first.
    pub lowers: Vec<PathBuf>,
    /// Where the step's writes must land (overlayfs upper), and overlayfs's work dir.
    pub upper: PathBuf,
    pub work: PathBuf,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    pub user: Option<String>,
}

/// What executes RUN steps and pulls FROM images (the CLI: gVisor sandboxes, the registry).
pub trait StepRunner: Send + Sync {
    /// Runs the command to its end, handing its output to `output`; returns its shell
    /// status (128+n for a signal). `Err`: the sandbox itself failed.
    fn run(
        &self,
        request: &RunRequest,
        output: &mut dyn FnMut(&[u8]),
    ) -> std::result::Result<i32, String>;

    /// Pulls a registry image into the blob cache.
    fn pull(&self, reference: &str) -> Result<ResolvedImage>;
}

/// What a build reports as it goes.
#[derive(Debug, Clone)]
pub enum BuildEvent {
    /// Step `number` of `total` starts (FROM lines count as steps).
    Step {
        number: usize,
        total: usize,
        text: String,
    },
    /// It was found in the layer cache.
    Cached,
    /// Output of a RUN command.
    Output(Vec<u8>),
    Note(String),
    /// Flattening the layers into the image.
    Exporting {
        layers: usize,
    },
}

pub trait BuildLog: Send + Sync {
    fn event(&self, event: BuildEvent);
}

#[derive(Debug, Clone)]
pub struct TemplateBuild {
    pub data_dir: PathBuf,
    pub name: String,
    /// What to build: a parsed Dockerfile ([`dockerfile::parse`]), or one made as a value
    /// (the daemon's E2B template steps).
    pub dockerfile: Dockerfile,
    /// Where the Dockerfile came from, for the record.
    pub dockerfile_path: PathBuf,
    pub context: PathBuf,
    pub build_args: BTreeMap<String, String>,
    /// The static agent; `None`: the one in an installed image.
    pub agent: Option<PathBuf>,
    pub force: bool,
    /// Run every step again (the layers made replace the cached ones).
    pub no_cache: bool,
    pub limits: Limits,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    pub number: usize,
    pub stage: usize,
    pub text: String,
    /// Steps that change files have a layer; `cached`: it came from the cache.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layer: Option<String>,
    pub cached: bool,
    pub seconds: f64,
}

/// `template.json` and the build's result.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRecord {
    pub name: String,
    pub kind: String,
    pub dockerfile: PathBuf,
    pub context: PathBuf,
    /// The last stage's base: an image name or a registry reference.
    pub base: String,
    /// Unix seconds.
    pub created: u64,
    pub steps: Vec<StepRecord>,
    /// The final stage's layers, bottom first (after its base).
    pub layers: Vec<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub exposed_ports: Vec<String>,
    /// Steps with a layer that had to be built, and those taken from the cache.
    pub built_steps: usize,
    pub cached_steps: usize,
    pub ext4_bytes: u64,
    pub seconds: f64,
    /// What the image was exported from: the last layer's key, the config and the agent.
    /// An unchanged rebuild (same fingerprint) keeps the image as it is.
    #[serde(default)]
    pub fingerprint: String,
    /// The image was kept from the previous build of the same fingerprint.
    #[serde(default)]
    pub export_skipped: bool,
}

/// A stage as built so far.
#[derive(Debug, Clone)]
struct StageState {
    name: Option<String>,
    base_source: String,
    base_tree: PathBuf,
    /// Bottom first.
    layers: Vec<PathBuf>,
    /// A tree that holds the base and the first `n` layers, mounted in their place.
    flat: Option<(PathBuf, usize)>,
    /// The stage starts FROM scratch: its RUN steps boot on the agent's own tree.
    scratch: bool,
    key: String,
    env: Vec<(String, String)>,
    workdir: Option<String>,
    user: Option<String>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    labels: BTreeMap<String, String>,
    expose: Vec<String>,
    /// ARGs declared in this stage, with their values (unset ones left out).
    args: BTreeMap<String, String>,
}

impl StageState {
    fn lookup(&self, name: &str) -> Option<String> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| self.args.get(name).cloned())
    }

    fn set_env(&mut self, key: String, value: String) {
        match self.env.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.env.push((key, value)),
        }
    }

    /// The trees that make the stage, bottom first: the base (or the flattened tree that
    /// holds it and the layers below) and the layers above.
    fn stack(&self) -> Vec<PathBuf> {
        let (bottom, from) = match &self.flat {
            Some((tree, n)) => (tree, *n),
            None => (&self.base_tree, 0),
        };
        let mut s = vec![bottom.clone()];
        s.extend(self.layers.iter().skip(from).cloned());
        s
    }

    /// Lowers for a mount: the stack top first.
    fn lowers(&self) -> Vec<PathBuf> {
        let mut l = self.stack();
        l.reverse();
        l
    }
}

struct Builder<'a> {
    req: &'a TemplateBuild,
    runner: &'a dyn StepRunner,
    log: &'a dyn BuildLog,
    file: &'a Dockerfile,
    layers_dir: PathBuf,
    ignore: Ignore,
    agent: PathBuf,
    /// In file order; `None`: skipped (the last stage does not need it).
    stages: Vec<Option<StageState>>,
    /// The index of the stage being built.
    current: usize,
    records: Vec<StepRecord>,
    /// Global ARG values (defaults, then --build-arg).
    global: BTreeMap<String, String>,
    number: usize,
    total: usize,
}

/// Builds `req.dockerfile` into `<data-dir>/images/<name>/`. Blocking: run it on a thread
/// that may block (the runner is called from it).
pub fn build(
    req: &TemplateBuild,
    runner: &dyn StepRunner,
    log: &dyn BuildLog,
) -> Result<TemplateRecord> {
    let started = Instant::now();
    let images = req.data_dir.join("images");
    check_destination(req, &images)?;
    // Held for the whole build: a prune (any process) waits for it (prune.rs).
    let _cache_lock = prune::CacheLock::shared(&req.data_dir).map_err(|e| Error::Io {
        what: "locking the build cache",
        path: req.data_dir.join("cache"),
        source: std::io::Error::other(e.to_string()),
    })?;
    let file = &req.dockerfile;
    let mut b = Builder::new(req, runner, log, file)?;
    let last = b.build_stages()?;
    let mut record = b.record_of(&last);
    record.fingerprint = fingerprint(&b.agent, &last, req)?;
    b.export_unless_unchanged(&last, &images.join(&req.name), &mut record)?;
    record.seconds = started.elapsed().as_secs_f64();
    // The final record (with the size and time) replaces the one written with the image.
    let path = images.join(&req.name).join(TEMPLATE_FILE);
    if let Ok(json) = serde_json::to_vec_pretty(&record) {
        let _ = std::fs::write(&path, json);
    }
    Ok(record)
}

/// The template's name is valid and, unless forced, not taken under `images`.
fn check_destination(req: &TemplateBuild, images: &Path) -> Result<()> {
    if !valid_name(&req.name) {
        return Err(Error::InvalidName(req.name.clone()));
    }
    if images.join(&req.name).exists() && !req.force {
        return Err(Error::Exists(req.name.clone()));
    }
    Ok(())
}

/// What an unchanged rebuild is recognised by: the last stage's layers, the image's
/// defaults and the agent.
fn fingerprint(agent: &Path, last: &StageState, req: &TemplateBuild) -> Result<String> {
    let agent_digest =
        Digest::of(&std::fs::read(agent).map_err(Error::io("reading the agent", agent))?);
    Ok(key_of(&[
        &last.key,
        &serde_json::to_string(&defaults_of(last, req)).unwrap_or_default(),
        agent_digest.as_str(),
    ]))
}

impl<'a> Builder<'a> {
    /// A builder of `file`: the agent found and checked, `.dockerignore` read, the layer
    /// cache ready (abandoned layers of dead builds swept).
    fn new(
        req: &'a TemplateBuild,
        runner: &'a dyn StepRunner,
        log: &'a dyn BuildLog,
        file: &'a Dockerfile,
    ) -> Result<Builder<'a>> {
        let agent = match &req.agent {
            Some(p) => p.clone(),
            None => store::find_agent(&req.data_dir)?,
        };
        image_build::check_agent(&agent)?;
        let ignore = match std::fs::read_to_string(req.context.join(".dockerignore")) {
            Ok(text) => Ignore::parse(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ignore::default(),
            Err(e) => return Err(Error::io("reading", req.context.join(".dockerignore"))(e)),
        };
        let layers_dir = req.data_dir.join("cache/layers");
        std::fs::create_dir_all(&layers_dir).map_err(Error::io("creating", &layers_dir))?;
        sweep_abandoned(&layers_dir);
        Ok(Builder {
            req,
            runner,
            log,
            file,
            layers_dir,
            ignore,
            agent,
            stages: Vec::new(),
            current: 0,
            records: Vec::new(),
            global: BTreeMap::new(),
            number: 0,
            total: 0,
        })
    }

    /// Builds the stages the last one needs (the others are skipped, with a note); the
    /// last stage's state.
    fn build_stages(&mut self) -> Result<StageState> {
        let file = self.file;
        self.global_args()?;
        let needed = needed::needed_stages(file, &self.global)?;
        self.total = file
            .stages
            .iter()
            .zip(&needed)
            .filter(|(_, n)| **n)
            .map(|(s, _)| 1 + s.steps.len())
            .sum();
        for (stage, needed) in file.stages.iter().zip(needed) {
            if !needed {
                self.log.event(BuildEvent::Note(format!(
                    "skipping stage {} ({}, {} steps): the final stage does not need it",
                    stage.index,
                    stage.name.as_deref().unwrap_or("unnamed"),
                    1 + stage.steps.len()
                )));
                self.stages.push(None);
                continue;
            }
            let state = self.stage(stage)?;
            self.stages.push(Some(state));
        }
        self.stages.last().cloned().flatten().ok_or_else(|| {
            dockerfile::ParseError {
                line: 0,
                problem: "no stage".into(),
            }
            .into()
        })
    }

    /// The build's record (its steps taken from the builder), without the image's size,
    /// the build time and the fingerprint.
    fn record_of(&mut self, last: &StageState) -> TemplateRecord {
        let req = self.req;
        TemplateRecord {
            name: req.name.clone(),
            kind: "dockerfile".into(),
            dockerfile: req.dockerfile_path.clone(),
            context: req.context.clone(),
            base: last.base_source.clone(),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            layers: last
                .layers
                .iter()
                .filter_map(|l| {
                    l.parent()?
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                })
                .collect(),
            labels: last.labels.clone(),
            exposed_ports: last.expose.clone(),
            built_steps: self
                .records
                .iter()
                .filter(|r| r.layer.is_some() && !r.cached)
                .count(),
            cached_steps: self.records.iter().filter(|r| r.cached).count(),
            steps: std::mem::take(&mut self.records),
            ext4_bytes: 0,
            seconds: 0.0,
            fingerprint: String::new(),
            export_skipped: false,
        }
    }

    /// Exports the image to `dest`, unless the one there has the same fingerprint (and
    /// `--no-cache` was not asked for): then it is kept (`export_skipped`).
    fn export_unless_unchanged(
        &self,
        last: &StageState,
        dest: &Path,
        record: &mut TemplateRecord,
    ) -> Result<()> {
        let previous = read_record(dest).filter(|p| {
            !self.req.no_cache
                && p.fingerprint == record.fingerprint
                && dest.join("rootfs").is_dir()
                && dest.join("rootfs.ext4").is_file()
        });
        match previous {
            Some(p) => {
                self.log.event(BuildEvent::Note(format!(
                    "{} is up to date (same layers, config and agent): kept",
                    self.req.name
                )));
                record.ext4_bytes = p.ext4_bytes;
                record.export_skipped = true;
            }
            None => record.ext4_bytes = self.export(last, record)?,
        }
        Ok(())
    }
}

/// `template.json` of an image directory, if it was built from a Dockerfile.
pub fn read_record(image_dir: &Path) -> Option<TemplateRecord> {
    let bytes = std::fs::read(image_dir.join(TEMPLATE_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn step_err(line: usize, problem: impl Into<String>) -> Error {
    Error::Dockerfile(dockerfile::ParseError {
        line,
        problem: problem.into(),
    })
}

fn key_of(parts: &[&str]) -> String {
    let mut h = Hasher::default();
    for p in parts {
        h.update(p.as_bytes());
        h.update(b"\0");
    }
    h.finish().hex().to_string()
}

impl Builder<'_> {
    fn global_args(&mut self) -> Result<()> {
        for decl in &self.file.global_args {
            let value = match self.req.build_args.get(&decl.name) {
                Some(v) => Some(v.clone()),
                None => match &decl.default {
                    Some(d) => {
                        let g = self.global.clone();
                        let lookup = move |n: &str| g.get(n).cloned();
                        Some(words::expand_one(d, self.file.escape, &lookup, 0)?)
                    }
                    None => None,
                },
            };
            if let Some(v) = value {
                self.global.insert(decl.name.clone(), v);
            }
        }
        Ok(())
    }

    fn announce(&mut self, text: &str) {
        self.number += 1;
        self.log.event(BuildEvent::Step {
            number: self.number,
            total: self.total,
            text: text.to_string(),
        });
    }

    fn stage(&mut self, stage: &Stage) -> Result<StageState> {
        let from_text = format!(
            "FROM {}{}",
            stage.base,
            stage
                .name
                .as_ref()
                .map_or(String::new(), |n| format!(" AS {n}"))
        );
        self.announce(&from_text);
        self.current = stage.index;
        let started = Instant::now();
        let base = needed::expand_global(self.file, &self.global, &stage.base, stage.line)?;
        let mut state = self.base_of(&base)?;
        state.name = stage.name.clone();
        self.records.push(StepRecord {
            number: self.number,
            stage: stage.index,
            text: from_text,
            layer: None,
            cached: false,
            seconds: started.elapsed().as_secs_f64(),
        });
        for step in &stage.steps {
            self.announce(&step.text);
            let started = Instant::now();
            let (layer, cached) = self
                .step(&mut state, &step.instruction, &step.text, step.line)
                .map_err(|e| match e {
                    Error::Dockerfile(_) | Error::StepFailed { .. } => e,
                    other => step_err(step.line, format!("{}: {other}", step.text)),
                })?;
            if cached {
                self.log.event(BuildEvent::Cached);
            }
            if layer.is_some() {
                self.flatten_if_deep(&mut state)?;
            }
            self.records.push(StepRecord {
                number: self.number,
                stage: stage.index,
                text: step.text.clone(),
                layer,
                cached,
                seconds: started.elapsed().as_secs_f64(),
            });
        }
        Ok(state)
    }

    /// A FROM's base: an earlier stage, scratch, an installed image, or a registry image.
    fn base_of(&mut self, base: &str) -> Result<StageState> {
        if let Some(s) = self
            .file
            .earlier_stage(self.current, base)
            .and_then(|i| self.stages.get(i).cloned().flatten())
        {
            let mut s = s;
            s.args.clear();
            return Ok(s);
        }
        let fresh = |tree: PathBuf, key: String, defaults: ImageDefaults| {
            let mut env: Vec<(String, String)> = defaults
                .env_pairs()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            if !env.iter().any(|(k, _)| k == "PATH") {
                // Docker's default, which RUN steps and ${PATH} need.
                env.insert(
                    0,
                    (
                        "PATH".into(),
                        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
                    ),
                );
            }
            StageState {
                name: None,
                base_source: base.to_string(),
                base_tree: tree,
                layers: Vec::new(),
                flat: None,
                scratch: false,
                key,
                env,
                workdir: defaults.working_dir.clone(),
                user: defaults.user.clone(),
                entrypoint: defaults.entrypoint.clone(),
                cmd: defaults.cmd.clone(),
                labels: BTreeMap::new(),
                expose: Vec::new(),
                args: BTreeMap::new(),
            }
        };
        // Docker's reserved name: no image is called so.
        if base.eq_ignore_ascii_case("scratch") {
            let (tree, key) = self.scratch_tree()?;
            let mut state = fresh(tree, key, ImageDefaults::default());
            state.scratch = true;
            return Ok(state);
        }
        let local = self.req.data_dir.join("images").join(base);
        if valid_name(base) && local.join("rootfs").is_dir() {
            let tree = std::fs::canonicalize(local.join("rootfs"))
                .map_err(Error::io("resolving", local.join("rootfs")))?;
            let meta = std::fs::metadata(&tree).map_err(Error::io("looking at", &tree))?;
            let config = std::fs::read(local.join(IMAGE_CONFIG_FILE)).unwrap_or_default();
            use std::os::unix::fs::MetadataExt;
            // A reinstalled image is a new directory (renamed in): a new key.
            let key = key_of(&[
                "image",
                base,
                &format!("{}:{}:{}", meta.dev(), meta.ino(), meta.ctime()),
                &String::from_utf8_lossy(&config),
            ]);
            let defaults = store::read_config(&local).unwrap_or_default();
            return Ok(fresh(tree, key, defaults));
        }
        let (tree, key, image) = self.pulled_tree(base, true)?;
        let mut defaults = image.config.defaults();
        defaults.source = Some(image.source.clone());
        Ok(fresh(tree, key, defaults))
    }

    fn expand(&self, state: &StageState, s: &str, line: usize) -> Result<String> {
        let lookup = |n: &str| state.lookup(n);
        Ok(words::expand_one(s, self.file.escape, &lookup, line)?)
    }

    fn split(&self, state: &StageState, s: &str, line: usize) -> Result<Vec<String>> {
        let lookup = |n: &str| state.lookup(n);
        Ok(words::split(s, self.file.escape, Some(&lookup), line)?)
    }

    /// Runs one step; returns its layer key (if it makes one) and whether it was cached.
    fn step(
        &mut self,
        state: &mut StageState,
        instruction: &Instruction,
        text: &str,
        line: usize,
    ) -> Result<(Option<String>, bool)> {
        match instruction {
            Instruction::Env(raw) => {
                let words = self.split(state, raw, line)?;
                if words.first().is_some_and(|w| w.contains('=')) {
                    for w in words {
                        let (k, v) = w.split_once('=').ok_or_else(|| {
                            step_err(line, format!("ENV {w:?}: expected KEY=VALUE"))
                        })?;
                        state.set_env(k.to_string(), v.to_string());
                    }
                } else {
                    let raw = raw.trim_start();
                    let (key, rest) = raw
                        .split_once(char::is_whitespace)
                        .ok_or_else(|| step_err(line, "ENV KEY VALUE: no value"))?;
                    let value = self.expand(state, rest.trim_start(), line)?;
                    state.set_env(key.to_string(), value);
                }
                Ok((None, false))
            }
            Instruction::Arg(decls) => {
                for decl in decls {
                    let value = match self.req.build_args.get(&decl.name) {
                        Some(v) => Some(v.clone()),
                        None => match &decl.default {
                            Some(d) => Some(self.expand(state, d, line)?),
                            None => self.global.get(&decl.name).cloned(),
                        },
                    };
                    if let Some(v) = value {
                        state.args.insert(decl.name.clone(), v);
                    }
                }
                Ok((None, false))
            }
            Instruction::User(raw) => {
                state.user = Some(self.expand(state, raw, line)?).filter(|u| !u.is_empty());
                Ok((None, false))
            }
            Instruction::Expose(raw) => {
                let ports = self.split(state, raw, line)?;
                state.expose.extend(ports);
                Ok((None, false))
            }
            Instruction::Label(raw) => {
                for w in self.split(state, raw, line)? {
                    if let Some((k, v)) = w.split_once('=') {
                        state.labels.insert(k.to_string(), v.to_string());
                    }
                }
                Ok((None, false))
            }
            Instruction::Entrypoint(cmd) => {
                state.entrypoint = cmd.argv();
                // As Docker: a new entrypoint drops the CMD inherited from the base.
                state.cmd.clear();
                Ok((None, false))
            }
            Instruction::Cmd(cmd) => {
                state.cmd = cmd.argv();
                Ok((None, false))
            }
            Instruction::Workdir(raw) => {
                let dir = self.expand(state, raw, line)?;
                let dir = absolute(state.workdir.as_deref(), &dir);
                state.workdir = Some(dir.clone());
                let key = key_of(&[&state.key, "WORKDIR", &dir]);
                self.layer(state, key, text, |pending, merged| {
                    let _ = pending;
                    let mut u = Unpacker::new(merged, self.req.limits)?;
                    if dir != "/" {
                        u.ensure_dir(&dir, 0o755)?;
                    }
                    u.finish()
                })
            }
            Instruction::Copy(spec) => self.copy(state, spec, text, line),
            Instruction::Run(cmd) => self.run(state, cmd, text, line),
        }
    }

    /// The layer for `key`: from the cache, or made by `make(pending dir, merged root)` on
    /// a writable overlay of the stage.
    fn layer(
        &mut self,
        state: &mut StageState,
        key: String,
        text: &str,
        make: impl FnOnce(&Path, &Path) -> Result<()>,
    ) -> Result<(Option<String>, bool)> {
        let tree = self.layers_dir.join(&key).join("tree");
        if tree.is_dir() && !self.req.no_cache {
            state.layers.push(tree);
            state.key = key.clone();
            return Ok((Some(key), true));
        }
        let pending = self.pending()?;
        let result = (|| {
            let mount = Mount::overlay(
                &state.lowers(),
                Some((&pending.join("tree"), &pending.join("work"))),
                &pending.join("merged"),
            )?;
            let made = make(&pending, mount.path());
            drop(mount);
            made
        })();
        self.commit(&pending, &key, result, text)?;
        state.layers.push(tree);
        state.key = key.clone();
        Ok((Some(key), false))
    }

    /// A fresh directory for a layer being made.
    fn pending(&self) -> Result<PathBuf> {
        let dir = self
            .layers_dir
            .join(format!(".tmp-{}-{}", std::process::id(), unique()));
        for sub in ["tree", "work"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(Error::io("creating", dir.join(sub)))?;
        }
        Ok(dir)
    }

    /// Moves a finished layer in as `key` (or drops it after a failure).
    fn commit(&self, pending: &Path, key: &str, result: Result<()>, text: &str) -> Result<()> {
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(pending);
            return Err(e);
        }
        for sub in ["work", "merged"] {
            let p = pending.join(sub);
            if p.exists() {
                std::fs::remove_dir_all(&p).map_err(Error::io("removing", &p))?;
            }
        }
        let meta = serde_json::json!({"key": key, "step": text});
        let _ = std::fs::write(pending.join("step.json"), meta.to_string());
        let dest = self.layers_dir.join(key);
        if dest.exists() {
            // --no-cache, or another build made it meanwhile: the newest wins.
            let old = self
                .layers_dir
                .join(format!(".old-{}-{}", std::process::id(), unique()));
            std::fs::rename(&dest, &old).map_err(Error::io("moving away", &dest))?;
            let _ = std::fs::remove_dir_all(&old);
        }
        std::fs::rename(pending, &dest).map_err(Error::io("moving the layer into place", &dest))
    }

    fn copy(
        &mut self,
        state: &mut StageState,
        spec: &dockerfile::CopySpec,
        text: &str,
        line: usize,
    ) -> Result<(Option<String>, bool)> {
        let mut args = Vec::with_capacity(spec.args.len());
        for a in &spec.args {
            args.push(if spec.json {
                self.expand(state, &a.replace('\\', "\\\\"), line)?
            } else {
                self.expand(state, a, line)?
            });
        }
        let (dest, sources) = args
            .split_last()
            .ok_or_else(|| step_err(line, "COPY needs SOURCE... DEST"))?;
        let mut dest_abs = absolute(state.workdir.as_deref(), dest);
        // A directory destination: written so (`dir/`, `.`), or one the image has.
        let named_dir = dest.ends_with('/')
            || Path::new(dest)
                .file_name()
                .is_none_or(|n| n == "." || n == "..");
        if (named_dir || sources.len() > 1 || self.is_dir_in(state, &dest_abs)?)
            && !dest_abs.ends_with('/')
        {
            dest_abs.push('/');
        }
        let chmod = match &spec.chmod {
            Some(m) => Some(
                u32::from_str_radix(m, 8).map_err(|_| step_err(line, format!("--chmod={m}")))?,
            ),
            None => None,
        };
        let (urls, locals): (Vec<String>, Vec<String>) =
            sources.iter().cloned().partition(|s| dockerfile::is_url(s));
        // The source tree: the context, an earlier stage seen through a read-only mount, or
        // an image's tree.
        let context_ignore = self.ignore.clone();
        let _from_mount;
        let (root, ignore) = match &spec.from {
            None => (RootDir::open(&self.req.context)?, Some(&context_ignore)),
            Some(from) => {
                let from = needed::expand_global(self.file, &self.global, from, line)?;
                let stage = self.file.earlier_stage(self.current, &from);
                match stage.and_then(|i| self.stages.get(i).cloned().flatten()) {
                    Some(stage) => {
                        let target = self.layers_dir.join(format!(
                            ".from-{}-{}",
                            std::process::id(),
                            unique()
                        ));
                        let mount = Mount::overlay(&stage.lowers(), None, &target)?;
                        let root = RootDir::open(mount.path())?;
                        _from_mount = MountDir(Some(mount), target);
                        (root, None)
                    }
                    None if stage.is_some() => {
                        return Err(step_err(line, format!("--from={from}: stage not built")));
                    }
                    None => (RootDir::open(&self.image_tree(&from)?)?, None),
                }
            }
        };
        let mut plan = CopyPlan::new(CopyRequest {
            root: &root,
            ignore,
            sources: &locals,
            dest: &dest_abs,
            add: spec.add,
            owner: (0, 0),
            chmod,
        })?;
        // URLs: downloaded now (the key needs their digest), unless --checksum gives it; then
        // only when the layer is made.
        let downloads = TempDir::new(&self.layers_dir)?;
        let mut pinned = Vec::new();
        for (n, url) in urls.iter().enumerate() {
            let target = if dest_abs.ends_with('/') {
                let name = fetch::file_name(url).ok_or_else(|| {
                    step_err(
                        line,
                        format!("{text}: {url} names no file; give the destination a file name"),
                    )
                })?;
                format!("{dest_abs}{name}")
            } else {
                dest_abs.clone()
            };
            let file = downloads.0.join(n.to_string());
            match &spec.checksum {
                Some(sum) => {
                    let want = Digest::parse(sum)?;
                    plan.add_download(&target, file.clone(), want.clone());
                    pinned.push((url.clone(), file, want));
                }
                None => {
                    let got = fetch::download(url, &file, &self.req.limits)?;
                    self.log.event(BuildEvent::Note(got.describe(url)));
                    plan.add_download(&target, file, got.digest);
                }
            }
        }
        let mut h = Hasher::default();
        h.update(format!("{}\0{}\0{:?}\0", state.key, text, spec.chown).as_bytes());
        h.update(dest_abs.as_bytes());
        plan.hash_into(&mut h)?;
        let key = h.finish().hex().to_string();
        let chown = spec.chown.clone();
        let limits = self.req.limits;
        let log = self.log;
        self.layer(state, key, text, |pending, merged| {
            for (url, file, want) in &pinned {
                let got = fetch::download(url, file, &limits)?;
                log.event(BuildEvent::Note(got.describe(url)));
                want.verify(&got.digest, format!("ADD {url} (--checksum)"))?;
            }
            if let Some(c) = &chown {
                let image = RootDir::open(merged)?;
                plan.set_owner(context::resolve_owner(&image, c).map_err(|p| step_err(line, p))?);
            }
            let tar_path = pending.join("copy.tar");
            let file =
                std::fs::File::create(&tar_path).map_err(Error::io("creating", &tar_path))?;
            plan.write_tar(std::io::BufWriter::new(file))?;
            let mut u = Unpacker::new(merged, limits)?;
            let tar = std::fs::File::open(&tar_path).map_err(Error::io("opening", &tar_path))?;
            u.apply_layer(tar, "COPY", None)?;
            u.finish()?;
            std::fs::remove_file(&tar_path).map_err(Error::io("removing", &tar_path))
        })
    }

    /// Whether `path` (absolute) is a directory (symlinks followed inside the image) in the
    /// stage as built so far.
    fn is_dir_in(&self, state: &StageState, path: &str) -> Result<bool> {
        let view = self.view(state)?;
        let root = RootDir::open(&view.1)?;
        let rel = context::normalize(path);
        Ok(root.stat(&rel).is_ok_and(|m| m.is_dir()))
    }

    /// The user name a RUN step runs as (the agent takes names): USER's name part, or the
    /// name of its uid, from the stage's /etc/passwd. `None`: root. An unknown user fails
    /// the step, as under Docker, rather than running it as root.
    fn run_user(
        &self,
        state: &StageState,
        user: &str,
    ) -> std::result::Result<Option<String>, String> {
        let name = user.split(':').next().unwrap_or(user);
        if name.is_empty() || name == "root" || name == "0" {
            return Ok(None);
        }
        let view = self.view(state).map_err(|e| e.to_string())?;
        let root = RootDir::open(&view.1).map_err(|e| e.to_string())?;
        let (uid, _) = context::resolve_owner(&root, name)
            .map_err(|_| format!("USER {user}: no such user in the image's /etc/passwd"))?;
        let mut passwd = String::new();
        if let Ok(f) = root.open_file(Path::new("etc/passwd"), true) {
            use std::io::Read;
            let _ = f.take(4 << 20).read_to_string(&mut passwd);
        }
        passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.get(2).and_then(|u| u.parse::<u32>().ok()) == Some(uid))
            .and_then(|f| f.first().map(|n| n.to_string()))
            .map(Some)
            .ok_or_else(|| format!("USER {user}: uid {uid} has no name in the image's /etc/passwd"))
    }

    fn run(
        &mut self,
        state: &mut StageState,
        cmd: &Command,
        text: &str,
        line: usize,
    ) -> Result<(Option<String>, bool)> {
        let argv = cmd.argv();
        // ARG values are the command's environment too (ENV wins), not the image's.
        let mut env: BTreeMap<String, String> = state.args.clone();
        env.extend(state.env.iter().cloned());
        let env_text = serde_json::to_string(&env).unwrap_or_default();
        let argv_text = serde_json::to_string(&argv).unwrap_or_default();
        let key = key_of(&[
            &state.key,
            "RUN",
            &argv_text,
            &env_text,
            state.workdir.as_deref().unwrap_or(""),
            state.user.as_deref().unwrap_or(""),
        ]);
        let tree = self.layers_dir.join(&key).join("tree");
        if tree.is_dir() && !self.req.no_cache {
            state.layers.push(tree);
            state.key = key.clone();
            return Ok((Some(key), true));
        }
        if state.scratch {
            self.check_scratch_program(state, &argv, text, line)?;
        }
        let user = match state.user.as_deref() {
            Some(u) => self
                .run_user(state, u)
                .map_err(|problem| step_err(line, format!("{text}: {problem}")))?,
            None => None,
        };
        // The root boots on the bottom tree (it has the agent), or on the agent's own tree
        // under a scratch stage's.
        let mut lowers = state.lowers();
        let base = match lowers.pop() {
            Some(bottom) if !state.scratch => bottom,
            bottom => {
                lowers.extend(bottom);
                self.agent_tree()?
            }
        };
        let pending = self.pending()?;
        let request = RunRequest {
            base,
            lowers,
            upper: pending.join("tree"),
            work: pending.join("work"),
            argv,
            env,
            cwd: state.workdir.clone(),
            user,
        };
        let mut tail: Vec<u8> = Vec::new();
        let log = self.log;
        let outcome = self.runner.run(&request, &mut |bytes: &[u8]| {
            tail.extend_from_slice(bytes);
            if tail.len() > 8192 {
                tail.drain(..tail.len() - 8192);
            }
            log.event(BuildEvent::Output(bytes.to_vec()));
        });
        let result = match outcome {
            Ok(0) => strip_runtime_files(&pending.join("tree")),
            Ok(code) => Err(Error::StepFailed {
                line,
                step: text.to_string(),
                code,
                output: String::from_utf8_lossy(&tail).into_owned(),
            }),
            Err(problem) => Err(step_err(
                line,
                format!("{text}: the build sandbox failed: {problem}"),
            )),
        };
        self.commit(&pending, &key, result, text)?;
        state.layers.push(tree);
        state.key = key.clone();
        Ok((Some(key), false))
    }

    /// The last stage as `<data-dir>/images/<name>/`; returns the ext4 size.
    fn export(&self, last: &StageState, record: &TemplateRecord) -> Result<u64> {
        let images = self.req.data_dir.join("images");
        let work = images.join(format!(
            ".build-{}-{}-{}",
            self.req.name,
            std::process::id(),
            unique()
        ));
        let result = self.export_into(last, record, &work);
        match result {
            Ok(size) => match store::replace(&images, &self.req.name, &work) {
                Ok(()) => Ok(size),
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&work);
                    Err(e)
                }
            },
            Err(e) => {
                let _ = std::fs::remove_dir_all(&work);
                Err(e)
            }
        }
    }

    fn export_into(&self, last: &StageState, record: &TemplateRecord, work: &Path) -> Result<u64> {
        let all = last.stack();
        self.log.event(BuildEvent::Exporting { layers: all.len() });
        let tree = work.join("rootfs");
        let mut unpacker = Unpacker::new(&tree, self.req.limits)?;
        apply_trees(&mut unpacker, &all)?;
        image_build::add_sandcell_files(&mut unpacker, &self.agent)?;
        unpacker.finish()?;
        if last.scratch {
            trees::add_root_user(&tree)?;
        }
        let defaults = defaults_of(last, self.req);
        let write_json = |name: &str, value: serde_json::Result<Vec<u8>>| -> Result<()> {
            let path = work.join(name);
            let bytes = value.map_err(|e| Error::Manifest {
                what: name.into(),
                problem: e.to_string(),
            })?;
            std::fs::write(&path, bytes).map_err(Error::io("writing", &path))
        };
        write_json(IMAGE_CONFIG_FILE, serde_json::to_vec_pretty(&defaults))?;
        write_json(TEMPLATE_FILE, serde_json::to_vec_pretty(record))?;
        let ext4 = work.join("rootfs.ext4");
        image_build::make_ext4(&tree, &ext4, &self.req.name, unpacker.owners(), &NoProgress)?;
        Ok(std::fs::metadata(&ext4)
            .map_err(Error::io("looking at", &ext4))?
            .len())
    }
}

/// Trees in overlayfs's upper format (bottom first), applied in order: each exported as a
/// layer by [`crate::diff`] and unpacked.
fn apply_trees(unpacker: &mut Unpacker, trees: &[PathBuf]) -> Result<()> {
    for (index, layer) in trees.iter().enumerate() {
        let (reader, writer) = std::io::pipe().map_err(Error::io("making a pipe for", layer))?;
        let source = layer.clone();
        let exporter = std::thread::spawn(move || {
            crate::diff::layer_from_overlay_upper(&source, std::io::BufWriter::new(writer))
        });
        let applied = unpacker.apply_layer(reader, &format!("layer {index}"), None);
        let exported = exporter.join().map_err(|_| Error::Tool {
            tool: "export",
            problem: format!("the exporter of {} panicked", layer.display()),
        })?;
        exported?;
        applied?;
    }
    Ok(())
}

/// A read-only mount of an earlier stage and its mount point, both gone when dropped.
struct MountDir(Option<Mount>, PathBuf);

impl Drop for MountDir {
    fn drop(&mut self) {
        // Unmounted before the mount point is removed.
        drop(self.0.take());
        let _ = std::fs::remove_dir(&self.1);
    }
}

/// A scratch directory under the layer cache (`.tmp-PID-N`: a dead build's is swept),
/// removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(layers_dir: &Path) -> Result<TempDir> {
        let dir = layers_dir.join(format!(".tmp-{}-{}", std::process::id(), unique()));
        std::fs::create_dir(&dir).map_err(Error::io("creating", &dir))?;
        Ok(TempDir(dir))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The image config of the last stage.
fn defaults_of(last: &StageState, req: &TemplateBuild) -> ImageDefaults {
    ImageDefaults {
        env: last.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        working_dir: last.workdir.clone(),
        user: last.user.clone(),
        entrypoint: last.entrypoint.clone(),
        cmd: last.cmd.clone(),
        source: Some(format!("dockerfile:{}", req.dockerfile_path.display())),
        manifest_digest: None,
    }
}

/// Work directories and mount points (`.tmp-PID-N`, `.view-`, `.from-`, `.old-`) of
/// builds whose process died (killed mid-step): unmounted and removed. Best effort.
fn sweep_abandoned(layers_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(layers_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = [".tmp-", ".view-", ".from-", ".old-"]
            .iter()
            .find_map(|p| name.strip_prefix(p))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if alive {
            continue;
        }
        let path = entry.path();
        // `disk`: a RUN step's own disk (crates/runtime build_disk.rs), loop-mounted there.
        for target in [path.join("merged"), path.join("disk"), path.clone()] {
            if let Ok(c) = std::ffi::CString::new(target.as_os_str().as_encoded_bytes()) {
                // SAFETY: c is NUL-terminated; unmounting what is not a mount point fails
                // harmlessly.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
        let _ = std::fs::remove_dir_all(&path);
    }
}

/// `path` made absolute against the working directory (`/` when none).
fn absolute(workdir: Option<&str>, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        let base = workdir.unwrap_or("/");
        format!("{}/{}", base.trim_end_matches('/'), path)
    }
}

/// What the runtime itself made in a RUN step's upper layer (the agent socket's mount
/// point), which is no part of the step's result.
fn strip_runtime_files(upper: &Path) -> Result<()> {
    drop_runtime_file(upper, Path::new(RUNTIME_MOUNT_POINT))
}

/// Removes `rel` (a file or directory the runtime, not the step, put in an upper layer:
/// `run/sandcell-host`, a network's `etc/resolv.conf`) and then its parents while they are
/// empty copies of lower directories (not opaque): copied up only to hold it.
pub fn drop_runtime_file(upper: &Path, rel: &Path) -> Result<()> {
    let path = upper.join(rel);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => {
            std::fs::remove_dir_all(&path).map_err(Error::io("removing", &path))?
        }
        Ok(_) => std::fs::remove_file(&path).map_err(Error::io("removing", &path))?,
        Err(_) => return Ok(()),
    }
    let mut parent = rel.parent();
    while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
        let host = upper.join(dir);
        let empty = std::fs::read_dir(&host).is_ok_and(|mut d| d.next().is_none());
        if !empty || is_opaque(&host) {
            break;
        }
        std::fs::remove_dir(&host).map_err(Error::io("removing", &host))?;
        parent = dir.parent();
    }
    Ok(())
}

/// Whether overlayfs marked the directory opaque (it replaced a lower one).
fn is_opaque(dir: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    let mut value = [0u8; 4];
    // SAFETY: both strings are NUL-terminated; value is writable for its length.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    n == 1 && value[0] == b'y'
}

#[cfg(test)]
mod tests {
    #[test]
    fn sweeps_what_dead_builds_left() {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let mine = std::process::id();
        for name in [
            format!(".tmp-{dead}-1/tree"),
            format!(".view-{dead}-2"),
            format!(".tmp-{mine}-3/tree"),
            "abc/tree".to_string(),
        ] {
            std::fs::create_dir_all(tmp.path().join(name)).unwrap();
        }
        super::sweep_abandoned(tmp.path());
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [format!(".tmp-{mine}-3"), "abc".to_string()]);
    }

    #[test]
    fn absolute_paths() {
        assert_eq!(super::absolute(None, "x"), "/x");
        assert_eq!(super::absolute(Some("/app/"), "x/y"), "/app/x/y");
        assert_eq!(super::absolute(Some("/app"), "/abs"), "/abs");
    }
}
