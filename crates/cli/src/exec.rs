//! `sandcell exec` (a command in a running sandbox, its output streamed, its exit status
//! ours) and `sandcell shell` (an interactive terminal in it).
//!
//! exec: stdout and stderr are copied to ours apart, as they arrive; our stdin is forwarded
//! when it is not a terminal (EOF becomes CloseStdin); SIGINT, SIGTERM and SIGHUP we get are
//! passed on to the command. Exit status: the command's, 128+n when signal n ended it; 127
//! when it could not start; 125 when Sandcell failed or the sandbox went away.
//!
//! shell: a PTY sized like our terminal, which is put in raw mode (every key goes to the
//! sandbox, ^C included) and restored on the way out; SIGWINCH resizes the PTY.

use crate::daemon::Target;
use crate::sandboxes::{EXIT_USAGE, fail, parse_pairs};
use crate::term;
use sandcell_client::{ClientError, Envd, Output, ProcessStream, decode_data};
use sandcell_proto::agent::process::{Pty, PtySize, StartRequest};
use sandcell_proto::agent::{Event, ProcessConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};

/// Sandcell failed, or the sandbox went away (not the command).
pub const EXIT_SANDCELL: i32 = 125;
/// What a shell reports for a command it cannot run.
const EXIT_NOT_FOUND: i32 = 127;
const STDIN_CHUNK: usize = 64 * 1024;
/// A login shell: bash where the image has it (E2B's `bash -i -l`), else sh.
const DEFAULT_SHELL: &str = "if command -v bash >/dev/null 2>&1; then exec bash -l; fi; exec sh -l";

#[derive(clap::Args)]
pub struct ExecArgs {
    /// The sandbox
    #[arg(value_name = "ID")]
    pub id: String,
    /// Run as this user (root, user, ...) [default: the sandbox's default user]
    #[arg(long, short = 'u', value_name = "USER")]
    pub user: Option<String>,
    /// Working directory [default: the user's home]
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Environment variable for the command (repeatable)
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
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
pub struct ShellArgs {
    /// The sandbox
    #[arg(value_name = "ID")]
    pub id: String,
    /// Run as this user [default: the sandbox's default user]
    #[arg(long, short = 'u', value_name = "USER")]
    pub user: Option<String>,
    /// Working directory [default: the user's home]
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Environment variable for the shell (repeatable)
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// What to run instead of a login shell
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub cmd: Vec<String>,
}

/// The sandbox's envd, as `user`; a message and exit status when it cannot be reached.
async fn envd_of(target: &Target, id: &str, user: Option<String>) -> Result<Envd, i32> {
    match target.client.connect_envd(id).await {
        Ok(envd) => Ok(envd.as_user(user)),
        Err(e) => Err(fail(&target.explain(&e, Some(id)), EXIT_SANDCELL)),
    }
}

/// Why a Start failed: the command could not run (127), or Sandcell could not ask (125).
fn start_failed(target: &Target, id: &str, cmd: &str, e: &ClientError) -> i32 {
    match e {
        ClientError::Rpc { message, .. } => {
            fail(&format!("cannot run {cmd:?}: {message}"), EXIT_NOT_FOUND)
        }
        ClientError::Envd {
            status, message, ..
        } if status.is_client_error() && status.as_u16() != 404 => {
            fail(&format!("cannot run {cmd:?}: {message}"), EXIT_NOT_FOUND)
        }
        other => fail(&target.explain(other, Some(id)), EXIT_SANDCELL),
    }
}

pub async fn exec(target: &Target, args: ExecArgs) -> i32 {
    let envs = match parse_pairs("--env", &args.env) {
        Ok(e) => e,
        Err(msg) => return fail(&msg, EXIT_USAGE),
    };
    let envd = match envd_of(target, &args.id, args.user.clone()).await {
        Ok(envd) => envd,
        Err(code) => return code,
    };
    let forward_stdin = !term::is_tty(0);
    let request = StartRequest {
        process: ProcessConfig {
            cmd: args.cmd[0].clone(),
            args: args.cmd[1..].to_vec(),
            envs,
            cwd: args.cwd.clone(),
        },
        pty: None,
        tag: None,
        stdin: Some(forward_stdin),
    };
    let (Ok(mut int), Ok(mut term_sig), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return fail("cannot install signal handlers", EXIT_SANDCELL);
    };
    let mut stream = match envd.start(&request).await {
        Ok(s) => s,
        Err(e) => return start_failed(target, &args.id, &args.cmd[0], &e),
    };
    let mut stdout = Sink::new(tokio::io::stdout());
    let mut stderr = Sink::new(tokio::io::stderr());
    let mut pid: Option<u32> = None;
    let mut stdin_task = None;
    let status = loop {
        let signo = tokio::select! {
            event = stream.next() => match event {
                Some(Ok(message)) => match message.event {
                    Event::Start(start) => {
                        pid = Some(start.pid);
                        if forward_stdin {
                            stdin_task = Some(tokio::spawn(forward_stdin_to(envd.clone(), start.pid)));
                        }
                        continue;
                    }
                    Event::Data(data) => {
                        match decode_data(&data) {
                            Ok((Output::Stderr, bytes)) => stderr.write(&bytes).await,
                            Ok((_, bytes)) => stdout.write(&bytes).await,
                            Err(e) => break lost(target, &args.id, &e),
                        }
                        continue;
                    }
                    Event::End(end) => {
                        if let Some(error) = end.error.as_deref().filter(|e| !e.is_empty()) {
                            eprintln!("sandcell: {}: {error}", args.cmd[0]);
                        }
                        break end.shell_status();
                    }
                    Event::Keepalive(_) => continue,
                },
                Some(Err(e)) if pid.is_none() => break start_failed(target, &args.id, &args.cmd[0], &e),
                Some(Err(e)) => break lost(target, &args.id, &e),
                None => break lost(target, &args.id, &ClientError::Body(
                    "the process stream ended without an end event".into())),
            },
            _ = int.recv() => libc::SIGINT,
            _ = term_sig.recv() => libc::SIGTERM,
            _ = hup.recv() => libc::SIGHUP,
        };
        // A signal for us is one for the command; its end still comes through the stream.
        if let Some(pid) = pid {
            let envd = envd.clone();
            tokio::spawn(async move { envd.send_signal(pid, signo).await });
        } else {
            break 128 + signo;
        }
    };
    if let Some(task) = stdin_task {
        task.abort();
    }
    stdout.flush().await;
    status
}

fn lost(target: &Target, id: &str, e: &ClientError) -> i32 {
    fail(
        &format!(
            "lost the command in sandbox {id}: {}",
            target.explain(e, Some(id))
        ),
        EXIT_SANDCELL,
    )
}

/// Our stdin to the process's, in order over one StreamInput call, then CloseStdin.
async fn forward_stdin_to(envd: Envd, pid: u32) {
    let Ok(mut input) = envd.stream_input(pid, false) else {
        return;
    };
    if copy_input(&mut tokio::io::stdin(), &mut input).await {
        // Everything was delivered (the call answered) before stdin is closed.
        if input.finish().await.is_ok() {
            let _ = envd.close_stdin(pid).await;
        }
    }
}

/// Copies `reader` into `input` until EOF (true) or a failure on either side (false: the
/// process is gone or stopped reading, so nothing more can be delivered).
async fn copy_input<R: AsyncRead + Unpin>(
    reader: &mut R,
    input: &mut sandcell_client::InputStream,
) -> bool {
    let mut buf = vec![0u8; STDIN_CHUNK];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) => return true,
            Err(_) => return false,
            Ok(n) => {
                if input.send(&buf[..n]).await.is_err() {
                    return false;
                }
            }
        }
    }
}

/// One of our output streams. After a write error (a closed pipe: `sandcell exec ... | head`)
/// the rest of that stream is dropped; the command runs on.
struct Sink<W> {
    writer: Option<W>,
}

impl<W: AsyncWrite + Unpin> Sink<W> {
    fn new(writer: W) -> Self {
        Sink {
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

    async fn flush(&mut self) {
        if let Some(w) = self.writer.as_mut() {
            let _ = w.flush().await;
        }
    }
}

pub async fn shell(target: &Target, args: ShellArgs) -> i32 {
    if !term::is_tty(0) {
        return fail(
            "`sandcell shell` needs a terminal on stdin; for pipes and scripts use `sandcell exec ID -- CMD`",
            EXIT_USAGE,
        );
    }
    let mut envs = match parse_pairs("--env", &args.env) {
        Ok(e) => e,
        Err(msg) => return fail(&msg, EXIT_USAGE),
    };
    let term_name = std::env::var("TERM")
        .ok()
        .filter(|t| !t.is_empty() && t != "dumb")
        .unwrap_or_else(|| "xterm-256color".to_string());
    envs.entry("TERM".to_string()).or_insert(term_name);
    let envd = match envd_of(target, &args.id, args.user.clone()).await {
        Ok(envd) => envd,
        Err(code) => return code,
    };
    let (cols, rows) = term::size(0).or_else(|| term::size(1)).unwrap_or((80, 24));
    let (cmd, cmd_args) = match args.cmd.split_first() {
        Some((cmd, rest)) => (cmd.clone(), rest.to_vec()),
        None => (
            "/bin/sh".to_string(),
            vec!["-c".to_string(), DEFAULT_SHELL.to_string()],
        ),
    };
    let request = StartRequest {
        process: ProcessConfig {
            cmd: cmd.clone(),
            args: cmd_args,
            envs,
            cwd: args.cwd.clone(),
        },
        pty: Some(Pty {
            size: Some(PtySize {
                cols: cols.into(),
                rows: rows.into(),
            }),
        }),
        tag: None,
        stdin: Some(true),
    };
    let Ok(mut winch) = signal(SignalKind::window_change()) else {
        return fail("cannot install the SIGWINCH handler", EXIT_SANDCELL);
    };
    let stream = match envd.start(&request).await {
        Ok(s) => s,
        Err(e) => return start_failed(target, &args.id, &cmd, &e),
    };
    let raw = match term::RawMode::enter(0) {
        Ok(raw) => raw,
        Err(e) => {
            return fail(
                &format!("cannot put the terminal in raw mode: {e}"),
                EXIT_SANDCELL,
            );
        }
    };
    let outcome = pty_session(&envd, stream, &mut winch).await;
    // The terminal is ours again before anything more is printed.
    drop(raw);
    match outcome {
        Ok(status) => status,
        Err((e, false)) => start_failed(target, &args.id, &cmd, &e),
        Err((e, true)) => lost(target, &args.id, &e),
    }
}

/// Relays keys and output until the shell ends: its shell status, or the error and whether
/// the process had started.
async fn pty_session(
    envd: &Envd,
    mut stream: ProcessStream,
    winch: &mut tokio::signal::unix::Signal,
) -> Result<i32, (ClientError, bool)> {
    let mut out = Sink::new(tokio::io::stdout());
    let mut pid: Option<u32> = None;
    let mut keys = None;
    let result = loop {
        tokio::select! {
            event = stream.next() => match event {
                Some(Ok(message)) => match message.event {
                    Event::Start(start) => {
                        pid = Some(start.pid);
                        keys = Some(tokio::spawn(forward_keys(envd.clone(), start.pid)));
                    }
                    Event::Data(data) => match decode_data(&data) {
                        Ok((_, bytes)) => out.write(&bytes).await,
                        Err(e) => break Err((e, pid.is_some())),
                    },
                    Event::End(end) => break Ok(end.shell_status()),
                    Event::Keepalive(_) => {}
                },
                Some(Err(e)) => break Err((e, pid.is_some())),
                None => break Err((
                    ClientError::Body("the process stream ended without an end event".into()),
                    pid.is_some(),
                )),
            },
            _ = winch.recv() => {
                if let (Some(pid), Some((cols, rows))) = (pid, term::size(0)) {
                    let envd = envd.clone();
                    tokio::spawn(async move { envd.resize(pid, cols, rows).await });
                }
            }
        }
    };
    if let Some(task) = keys {
        task.abort();
    }
    out.flush().await;
    result
}

/// Our keys to the PTY. Our stdin reaching EOF (the terminal hung up) ends the shell's
/// input; the shell sees it as a hangup of its own terminal only when it exits.
async fn forward_keys(envd: Envd, pid: u32) {
    let Ok(mut input) = envd.stream_input(pid, true) else {
        return;
    };
    if copy_input(&mut tokio::io::stdin(), &mut input).await {
        let _ = input.finish().await;
    }
}
