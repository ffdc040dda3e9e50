//! `sandcell-agent`: PID 1 of a Sandcell sandbox, or a plain process on the host for tests.
//!
//! ```text
//! sandcell-agent [--listen vsock:PORT|unix:/PATH|tcp:IP:PORT] [--no-init-mounts]
//!                [--hostname NAME] [--keepalive-secs N] [--workdir DIR]
//!                [--default-user NAME] [--etc-dir DIR] [--sudo-service] [--version]
//! sudo [OPTIONS] COMMAND...        (this binary by the name `sudo`: see `sudo`)
//! ```
//! `--workdir` (alias `--files-base`) is the default working directory for empty paths;
//! `--default-user` the user of requests that name none until `/init` sets one (envd: root);
//! `--etc-dir` where `passwd` and `group` are read (tests); `--sudo-service` serves `sudo`
//! for the sandbox's users where setuid cannot elevate (gVisor); `--version` prints the envd
//! version the agent implements.
//! As PID 1 it first mounts /proc, /sys, /dev, ... (what is not mounted yet), brings `lo` up
//! and sets the hostname. Without `--listen` it takes `sandcell.listen=` from the kernel
//! command line, else `vsock:49983`. As PID 1, SIGTERM powers off like `POST /sandcell/poweroff`.
//!
//! The same static binary runs everywhere: as `init=/sbin/sandcell-agent` in a microVM
//! (listening on vsock), as the OCI process of a gVisor sandbox (a Unix socket in a shared
//! directory), and as a plain host process in tests. It is a binary only: the host side of
//! the protocol is `sandcell-envd-client`, the wire types `sandcell-proto`.

mod body;
mod checkpoint;
mod connect;
mod entropy;
mod env_file;
mod files;
mod fs_api;
mod hub;
mod init;
mod listen;
mod metadata;
mod netconfig;
mod power;
mod process;
mod process_api;
mod pty;
mod reaper;
mod repoll;
mod server;
mod state;
mod stream;
mod sudo;
mod trust_store;
mod upload;
mod users;
mod vsock;
mod watch;

/// One line on the console (stderr), prefixed so it stands out in a VM's boot log.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("sandcell-agent: {}", format_args!($($arg)*))
    };
}

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};

use crate::init::KernelArgs;
use crate::listen::{ListenAddr, Listener};
use crate::server::{ServeOutcome, Server, ServerConfig};

#[derive(Debug, Default)]
struct Args {
    listen: Option<String>,
    no_init_mounts: bool,
    hostname: Option<String>,
    keepalive_secs: Option<u64>,
    workdir: Option<String>,
    default_user: Option<String>,
    etc_dir: Option<PathBuf>,
    env_file: Option<PathBuf>,
    trust_root: Option<PathBuf>,
    sudo_service: bool,
}

/// How long a checkpoint hold lasts at most without a resume marker (see
/// `checkpoint`): a runtime that died between asking and checkpointing must
/// not leave the agent deaf for good. A checkpoint in progress freezes the agent, so a slow
/// save does not run into it.
const CHECKPOINT_HOLD_MAX: Duration = Duration::from_secs(60);

const USAGE: &str = "usage: sandcell-agent [--listen vsock:PORT|unix:/PATH|tcp:IP:PORT] [--no-init-mounts] \
                     [--hostname NAME] [--keepalive-secs N] [--workdir DIR] \
                     [--default-user NAME] [--etc-dir DIR] [--env-file PATH] [--trust-root DIR] \
                     [--sudo-service] \
                     [--version]";

fn parse_args(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args::default();
    while let Some(arg) = argv.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| argv.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--listen" => args.listen = Some(value()?),
            "--no-init-mounts" => args.no_init_mounts = true,
            "--sudo-service" => args.sudo_service = true,
            "--hostname" => args.hostname = Some(value()?),
            "--keepalive-secs" => {
                let v = value()?;
                args.keepalive_secs = Some(
                    v.parse()
                        .map_err(|_| format!("--keepalive-secs {v:?} is not a number"))?,
                );
            }
            "--workdir" | "--files-base" => args.workdir = Some(value()?),
            "--default-user" => args.default_user = Some(value()?),
            "--etc-dir" => args.etc_dir = Some(PathBuf::from(value()?)),
            "--env-file" => args.env_file = Some(PathBuf::from(value()?)),
            "--trust-root" => args.trust_root = Some(PathBuf::from(value()?)),
            "--version" => {
                println!("{}", sandcell_proto::agent::ENVD_VERSION);
                std::process::exit(0);
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            // The kernel passes unknown undotted parameters to init as arguments: ignore them as
            // PID 1, refuse them elsewhere.
            other if std::process::id() == 1 => log!("ignoring argument {other:?}"),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let called = std::env::args_os().next().unwrap_or_default();
    if std::path::Path::new(&called).file_name() == Some(std::ffi::OsStr::new("sudo")) {
        return match sudo::client::arguments() {
            Ok(argv) => sudo::client::main(argv),
            Err(bad) => {
                eprintln!("sudo: argument {bad:?} is not valid UTF-8");
                ExitCode::FAILURE
            }
        };
    }
    let is_init = std::process::id() == 1;
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            return fail(is_init);
        }
    };
    // /proc must be mounted before /proc/cmdline can be read: init duties come first.
    let kernel = if is_init {
        init::become_init(!args.no_init_mounts, args.hostname.as_deref())
    } else {
        KernelArgs::default()
    };
    let listen = args
        .listen
        .or(kernel.listen)
        .unwrap_or_else(|| format!("vsock:{}", sandcell_proto::vmm::AGENT_PORT));
    let addr: ListenAddr = match listen.parse() {
        Ok(a) => a,
        Err(e) => {
            log!("{e}");
            return fail(is_init);
        }
    };
    let mut config = ServerConfig::default();
    if let Some(secs) = args.keepalive_secs {
        config.keepalive = Duration::from_secs(secs.max(1));
    }
    if args.workdir.is_some() {
        config.default_workdir = args.workdir;
    }
    if let Some(user) = args.default_user {
        config.default_user = user;
    }
    if let Some(dir) = args.etc_dir {
        config.etc_dir = dir;
    }
    // A microVM's PID 1 is in a guest of its own; elsewhere only where the runtime says.
    config.env_file = args
        .env_file
        .or_else(|| is_init.then(|| PathBuf::from(sandcell_proto::agent::ENV_FILE_PATH)));
    config.trust_root = args
        .trust_root
        .or_else(|| is_init.then(|| PathBuf::from(sandcell_proto::agent::TRUST_ROOT)));
    // Only the agent that configured the interface at boot may readdress it from /init.
    config.owns_network = is_init && kernel.net.is_some();

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log!("starting the async runtime: {e}");
            return fail(is_init);
        }
    };
    let etc_dir = config.etc_dir.clone();
    let outcome = runtime.block_on(async {
        let server = Server::new(config).map_err(|e| format!("starting the child reaper: {e}"))?;
        if args.sudo_service {
            match sudo::service::start(server.reaper(), crate::users::UserDb::new(&etc_dir)) {
                Ok(()) => log!("sudo service on @{}", sudo::SOCKET_NAME),
                Err(e) => log!("sudo service not started: {e}"),
            }
        }
        // PID 1 has no default action for these; `runsc kill` and busybox's poweroff/halt
        // (SIGUSR2/SIGUSR1 to PID 1) expect one: power off.
        let mut sigterm = if is_init {
            Some(PowerSignals::new()?)
        } else {
            None
        };
        loop {
            let listener = Listener::bind(&addr).await.map_err(|e| e.to_string())?;
            log!("listening on {addr}");
            let served = match &mut sigterm {
                None => server.serve(listener).await,
                Some(sigterm) => tokio::select! {
                    served = server.serve(listener) => served,
                    name = sigterm.recv() => {
                        log!("{name}: powering off");
                        Ok(ServeOutcome::PowerOffRequested)
                    }
                },
            };
            match served.map_err(|e| format!("serving on {addr}: {e}"))? {
                // The listener is closed by now (dropped with the serve future).
                ServeOutcome::CheckpointRequested => {
                    if let Some(marker) = crate::checkpoint::marker_path(&addr) {
                        let held = crate::checkpoint::mark_held(&marker);
                        let seen =
                            crate::checkpoint::hold_until_resumed(&marker, CHECKPOINT_HOLD_MAX)
                                .await;
                        // The host removes it before restoring; this covers a failed or
                        // abandoned checkpoint.
                        if let Some(held) = held {
                            let _ = std::fs::remove_file(held);
                        }
                        if !seen {
                            log!(
                                "no resume marker within {CHECKPOINT_HOLD_MAX:?}: listening again"
                            );
                        }
                    }
                }
                outcome => return Ok::<_, String>(outcome),
            }
        }
    });
    match outcome {
        Ok(ServeOutcome::PowerOffRequested) if is_init => crate::power::power_off(),
        Ok(ServeOutcome::PowerOffRequested) => {
            log!("power-off requested; not PID 1, so exiting");
            ExitCode::SUCCESS
        }
        // The serve loop above handles every hold itself.
        Ok(ServeOutcome::CheckpointRequested) => {
            log!("checkpoint hold left the serve loop");
            fail(is_init)
        }
        Err(msg) => {
            log!("{msg}");
            fail(is_init)
        }
    }
}

/// PID 1 must not simply exit (the kernel would panic): power off so the VMM reports it.
fn fail(is_init: bool) -> ExitCode {
    if is_init {
        crate::power::power_off();
    }
    ExitCode::FAILURE
}

/// The signals that ask PID 1 to power off: SIGTERM (`runsc kill`, `kill 1`), SIGUSR2
/// (busybox `poweroff`) and SIGUSR1 (busybox `halt`; a sandbox has nothing to halt for).
struct PowerSignals {
    term: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
}

impl PowerSignals {
    fn new() -> Result<Self, String> {
        let install =
            |kind: SignalKind, name: &str| signal(kind).map_err(|e| format!("{name} handler: {e}"));
        Ok(PowerSignals {
            term: install(SignalKind::terminate(), "SIGTERM")?,
            usr2: install(SignalKind::user_defined2(), "SIGUSR2")?,
            usr1: install(SignalKind::user_defined1(), "SIGUSR1")?,
        })
    }

    /// Waits for one of the signals and names it.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.usr2.recv() => "SIGUSR2 (poweroff)",
            _ = self.usr1.recv() => "SIGUSR1 (halt)",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_flags_with_and_without_equals() {
        let a = parse(&[
            "--listen",
            "unix:/a.sock",
            "--keepalive-secs=5",
            "--no-init-mounts",
        ])
        .unwrap_or_default();
        assert_eq!(a.listen.as_deref(), Some("unix:/a.sock"));
        assert_eq!(a.keepalive_secs, Some(5));
        assert!(a.no_init_mounts);
        assert!(parse(&["--listen"]).is_err());
        assert!(parse(&["--bogus"]).is_err());
        assert!(parse(&["--keepalive-secs", "x"]).is_err());
    }
}
