//! `sandcell`: run commands in sandboxes.
//!
//! ```text
//! sandcell run [--runtime auto|microvm|gvisor] [--vcpus N] [--memory MiB] [--kernel PATH]
//!              [--image minimal|PATH] [--timeout SECS] [-e KEY=VALUE]... [--verbose] -- CMD [ARGS...]
//! sandcell doctor [--json]
//! sandcell serve [--listen ADDR:PORT] [--runtime auto|microvm|gvisor] [--domain DOMAIN]
//! sandcell image pull REF [--name N] [--insecure-registry HOST] | import PATH --name N | ls | rm NAME
//! sandcell template build -t NAME [-f Dockerfile] [--build-arg K=V]... [CONTEXT] | ls | inspect NAME | rm NAME
//! sandcell keys create [--name N] [--max-sandboxes N] [--json] | ls [--json] | revoke ID|NAME
//!
//! (against a running daemon)
//! sandcell create [--template T] [--timeout SECS] [--metadata K=V]... [--env K=V]... [--json]
//! sandcell ls [--state running|paused] [--metadata K=V]... [--json]
//! sandcell exec ID [--user U] [--cwd DIR] [--env K=V]... -- CMD [ARGS...]
//! sandcell shell ID [--user U] [--cwd DIR] [--env K=V]... [-- CMD [ARGS...]]
//! sandcell cp LOCAL ID:PATH | ID:PATH LOCAL  [--user U]
//! sandcell kill ID...
//! sandcell pause ID... [--json] | resume ID [--timeout SECS] [--json]
//! sandcell fork ID [-n N] [--timeout SECS] [--json] | snapshot ID [--name NAME] [--json]
//! sandcell create ... [--allow-out DEST]... [--deny-out CIDR]... [--no-internet] [--network NAME]...
//! sandcell net create NAME | ls | rm NAME... | join ID NAME | leave ID NAME [--json]
//! sandcell net rules ID [--allow-out DEST]... [--deny-out CIDR]... [--no-internet]
//! sandcell net log ID [--json]
//! sandcell mcp                      (an MCP server on stdio: sandboxes as tools)
//! sandcell computer screenshot ID [-o FILE] | click ID [X Y] | type ID TEXT | key ID KEYS |
//!                   windows ID | launch ID APP|URL|PATH | ...  (a sandbox's desktop)
//! ```
//! Global: `--data-dir D` (or `$SANDCELL_DATA_DIR`, default /var/lib/sandcell); the per-sandbox
//! run dir is `$SANDCELL_RUN_DIR` (default /run/sandcell). The daemon commands find the
//! daemon and key as `daemon.rs` says: `$SANDCELL_URL`/`$SANDCELL_API_KEY`, the config file,
//! or the local admin key.

mod computer;
mod cp;
mod daemon;
mod doctor;
mod exec;
mod image;
mod mcp;
mod net;
mod run;
mod sandboxes;
mod snapshots;
mod template;
mod term;

use clap::{Parser, Subcommand};
use sandcell_runtime::Dirs;
use sandcell_runtime::select::RuntimeChoice;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "sandcell",
    version,
    about = "Sandboxes for AI agents: KVM microVMs, or gVisor where KVM cannot boot a guest"
)]
struct Cli {
    /// Images, kernels and runtime state [default: /var/lib/sandcell]
    #[arg(long, global = true, env = "SANDCELL_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    log: sandcell_server::logging::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command in a fresh sandbox, streaming its output; exits with its status.
    Run(RunArgs),
    /// Check what this host offers: KVM and its kind, runsc, cgroups, and which runtime
    /// `auto` picks and why.
    Doctor(DoctorArgs),
    /// Run the daemon: E2B-compatible API and envd proxy (crates/server)
    Serve(Box<sandcell_server::ServeArgs>),
    /// Manage the daemon's API keys (works on <data-dir>/sandcell.db directly)
    Keys {
        #[command(subcommand)]
        command: sandcell_server::KeysCommand,
    },
    /// The daemon's secrets key (works on <data-dir> directly, with the daemon stopped)
    Secrets {
        #[command(subcommand)]
        command: sandcell_server::SecretsCommand,
    },
    /// OCI images: pull from a registry, import a layout or `docker save` tarball, ls, rm
    Image {
        #[command(subcommand)]
        command: image::ImageCommand,
    },
    /// Templates: build an image from a Dockerfile (RUN steps in sandboxes), ls, inspect, rm
    Template {
        #[command(subcommand)]
        command: template::TemplateCommand,
    },
    #[command(flatten)]
    Client(ClientCommand),
}

/// The commands that talk to a running daemon (`daemon.rs` finds it).
#[derive(Subcommand)]
enum ClientCommand {
    /// Create a sandbox on the daemon; prints its id
    Create(sandboxes::CreateArgs),
    /// List the sandboxes of the API key
    Ls(sandboxes::LsArgs),
    /// Run a command in a sandbox, streaming its output; exits with its status
    Exec(exec::ExecArgs),
    /// An interactive terminal in a sandbox
    Shell(exec::ShellArgs),
    /// Copy a file into a sandbox (LOCAL ID:PATH) or out of one (ID:PATH LOCAL)
    Cp(cp::CpArgs),
    /// Kill sandboxes
    Kill(sandboxes::KillArgs),
    /// Pause sandboxes: memory, processes and files saved to disk (`resume` continues them)
    Pause(snapshots::PauseArgs),
    /// Resume a paused sandbox (same id, processes and files)
    Resume(snapshots::ResumeArgs),
    /// Fork a running sandbox into N new ones that continue from its present state
    Fork(snapshots::ForkArgs),
    /// Snapshot a running sandbox (it keeps running); create sandboxes from it with -t
    Snapshot(snapshots::SnapshotArgs),
    /// Networks: private networks (create, ls, rm, join, leave), a sandbox's egress rules
    /// and what they refused (rules, log)
    Net {
        #[command(subcommand)]
        command: net::NetCommand,
    },
    /// An MCP server on stdin/stdout: sandboxes as tools for an agent (add this command to
    /// an MCP client's config; see docs/mcp.md)
    Mcp(mcp::McpArgs),
    /// A sandbox's desktop: screenshot, click, type, key, windows, launch (`desktop`
    /// template; see docs/computer-api.md)
    Computer {
        #[command(subcommand)]
        command: computer::ComputerCommand,
    },
}

#[derive(clap::Args)]
pub struct RunArgs {
    /// auto: a microVM if this host passes the (cached) self-test, else gVisor
    #[arg(long, default_value = "auto", value_parser = parse_choice, value_name = "auto|microvm|gvisor")]
    pub runtime: RuntimeChoice,
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=32))]
    pub vcpus: u8,
    /// Memory limit in MiB
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(32..=65536), value_name = "MiB")]
    pub memory: u32,
    /// Guest kernel (microvm) [default: <data-dir>/kernels/default/vmlinux]
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// An image name under <data-dir>/images, or a path
    #[arg(long, default_value = "minimal", value_name = "NAME|PATH")]
    pub image: String,
    /// Stop the command after this many seconds (exit status 124)
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Environment variable for the command
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Print the runtime choice and timings on stderr
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// A host directory the sandbox sees read-write at GUEST_PATH (gvisor: bound through
    /// the gofer; microvm: served by virtiofsd over virtio-fs). Repeatable.
    #[arg(long = "volume", value_name = "HOST_DIR:GUEST_PATH")]
    pub volumes: Vec<String>,
    /// The command and its arguments, run as given (no shell is implied)
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub cmd: Vec<String>,
}

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Machine-readable output
    #[arg(long)]
    pub json: bool,
    /// Guest kernel to check [default: <data-dir>/kernels/default/vmlinux]
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
}

fn parse_choice(s: &str) -> Result<RuntimeChoice, String> {
    s.parse()
}

/// Runs a client command against the daemon found from the environment and config.
async fn client(dirs: &Dirs, command: ClientCommand) -> i32 {
    let target = match daemon::locate(dirs) {
        Ok(target) => target,
        Err(e) => return sandboxes::fail(&e.to_string(), sandboxes::EXIT_USAGE),
    };
    match command {
        ClientCommand::Create(args) => sandboxes::create(&target, args).await,
        ClientCommand::Ls(args) => sandboxes::ls(&target, args).await,
        ClientCommand::Exec(args) => exec::exec(&target, args).await,
        ClientCommand::Shell(args) => exec::shell(&target, args).await,
        ClientCommand::Cp(args) => cp::cp(&target, args).await,
        ClientCommand::Kill(args) => sandboxes::kill(&target, args).await,
        ClientCommand::Pause(args) => snapshots::pause(&target, args).await,
        ClientCommand::Resume(args) => snapshots::resume(&target, args).await,
        ClientCommand::Fork(args) => snapshots::fork(&target, args).await,
        ClientCommand::Snapshot(args) => snapshots::snapshot(&target, args).await,
        ClientCommand::Net { command } => net::run(&target, command).await,
        ClientCommand::Mcp(args) => mcp::stdio(&target, args).await,
        ClientCommand::Computer { command } => computer::run(&target, command).await,
    }
}

fn main() {
    let mut cli = Cli::parse();
    // `sandcell run`'s stderr is the guest's: only warnings of ours there, unless asked.
    if matches!(cli.command, Command::Run(_))
        && cli.log.log_level == sandcell_server::logging::DEFAULT_FILTER
    {
        cli.log.log_level = "warn".into();
    }
    sandcell_server::logging::init(&cli.log);
    let dirs = Dirs::from_env(cli.data_dir);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandcell: cannot start the async runtime: {e}");
            std::process::exit(125);
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(dirs, args).await,
            Command::Doctor(args) => doctor::doctor(dirs, args).await,
            Command::Serve(args) => sandcell_server::serve(dirs, *args).await,
            Command::Keys { command } => sandcell_server::keys(dirs, command).await,
            Command::Secrets { command } => sandcell_server::secrets(dirs, command).await,
            Command::Image { command } => image::run(&dirs, command).await,
            Command::Template { command } => template::run(&dirs, command).await,
            Command::Client(command) => client(&dirs, command).await,
        }
    });
    // Threads blocked on our stdin must not hold the exit up.
    runtime.shutdown_background();
    std::process::exit(code);
}
