//! `sandcell run`: one sandbox, one command, then nothing left.
//!
//! The command's stdout and stderr are copied to ours as they arrive; our stdin is forwarded
//! when it is a pipe, a file or a socket (a terminal is not: there is no pty yet), with EOF
//! becoming CloseStdin. Exit status: the command's, 128+n when a signal ended it; 124 on
//! `--timeout`; 128+n when we are interrupted; 137 when the sandbox ran out of memory; 125
//! when Sandcell itself failed or the sandbox died. The sandbox is removed on every path.

use crate::RunArgs;
use sandcell_envd_client::{ClientError, EnvdClient, OutputKind, decode_data};
use sandcell_proto::agent::{Event, ProcessConfig, StartRequest};
use sandcell_runtime::gvisor::GvisorRuntime;
use sandcell_runtime::microvm::MicrovmRuntime;
use sandcell_runtime::select::{self, Selection};
use sandcell_runtime::{
    Dirs, Image, Runtime, RuntimeKind, Sandbox, SandboxConnector, SandboxExit, SandboxSpec,
    agent_client, new_sandbox_id,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};

/// Sandcell failed (not the command).
const EXIT_SANDCELL: i32 = 125;
const EXIT_TIMEOUT: i32 = 124;
/// What a shell reports for a command that cannot be found.
const EXIT_NOT_FOUND: i32 = 127;
const EXIT_OOM: i32 = 128 + 9;
const DESTROY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long to wait for the sandbox's end to be known once the agent stream broke.
const DEATH_TIMEOUT: Duration = Duration::from_secs(5);
const STDIN_CHUNK: usize = 64 * 1024;

enum Outcome {
    /// The command ended with this shell status.
    Exited(i32),
    /// The sandbox ended under the command.
    SandboxDied(SandboxExit),
    TimedOut(u64),
    Signal(i32),
    /// Sandcell failed: message, exit status.
    Failed(String, i32),
}

#[derive(Default)]
struct Timings {
    created: Option<Duration>,
    ready: Option<Duration>,
    first_output: Option<Duration>,
    ended: Option<Duration>,
    removed: Option<Duration>,
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| {
        format!("{:.1} ms", d.as_secs_f64() * 1000.0)
    })
}

pub async fn run(dirs: Dirs, args: RunArgs) -> i32 {
    let t0 = Instant::now();
    let env = match parse_env(&args.env) {
        Ok(env) => env,
        Err(msg) => return fail(&msg, 2),
    };
    let image = match Image::resolve(&dirs.images(), &args.image) {
        Ok(image) => image,
        Err(e) => return fail(&e.to_string(), EXIT_SANDCELL),
    };
    let selection = select::choose(args.runtime, &dirs, args.kernel.clone(), Some(&image)).await;
    if selection.fell_back {
        eprintln!("sandcell: using the gvisor runtime: {}", selection.reason);
    } else if args.verbose {
        eprintln!(
            "sandcell: using the {} runtime: {}",
            selection.runtime, selection.reason
        );
    }
    let runtime = match open_runtime(&dirs, &selection).await {
        Ok(rt) => rt,
        Err(msg) => return fail(&msg, EXIT_SANDCELL),
    };
    // Leftovers of sandboxes whose `sandcell` died are removed while this one starts.
    let sweeper = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.sweep().await }
    });

    let id = match new_sandbox_id() {
        Ok(id) => id,
        Err(e) => return fail(&e.to_string(), EXIT_SANDCELL),
    };
    let mut spec = SandboxSpec::new(id, image);
    spec.vcpus = args.vcpus;
    spec.memory_mib = args.memory;
    spec.kernel = args.kernel.clone();
    spec.volumes = match volume_binds(&args.volumes) {
        Ok(v) => v,
        Err(msg) => return fail(&msg, EXIT_SANDCELL),
    };
    let sandbox: Arc<dyn Sandbox> = match runtime.create(spec).await {
        Ok(sb) => Arc::from(sb),
        Err(e) => return fail(&e.to_string(), EXIT_SANDCELL),
    };
    let mut timings = Timings {
        created: Some(t0.elapsed()),
        ..Default::default()
    };

    let outcome = supervise(&sandbox, &args, env, t0, &mut timings).await;

    timings.ended = Some(t0.elapsed());
    let cleanup = tokio::time::timeout(DESTROY_TIMEOUT, sandbox.destroy()).await;
    timings.removed = Some(t0.elapsed());
    let _ = tokio::io::stdout().flush().await;
    match cleanup {
        Ok(Ok(())) => {}
        Ok(Err(e)) => eprintln!(
            "sandcell: removing sandbox {} failed: {e} (the next `sandcell run` sweeps it)",
            sandbox.id()
        ),
        Err(_) => eprintln!(
            "sandcell: removing sandbox {} timed out (the next `sandcell run` sweeps it)",
            sandbox.id()
        ),
    }
    match tokio::time::timeout(Duration::from_secs(5), sweeper).await {
        Ok(Ok(Ok(cleaned))) if args.verbose && !cleaned.is_empty() => {
            eprintln!(
                "sandcell: removed leftovers of {} dead sandbox(es): {}",
                cleaned.len(),
                cleaned.join(", ")
            )
        }
        Ok(Ok(Err(e))) if args.verbose => eprintln!("sandcell: sweeping leftovers: {e}"),
        _ => {}
    }
    if args.verbose {
        eprintln!(
            "sandcell: {} sandbox {}: created {}, agent ready {}, first output {}, command ended {}, \
             removed {}, total {}",
            selection.runtime,
            sandbox.id(),
            ms(timings.created),
            ms(timings.ready),
            ms(timings.first_output),
            ms(timings.ended),
            ms(timings.removed),
            ms(Some(t0.elapsed())),
        );
    }
    report(outcome)
}

fn report(outcome: Outcome) -> i32 {
    match outcome {
        Outcome::Exited(code) => code,
        Outcome::SandboxDied(exit @ SandboxExit::OutOfMemory { .. }) => {
            fail(&exit.to_string(), EXIT_OOM)
        }
        // A power-off is the guest's own clean ending (busybox `poweroff`, `kill 1`): the
        // command asked for it, so it is reported but is not a failure.
        Outcome::SandboxDied(
            SandboxExit::Vm {
                status: sandcell_proto::vmm::ExitStatus::PowerOff,
                ..
            }
            | SandboxExit::Exited { code: 0, .. },
        ) => {
            eprintln!("sandcell: the sandbox powered off before the command ended");
            0
        }
        Outcome::SandboxDied(exit) => fail(&format!("the sandbox died: {exit}"), EXIT_SANDCELL),
        Outcome::TimedOut(secs) => fail(
            &format!(
                "the command did not finish within --timeout {secs} s; it was stopped and the sandbox removed"
            ),
            EXIT_TIMEOUT,
        ),
        Outcome::Signal(sig) => fail(
            &format!("interrupted by signal {sig}; the sandbox was removed"),
            128 + sig,
        ),
        Outcome::Failed(msg, code) => fail(&msg, code),
    }
}

fn fail(msg: &str, code: i32) -> i32 {
    eprintln!("sandcell: {msg}");
    code
}

fn parse_env(pairs: &[String]) -> Result<BTreeMap<String, String>, String> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(format!("-e {p:?}: expected KEY=VALUE")),
        })
        .collect()
}

async fn open_runtime(dirs: &Dirs, selection: &Selection) -> Result<Arc<dyn Runtime>, String> {
    match selection.runtime {
        RuntimeKind::Gvisor => {
            match GvisorRuntime::new(dirs.clone(), sandcell_runtime::net::NetRegistry::new()).await
            {
                Ok(rt) => Ok(Arc::new(rt)),
                Err(e) => Err(e.to_string()),
            }
        }
        RuntimeKind::Microvm => {
            match MicrovmRuntime::new(dirs.clone(), sandcell_runtime::net::NetRegistry::new()) {
                Ok(rt) => Ok(Arc::new(rt)),
                Err(e) => Err(e.to_string()),
            }
        }
    }
}

/// The command's life, bounded by `--timeout` and our own signals.
async fn supervise(
    sandbox: &Arc<dyn Sandbox>,
    args: &RunArgs,
    env: BTreeMap<String, String>,
    t0: Instant,
    timings: &mut Timings,
) -> Outcome {
    let (mut int, mut term, mut hup) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        _ => return Outcome::Failed("cannot install signal handlers".into(), EXIT_SANDCELL),
    };
    let deadline = async {
        match args.timeout {
            Some(secs) => tokio::time::sleep(Duration::from_secs(secs)).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        outcome = session(sandbox, args, env, t0, timings) => outcome,
        _ = int.recv() => Outcome::Signal(libc::SIGINT),
        _ = term.recv() => Outcome::Signal(libc::SIGTERM),
        _ = hup.recv() => Outcome::Signal(libc::SIGHUP),
        () = deadline => Outcome::TimedOut(args.timeout.unwrap_or(0)),
    }
}

async fn session(
    sandbox: &Arc<dyn Sandbox>,
    args: &RunArgs,
    env: BTreeMap<String, String>,
    t0: Instant,
    timings: &mut Timings,
) -> Outcome {
    if let Err(e) = sandbox.start().await {
        return Outcome::Failed(e.to_string(), EXIT_SANDCELL);
    }
    timings.ready = Some(t0.elapsed());
    let client = agent_client(sandbox.clone());
    let forward_stdin = stdin_is_forwardable();
    let request = StartRequest {
        process: ProcessConfig {
            cmd: args.cmd[0].clone(),
            args: args.cmd[1..].to_vec(),
            envs: env,
            cwd: None,
        },
        stdin: forward_stdin.then_some(true),
        tag: None,
    };
    let mut stream = match client.start(&request).await {
        Ok(stream) => stream,
        Err(e) => return broken(sandbox, &args.cmd[0], e, false).await,
    };
    let mut stdin_task: Option<tokio::task::JoinHandle<()>> = None;
    let mut stdout = Output::new(tokio::io::stdout());
    let mut stderr = Output::new(tokio::io::stderr());
    let mut started = false;
    let outcome = loop {
        match stream.next().await {
            Some(Ok(message)) => match message.event {
                Event::Start(start) => {
                    started = true;
                    if forward_stdin {
                        stdin_task =
                            Some(tokio::spawn(forward_stdin_to(client.clone(), start.pid)));
                    }
                }
                Event::Data(data) => {
                    timings.first_output.get_or_insert_with(|| t0.elapsed());
                    match decode_data(&data) {
                        Ok((OutputKind::Stderr, bytes)) => stderr.write(&bytes).await,
                        Ok((_, bytes)) => stdout.write(&bytes).await,
                        Err(e) => break broken(sandbox, &args.cmd[0], e, started).await,
                    }
                }
                Event::End(end) => {
                    if let Some(error) = end.error.as_deref().filter(|e| !e.is_empty()) {
                        eprintln!("sandcell: {}: {error}", args.cmd[0]);
                    }
                    break Outcome::Exited(end.shell_status());
                }
                Event::Keepalive(_) => {}
            },
            Some(Err(e)) => break broken(sandbox, &args.cmd[0], e, started).await,
            None => {
                let e = ClientError::Protocol {
                    what: "Start".into(),
                    reason: "the stream ended without an end event".into(),
                };
                break broken(sandbox, &args.cmd[0], e, started).await;
            }
        }
    };
    if let Some(task) = stdin_task {
        task.abort();
    }
    outcome
}

/// The agent stream failed: either the sandbox died under the command (say so), or the
/// command could not start, or the agent misbehaved.
async fn broken(
    sandbox: &Arc<dyn Sandbox>,
    cmd: &str,
    error: ClientError,
    started: bool,
) -> Outcome {
    if let Ok(exit) = tokio::time::timeout(DEATH_TIMEOUT, sandbox.wait()).await {
        return Outcome::SandboxDied(exit);
    }
    match error {
        ClientError::Rpc { message, .. } | ClientError::Status { message, .. } if !started => {
            Outcome::Failed(format!("cannot run {cmd:?}: {message}"), EXIT_NOT_FOUND)
        }
        other => Outcome::Failed(
            format!("lost the agent of sandbox {}: {other}", sandbox.id()),
            EXIT_SANDCELL,
        ),
    }
}

/// One of our output streams. After a write error (a closed pipe: `sandcell run ... | head`)
/// the rest of that stream is dropped; the command runs on.
struct Output<W> {
    writer: Option<W>,
}

impl<W: tokio::io::AsyncWrite + Unpin> Output<W> {
    fn new(writer: W) -> Self {
        Output {
            writer: Some(writer),
        }
    }

    async fn write(&mut self, bytes: &[u8]) {
        if let Some(w) = self.writer.as_mut()
            && (w.write_all(bytes).await.is_err() || w.flush().await.is_err())
        {
            self.writer = None;
        }
    }
}

/// A pipe, file or socket on stdin is data meant for the command; a terminal or /dev/null
/// is not.
fn stdin_is_forwardable() -> bool {
    // SAFETY: fstat only writes the struct we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd 0 and a valid out-pointer.
    if unsafe { libc::fstat(0, &mut st) } != 0 {
        return false;
    }
    matches!(
        st.st_mode & libc::S_IFMT,
        libc::S_IFIFO | libc::S_IFREG | libc::S_IFSOCK
    )
}

async fn forward_stdin_to(client: EnvdClient<SandboxConnector>, pid: u32) {
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; STDIN_CHUNK];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if client.send_input(pid, &buf[..n]).await.is_err() {
                    // The process is gone or stopped reading: nothing more to deliver.
                    return;
                }
            }
        }
    }
    let _ = client.close_stdin(pid).await;
}

/// `--volume HOST_DIR:GUEST_PATH`: the host side must be an existing directory (made
/// absolute, so that the runtime never resolves it against another working directory).
fn volume_binds(args: &[String]) -> Result<Vec<sandcell_runtime::VolumeBind>, String> {
    args.iter()
        .map(|a| {
            let (host, guest) = a
                .rsplit_once(':')
                .ok_or_else(|| format!("--volume {a}: expected HOST_DIR:GUEST_PATH"))?;
            let host = std::fs::canonicalize(host)
                .map_err(|e| format!("--volume {a}: the host directory {host}: {e}"))?;
            if !host.is_dir() {
                return Err(format!(
                    "--volume {a}: {} is not a directory",
                    host.display()
                ));
            }
            Ok(sandcell_runtime::VolumeBind {
                host,
                guest: guest.to_string(),
            })
        })
        .collect()
}
