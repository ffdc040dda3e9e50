//! `sandcell image pull|import|ls|rm`: OCI images as Sandcell images (crates/image).
//!
//! ```text
//! sandcell image pull REF [--name NAME] [--insecure-registry HOST[:PORT]]...
//!                         [--username U --password P | --token T] [--agent PATH] [--force] [--json]
//! sandcell image import PATH --name NAME [--tag TAG] [--agent PATH] [--force] [--json]
//! sandcell image ls [--json]
//! sandcell image rm NAME... [--json]
//! ```
//! Credentials may also come from `$SANDCELL_REGISTRY_USERNAME`, `$SANDCELL_REGISTRY_PASSWORD`
//! and `$SANDCELL_REGISTRY_TOKEN`. Layer downloads show progress bars on a terminal.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use sandcell_image::cache::BlobCache;
use sandcell_image::registry::{Auth, PullOptions};
use sandcell_image::{BuildOptions, Event, Limits, Progress, ResolvedImage, store};
use sandcell_runtime::Dirs;
use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

const EXIT_FAILED: i32 = 1;
const EXIT_USAGE: i32 = 2;

#[derive(clap::Subcommand)]
pub enum ImageCommand {
    /// Pull an image from an OCI registry and make a Sandcell image of it
    Pull(PullArgs),
    /// Make a Sandcell image from an OCI layout directory or a `docker save` tarball
    Import(ImportArgs),
    /// List the installed images
    Ls(LsArgs),
    /// Remove images (refused while a sandbox uses one)
    Rm(RmArgs),
}

#[derive(clap::Args)]
pub struct BuildArgs {
    /// The static agent to put at /sbin/sandcell-agent [default: the one in an installed image]
    #[arg(long, value_name = "PATH")]
    pub agent: Option<PathBuf>,
    /// Replace an image of the same name
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct PullArgs {
    /// The image: `alpine`, `registry:5000/team/app:v2`, `repo@sha256:...`
    pub reference: String,
    /// The image's name here [default: the repository's last part]
    #[arg(long)]
    pub name: Option<String>,
    /// A registry (`host` or `host:port`, as in REF) to speak plain HTTP to
    #[arg(long = "insecure-registry", value_name = "HOST")]
    pub insecure_registries: Vec<String>,
    #[arg(long, env = "SANDCELL_REGISTRY_USERNAME", requires = "password")]
    pub username: Option<String>,
    #[arg(
        long,
        env = "SANDCELL_REGISTRY_PASSWORD",
        hide_env_values = true,
        requires = "username"
    )]
    pub password: Option<String>,
    /// A bearer token for the registry
    #[arg(
        long,
        env = "SANDCELL_REGISTRY_TOKEN",
        hide_env_values = true,
        conflicts_with = "username"
    )]
    pub token: Option<String>,
    #[command(flatten)]
    pub build: BuildArgs,
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// An OCI layout directory or a `docker save` tar file
    pub path: PathBuf,
    #[arg(long)]
    pub name: String,
    /// Which image of several (an OCI ref name or a docker RepoTag)
    #[arg(long)]
    pub tag: Option<String>,
    #[command(flatten)]
    pub build: BuildArgs,
}

#[derive(clap::Args)]
pub struct LsArgs {
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct RmArgs {
    #[arg(required = true)]
    pub names: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

pub async fn run(dirs: &Dirs, command: ImageCommand) -> i32 {
    match command {
        ImageCommand::Pull(args) => pull(dirs, args).await,
        ImageCommand::Import(args) => import(dirs, args).await,
        ImageCommand::Ls(args) => ls(dirs, args),
        ImageCommand::Rm(args) => rm(dirs, args),
    }
}

fn fail(msg: impl std::fmt::Display, code: i32) -> i32 {
    eprintln!("sandcell image: {msg}");
    code
}

/// Fails before any download when no agent can be found for the new image.
fn check_agent(dirs: &Dirs, args: &BuildArgs) -> Result<(), i32> {
    if args.agent.is_some() {
        return Ok(());
    }
    store::find_agent(&dirs.data)
        .map(drop)
        .map_err(|e| fail(e, EXIT_USAGE))
}

/// Registry errors with what to do about the common ones.
fn with_hint(message: String) -> String {
    if message.contains("Not authorized") {
        format!("{message} (pass --username and --password, or --token)")
    } else if message.contains("error sending request for url (https://") {
        format!("{message} (a plain-HTTP registry? pass --insecure-registry HOST:PORT)")
    } else {
        message
    }
}

/// `docker.io/library/alpine:3` → `alpine`.
fn default_name(reference: &str) -> Option<String> {
    let r = sandcell_image::registry::parse_reference(reference).ok()?;
    let last = r.repository().rsplit('/').next()?.to_ascii_lowercase();
    sandcell_image::valid_name(&last).then_some(last)
}

async fn pull(dirs: &Dirs, args: PullArgs) -> i32 {
    let Some(name) = args.name.clone().or_else(|| default_name(&args.reference)) else {
        return fail(
            format!(
                "cannot name an image after {:?}; pass --name",
                args.reference
            ),
            EXIT_USAGE,
        );
    };
    if !sandcell_image::valid_name(&name) {
        return fail(sandcell_image::Error::InvalidName(name), EXIT_USAGE);
    }
    let auth = match (args.username, args.password, args.token) {
        (_, _, Some(token)) => Auth::Bearer(token),
        (Some(username), Some(password), None) => Auth::Basic { username, password },
        _ => Auth::Anonymous,
    };
    let options = PullOptions {
        auth,
        insecure_registries: args.insecure_registries,
        // `sandcell image pull` runs as the host's operator: internal registries are fine.
        allow_internal: true,
        ..PullOptions::default()
    };
    if let Err(code) = check_agent(dirs, &args.build) {
        return code;
    }
    let begun = Instant::now();
    let bars = Bars::new(args.build.json);
    let cache = BlobCache::in_data_dir(&dirs.data);
    let resolved =
        match sandcell_image::registry::pull(&args.reference, &cache, &options, &bars).await {
            Ok(r) => r,
            Err(e) => return fail(with_hint(e.to_string()), EXIT_FAILED),
        };
    let pulled = begun.elapsed();
    finish(dirs, resolved, name, args.build, bars, begun, Some(pulled)).await
}

async fn import(dirs: &Dirs, args: ImportArgs) -> i32 {
    if !sandcell_image::valid_name(&args.name) {
        return fail(sandcell_image::Error::InvalidName(args.name), EXIT_USAGE);
    }
    if let Err(code) = check_agent(dirs, &args.build) {
        return code;
    }
    let begun = Instant::now();
    let bars = Bars::new(args.build.json);
    let cache = BlobCache::in_data_dir(&dirs.data);
    let (path, tag) = (args.path.clone(), args.tag.clone());
    let resolved = tokio::task::spawn_blocking(move || {
        sandcell_image::import::import(&path, tag.as_deref(), &cache, &Limits::default())
    })
    .await;
    let resolved = match resolved {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return fail(e, EXIT_FAILED),
        Err(e) => return fail(format!("import task: {e}"), EXIT_FAILED),
    };
    finish(dirs, resolved, args.name, args.build, bars, begun, None).await
}

/// Builds the image directory and reports.
async fn finish(
    dirs: &Dirs,
    resolved: ResolvedImage,
    name: String,
    args: BuildArgs,
    bars: Bars,
    begun: Instant,
    pulled: Option<std::time::Duration>,
) -> i32 {
    let options = BuildOptions {
        data_dir: dirs.data.clone(),
        name,
        agent: args.agent,
        force: args.force,
        limits: Limits::default(),
    };
    let bars = std::sync::Arc::new(bars);
    let progress = bars.clone();
    let built =
        tokio::task::spawn_blocking(move || sandcell_image::build(&resolved, &options, &*progress))
            .await;
    bars.clear();
    let report = match built {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return fail(e, EXIT_FAILED),
        Err(e) => return fail(format!("build task: {e}"), EXIT_FAILED),
    };
    let total = begun.elapsed();
    if args.json {
        let mut value = serde_json::to_value(&report).unwrap_or_default();
        value["seconds"] = serde_json::json!(total.as_secs_f64());
        if let Some(p) = pulled {
            value["pullSeconds"] = serde_json::json!(p.as_secs_f64());
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        for note in &report.notes {
            eprintln!("note: {note}");
        }
        println!(
            "{}: {} layers, {} entries, {:.1} MiB unpacked, {:.1} MiB ext4, in {:.1} s ({})",
            report.name,
            report.layers,
            report.entries,
            report.tar_bytes as f64 / 1048576.0,
            report.ext4_bytes as f64 / 1048576.0,
            total.as_secs_f64(),
            report.dir.display()
        );
    }
    0
}

fn ls(dirs: &Dirs, args: LsArgs) -> i32 {
    let images = match store::list(&dirs.data) {
        Ok(i) => i,
        Err(e) => return fail(e, EXIT_FAILED),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&images).unwrap_or_default()
        );
        return 0;
    }
    println!("{:<24} {:>10}  {:<5} SOURCE", "NAME", "EXT4 MiB", "TREE");
    for i in images {
        let source = i
            .config
            .as_ref()
            .and_then(|c| c.source.clone())
            .unwrap_or_else(|| "(built-in)".into());
        let size = i
            .ext4_bytes
            .map_or("-".into(), |b| format!("{:.1}", b as f64 / 1048576.0));
        println!(
            "{:<24} {:>10}  {:<5} {source}",
            i.name,
            size,
            if i.has_tree { "yes" } else { "no" }
        );
    }
    0
}

fn rm(dirs: &Dirs, args: RmArgs) -> i32 {
    let mut code = 0;
    let mut removed = Vec::new();
    for name in &args.names {
        match store::remove(&dirs.data, name) {
            Ok(()) => removed.push(name.clone()),
            Err(e) => code = fail(e, EXIT_FAILED),
        }
    }
    if args.json {
        println!("{}", serde_json::json!({ "removed": removed }));
    } else {
        for name in removed {
            println!("removed {name}");
        }
    }
    code
}

/// Progress bars per layer on a terminal; plain lines otherwise; nothing with --json.
struct Bars {
    multi: MultiProgress,
    bars: Mutex<HashMap<String, ProgressBar>>,
    plain: bool,
    quiet: bool,
}

impl Bars {
    fn new(json: bool) -> Bars {
        let tty = std::io::stderr().is_terminal();
        let multi = MultiProgress::with_draw_target(if tty && !json {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        Bars {
            multi,
            bars: Mutex::new(HashMap::new()),
            plain: !tty,
            quiet: json,
        }
    }

    fn clear(&self) {
        let _ = self.multi.clear();
    }

    fn say(&self, line: String) {
        if self.quiet {
            return;
        }
        if self.plain {
            eprintln!("{line}");
        } else {
            let _ = self.multi.println(line);
        }
    }
}

impl Progress for Bars {
    fn event(&self, event: Event) {
        let mut bars = match self.bars.lock() {
            Ok(b) => b,
            Err(poisoned) => poisoned.into_inner(),
        };
        match event {
            Event::Resolved {
                manifest_digest,
                layers,
            } => {
                let total: u64 = layers.iter().map(|(_, s)| s).sum();
                self.say(format!(
                    "manifest {manifest_digest}: {} layers, {:.1} MiB",
                    layers.len(),
                    total as f64 / 1048576.0
                ));
            }
            Event::LayerStart {
                digest,
                size,
                cached,
            } => {
                let short: String = digest.chars().take(19).collect();
                if cached {
                    self.say(format!("{short}: cached"));
                    return;
                }
                let bar = self.multi.add(ProgressBar::new(size));
                bar.set_style(
                    ProgressStyle::with_template(
                        "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
                bar.set_prefix(short);
                bars.insert(digest, bar);
            }
            Event::LayerBytes { digest, bytes } => {
                if let Some(bar) = bars.get(&digest) {
                    bar.set_position(bytes);
                }
            }
            Event::LayerDone { digest } => {
                if let Some(bar) = bars.remove(&digest) {
                    bar.finish_and_clear();
                    let short: String = digest.chars().take(19).collect();
                    self.say(format!(
                        "{short}: downloaded {:.1} MiB",
                        bar.position() as f64 / 1048576.0
                    ));
                }
            }
            Event::Unpacking {
                index,
                total,
                digest,
            } => {
                let short: String = digest.chars().take(19).collect();
                self.say(format!("unpacking layer {}/{total} {short}", index + 1));
            }
            Event::Mkfs { size_mib } => self.say(format!("making a {size_mib} MiB ext4 image")),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_from_references() {
        assert_eq!(super::default_name("alpine").as_deref(), Some("alpine"));
        assert_eq!(
            super::default_name("127.0.0.1:5000/team/App:v2").as_deref(),
            None
        );
        assert_eq!(
            super::default_name("127.0.0.1:5000/team/app:v2").as_deref(),
            Some("app")
        );
    }
}
