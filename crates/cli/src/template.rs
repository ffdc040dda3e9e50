//! `sandcell template build|ls|inspect|rm`: images built from Dockerfiles without Docker
//! (crates/image `template`), their RUN steps executed in gVisor sandboxes whose root's
//! writes land in a host layer (`SandboxSpec::host_layer`).
//!
//! ```text
//! sandcell template build -t NAME [-f Dockerfile] [--build-arg K=V]... [--no-cache]
//!                         [--memory MiB] [--vcpus N] [--insecure-registry HOST]...
//!                         [--network default|none] [--disk-mib MiB] [--json] [CONTEXT]
//! sandcell template ls [--json]
//! sandcell template inspect NAME
//! sandcell template rm NAME... [--json]
//! sandcell template prune [--older-than DAYS] [--dry-run] [--json]   (template/prune.rs)
//! ```
//! Templates and images share `<data-dir>/images/`: a template is an image built from a
//! Dockerfile (it has a `template.json`), so `run --image NAME` and the daemon's
//! `templateID: NAME` use it, and `template ls` lists both with a KIND column. RUN steps have
//! a network (open egress, our DNS server forwarding to the host's resolvers, a /30 from
//! sandcell-net's default pool 10.200.0.0/16: its host-wide lock and slot scan keep it apart
//! from a daemon's networks) unless `--network none` (loopback only). Exit status: 0, 1 when the build or a RUN step failed
//! (the step's output and exit status are shown), 2 for bad usage.

use sandcell_image::registry::PullOptions;
use sandcell_image::template::{self, BuildEvent, BuildLog, TemplateBuild, TemplateRecord};
use sandcell_image::{Limits, store};
use sandcell_runtime::build_disk::BuildDisk;
use sandcell_runtime::build_steps::GvisorRunner;
use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::net::EgressSpec;
use sandcell_runtime::{Dirs, NetworkSpec};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

mod prune;

const EXIT_FAILED: i32 = 1;
const EXIT_USAGE: i32 = 2;

#[derive(clap::Subcommand)]
pub enum TemplateCommand {
    /// Build an image from a Dockerfile; RUN steps run in sandboxes
    Build(BuildArgs),
    /// List templates and images
    Ls(LsArgs),
    /// Show a template's config and layers (JSON)
    Inspect(InspectArgs),
    /// Remove templates (refused while a sandbox uses one)
    Rm(RmArgs),
    /// Remove cached layers no template uses and old uploads (not during a build)
    Prune(prune::PruneArgs),
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// The name of the result (an image name: lowercase letters, digits, '-', '_', '.')
    #[arg(short = 't', long = "tag", value_name = "NAME")]
    pub name: String,
    /// The Dockerfile [default: CONTEXT/Dockerfile]
    #[arg(short = 'f', long = "file", value_name = "PATH")]
    pub file: Option<PathBuf>,
    /// A build argument (for ARG)
    #[arg(long = "build-arg", value_name = "KEY=VALUE")]
    pub build_args: Vec<String>,
    /// Run every step again
    #[arg(long)]
    pub no_cache: bool,
    /// Memory of each RUN sandbox
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(64..=65536), value_name = "MiB")]
    pub memory: u32,
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=32))]
    pub vcpus: u8,
    /// A registry (`host` or `host:port`) to pull FROM images from over plain HTTP
    #[arg(long = "insecure-registry", value_name = "HOST")]
    pub insecure_registries: Vec<String>,
    /// What the RUN steps may write on the host, in all: each step's writes go to a disk of
    /// what is left (ENOSPC inside past it, and the build fails saying so); 0: no limit
    #[arg(long, default_value_t = 10240, value_name = "MiB")]
    pub disk_mib: u32,
    /// The network of RUN steps: `default` (open egress) or `none` (loopback only)
    #[arg(long, value_enum, default_value_t = BuildNetwork::Default)]
    pub network: BuildNetwork,
    /// The static agent to put in the image [default: the one in an installed image]
    #[arg(long, value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// Replace an image of that name that was not built from a Dockerfile
    #[arg(long)]
    pub force: bool,
    /// Print a JSON summary at the end (steps, cached or built, layers, sizes, times)
    #[arg(long)]
    pub json: bool,
    /// The build context (COPY and ADD sources)
    #[arg(default_value = ".", value_name = "CONTEXT")]
    pub context: PathBuf,
}

/// `template build --network`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BuildNetwork {
    Default,
    None,
}

#[derive(clap::Args)]
pub struct LsArgs {
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct InspectArgs {
    pub name: String,
}

#[derive(clap::Args)]
pub struct RmArgs {
    #[arg(required = true)]
    pub names: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

pub async fn run(dirs: &Dirs, command: TemplateCommand) -> i32 {
    match command {
        TemplateCommand::Build(args) => build(dirs, args).await,
        TemplateCommand::Ls(args) => ls(dirs, args),
        TemplateCommand::Inspect(args) => inspect(dirs, args),
        TemplateCommand::Rm(args) => rm(dirs, args),
        TemplateCommand::Prune(args) => prune::report(prune::run(&dirs.data, &args), args.json),
    }
}

fn fail(msg: impl std::fmt::Display, code: i32) -> i32 {
    eprintln!("sandcell: {msg}");
    code
}

async fn build(dirs: &Dirs, args: BuildArgs) -> i32 {
    let mut build_args = BTreeMap::new();
    for pair in &args.build_args {
        match pair.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                build_args.insert(k.to_string(), v.to_string());
            }
            // Docker's `--build-arg NAME`: the value from our environment.
            _ => match std::env::var(pair) {
                Ok(v) if !pair.is_empty() => {
                    build_args.insert(pair.clone(), v);
                }
                _ => {
                    return fail(
                        format!("--build-arg {pair:?}: expected KEY=VALUE"),
                        EXIT_USAGE,
                    );
                }
            },
        }
    }
    let context = match std::fs::canonicalize(&args.context) {
        Ok(c) if c.is_dir() => c,
        Ok(c) => {
            return fail(
                format!("context {} is not a directory", c.display()),
                EXIT_USAGE,
            );
        }
        Err(e) => {
            return fail(
                format!("context {}: {e}", args.context.display()),
                EXIT_USAGE,
            );
        }
    };
    let file = args
        .file
        .clone()
        .unwrap_or_else(|| context.join("Dockerfile"));
    let dockerfile = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) => return fail(format!("reading {}: {e}", file.display()), EXIT_USAGE),
    };
    let dockerfile = match sandcell_image::dockerfile::parse(&dockerfile) {
        Ok(d) => d,
        Err(e) => return fail(e, EXIT_FAILED),
    };
    // A previous build of the same name is replaced; another kind of image only with --force.
    let existing = dirs.images().join(&args.name);
    let force = args.force || template::read_record(&existing).is_some();
    let runtime =
        match GvisorRuntime::new(dirs.clone(), sandcell_runtime::net::NetRegistry::new()).await {
            Ok(rt) => Arc::new(rt),
            Err(e) => {
                return fail(
                    format!("RUN steps need the gvisor runtime: {e}"),
                    EXIT_FAILED,
                );
            }
        };
    let network = match args.network {
        BuildNetwork::None => None,
        BuildNetwork::Default => match NetworkSpec::from_host(EgressSpec::default()) {
            Ok(n) => Some(n),
            Err(e) => {
                return fail(
                    format!("RUN steps' network: {e} (--network none builds without one)"),
                    EXIT_FAILED,
                );
            }
        },
    };
    let runner = GvisorRunner {
        network,
        runtime,
        handle: tokio::runtime::Handle::current(),
        memory_mib: args.memory,
        vcpus: args.vcpus,
        data_dir: dirs.data.clone(),
        pull: PullOptions {
            insecure_registries: args.insecure_registries.clone(),
            // The CLI's user runs the host: its own registries are its to use.
            allow_internal: true,
            ..PullOptions::default()
        },
        deadlines: Default::default(),
        disk: (args.disk_mib > 0).then(|| BuildDisk::new(args.disk_mib, 0)),
    };
    let request = TemplateBuild {
        data_dir: dirs.data.clone(),
        name: args.name.clone(),
        dockerfile,
        dockerfile_path: std::fs::canonicalize(&file).unwrap_or(file),
        context,
        build_args,
        agent: args.agent.clone(),
        force,
        no_cache: args.no_cache,
        limits: Limits::default(),
    };
    let json = args.json;
    let result = tokio::task::spawn_blocking(move || {
        let log = StepLog;
        template::build(&request, &runner, &log)
    })
    .await;
    match result {
        Ok(Ok(record)) => {
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&record).unwrap_or_default()
                );
            } else {
                eprintln!(
                    "built {} in {:.1} s: {} steps with layers built, {} cached, {:.1} MiB ext4",
                    record.name,
                    record.seconds,
                    record.built_steps,
                    record.cached_steps,
                    record.ext4_bytes as f64 / 1048576.0
                );
            }
            0
        }
        Ok(Err(e)) => fail(e, EXIT_FAILED),
        Err(e) => fail(format!("the build thread failed: {e}"), EXIT_FAILED),
    }
}

/// Progress on stderr ("Step 3/7: RUN ...", CACHED, the RUN output as it comes).
struct StepLog;

impl BuildLog for StepLog {
    fn event(&self, event: BuildEvent) {
        let mut err = std::io::stderr().lock();
        let _ = match event {
            BuildEvent::Step {
                number,
                total,
                text,
            } => writeln!(err, "Step {number}/{total}: {text}"),
            BuildEvent::Cached => writeln!(err, " ---> CACHED"),
            BuildEvent::Output(bytes) => err.write_all(&bytes),
            BuildEvent::Note(note) => writeln!(err, " ---> {note}"),
            BuildEvent::Exporting { layers } => {
                writeln!(err, "Exporting {layers} layers to the image")
            }
        };
    }
}

fn ls(dirs: &Dirs, args: LsArgs) -> i32 {
    let images = match store::list(&dirs.data) {
        Ok(i) => i,
        Err(e) => return fail(e, EXIT_FAILED),
    };
    let rows: Vec<serde_json::Value> = images
        .iter()
        .map(|i| {
            let dir = dirs.images().join(&i.name);
            let record = template::read_record(&dir);
            let created = record.as_ref().map(|r| r.created).or_else(|| {
                std::fs::metadata(&dir)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map(|d| d.as_secs())
            });
            let source = match (&record, &i.config) {
                (Some(r), _) => r.dockerfile.display().to_string(),
                (None, Some(c)) => c.source.clone().unwrap_or_default(),
                (None, None) => String::new(),
            };
            serde_json::json!({
                "name": i.name,
                "kind": if record.is_some() { "template" } else { "image" },
                "source": source,
                "ext4Bytes": i.ext4_bytes,
                "created": created,
            })
        })
        .collect();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
        return 0;
    }
    println!(
        "{:<24} {:<9} {:>9} {:<20} SOURCE",
        "NAME", "KIND", "SIZE", "CREATED"
    );
    for r in rows {
        let size = r["ext4Bytes"]
            .as_u64()
            .map_or("-".into(), |b| format!("{:.1}M", b as f64 / 1048576.0));
        let created = r["created"].as_u64().map_or("-".into(), utc);
        println!(
            "{:<24} {:<9} {:>9} {:<20} {}",
            r["name"].as_str().unwrap_or(""),
            r["kind"].as_str().unwrap_or(""),
            size,
            created,
            r["source"].as_str().unwrap_or("")
        );
    }
    0
}

/// Unix seconds as `YYYY-MM-DD HH:MM:SS` (UTC).
fn utc(secs: u64) -> String {
    // `2006-01-02T15:04:05.000Z` -> `2006-01-02 15:04:05`: the server's calendar arithmetic.
    let stamp =
        sandcell_proto::time::format_millis(i64::try_from(secs).unwrap_or(i64::MAX / 1000) * 1000);
    stamp.get(..19).unwrap_or(&stamp).replacen('T', " ", 1)
}

fn inspect(dirs: &Dirs, args: InspectArgs) -> i32 {
    let dir = dirs.images().join(&args.name);
    if !sandcell_image::valid_name(&args.name) || !dir.is_dir() {
        return fail(format!("template {:?} not found", args.name), EXIT_FAILED);
    }
    let record: Option<TemplateRecord> = template::read_record(&dir);
    let out = serde_json::json!({
        "name": args.name,
        "kind": if record.is_some() { "template" } else { "image" },
        "dir": dir,
        "config": store::read_config(&dir),
        "ext4Bytes": std::fs::metadata(dir.join("rootfs.ext4")).ok().map(|m| m.len()),
        "build": record,
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    0
}

fn rm(dirs: &Dirs, args: RmArgs) -> i32 {
    let mut code = 0;
    let mut removed = Vec::new();
    for name in &args.names {
        match store::remove(&dirs.data, name) {
            Ok(()) => {
                removed.push(name.clone());
                if !args.json {
                    println!("removed {name}");
                }
            }
            Err(e) => code = fail(e, EXIT_FAILED),
        }
    }
    if args.json {
        println!("{}", serde_json::json!({ "removed": removed }));
    }
    code
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates() {
        assert_eq!(super::utc(0), "1970-01-01 00:00:00");
        // `date -u -d @1796000000`
        assert_eq!(super::utc(1_796_000_000), "2026-11-30 00:53:20");
        assert_eq!(super::utc(951_782_400), "2000-02-29 00:00:00");
    }
}
