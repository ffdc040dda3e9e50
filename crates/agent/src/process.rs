//! The processes the agent started: spawning (own process group, piped output, optional stdin
//! pipe) and the table that `SendInput`, `CloseStdin` and `SendSignal` look pids up in.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};

use sandcell_proto::agent::StartRequest;
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use crate::reaper::{ExitKind, Reaper};

/// PATH for processes when neither the request nor the agent's environment has one (as PID 1
/// the kernel gives the agent no PATH).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the process command is empty")]
    EmptyCommand,
    #[error("working directory {path}: {reason}")]
    Cwd { path: String, reason: String },
    #[error("starting {cmd:?}: {source}")]
    Spawn { cmd: String, source: io::Error },
    #[error("setting up the pipes of process {pid}: {source}")]
    Pipe { pid: u32, source: io::Error },
}

impl StartError {
    /// The Connect error code the client sees.
    pub fn code(&self) -> &'static str {
        match self {
            StartError::EmptyCommand | StartError::Cwd { .. } => "invalid_argument",
            StartError::Spawn { source, .. } => match source.kind() {
                io::ErrorKind::NotFound => "not_found",
                io::ErrorKind::PermissionDenied => "permission_denied",
                _ => "internal",
            },
            StartError::Pipe { .. } => "internal",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("no process with pid {0}")]
    NotFound(u32),
    #[error("process {0} was not started with stdin, or its stdin is closed")]
    NoStdin(u32),
    #[error("writing to the stdin of process {pid}: {source}")]
    Stdin { pid: u32, source: io::Error },
    #[error("sending signal {sig} to the process group of {pid}: {source}")]
    Signal {
        pid: u32,
        sig: i32,
        source: io::Error,
    },
}

impl ProcessError {
    pub fn code(&self) -> &'static str {
        match self {
            ProcessError::NotFound(_) => "not_found",
            ProcessError::NoStdin(_) => "failed_precondition",
            ProcessError::Stdin { .. } | ProcessError::Signal { .. } => "internal",
        }
    }
}

/// What the table keeps per running process.
#[derive(Debug)]
struct Entry {
    stdin: tokio::sync::Mutex<Option<pipe::Sender>>,
}

/// A freshly started process: its output pipes and its exit, for the stream that reports them.
#[derive(Debug)]
pub struct Running {
    pub pid: u32,
    pub stdout: pipe::Receiver,
    pub stderr: pipe::Receiver,
    pub exit: oneshot::Receiver<ExitKind>,
}

#[derive(Debug)]
pub struct Processes {
    reaper: Arc<Reaper>,
    table: Mutex<HashMap<u32, Arc<Entry>>>,
}

impl Processes {
    pub fn new(reaper: Arc<Reaper>) -> Self {
        Processes {
            reaper,
            table: Mutex::new(HashMap::new()),
        }
    }

    fn table(&self) -> MutexGuard<'_, HashMap<u32, Arc<Entry>>> {
        // Single inserts/removes: a poisoned map is still consistent.
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn entry(&self, pid: u32) -> Result<Arc<Entry>, ProcessError> {
        self.table()
            .get(&pid)
            .cloned()
            .ok_or(ProcessError::NotFound(pid))
    }

    pub fn start(&self, req: &StartRequest) -> Result<Running, StartError> {
        let cfg = &req.process;
        if cfg.cmd.is_empty() {
            return Err(StartError::EmptyCommand);
        }
        let mut cmd = Command::new(&cfg.cmd);
        cmd.args(&cfg.args);
        if std::env::var_os("PATH").is_none() && !cfg.envs.contains_key("PATH") {
            // Set on the Command, so std also uses it to look the program up.
            cmd.env("PATH", DEFAULT_PATH);
        }
        cmd.envs(&cfg.envs);
        if let Some(cwd) = cfg.cwd.as_deref().filter(|c| !c.is_empty()) {
            check_cwd(cwd)?;
            cmd.current_dir(cwd);
        }
        let want_stdin = req.stdin.unwrap_or(false);
        cmd.stdin(if want_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group, so a signal reaches the children of a shell too.
        .process_group(0);

        let (mut child, pid, exit) = self
            .reaper
            .spawn_registered(|| {
                let child = cmd.spawn()?;
                let pid = child.id() as i32;
                Ok((child, pid))
            })
            .map_err(|source| StartError::Spawn {
                cmd: cfg.cmd.clone(),
                source,
            })?;
        let pid = pid as u32;
        // The std Child is only a bag of pipes from here on: the reaper owns the wait, and
        // dropping a std Child neither waits nor kills.
        let pipe_err = |source| StartError::Pipe { pid, source };
        let stdout = child
            .stdout
            .take()
            .map(OwnedFd::from)
            .ok_or_else(|| pipe_err(missing_pipe()))?;
        let stderr = child
            .stderr
            .take()
            .map(OwnedFd::from)
            .ok_or_else(|| pipe_err(missing_pipe()))?;
        let stdin = match child.stdin.take() {
            Some(fd) => Some(pipe::Sender::from_owned_fd(OwnedFd::from(fd)).map_err(pipe_err)?),
            None => None,
        };
        let running = Running {
            pid,
            stdout: pipe::Receiver::from_owned_fd(stdout).map_err(pipe_err)?,
            stderr: pipe::Receiver::from_owned_fd(stderr).map_err(pipe_err)?,
            exit,
        };
        self.table().insert(
            pid,
            Arc::new(Entry {
                stdin: tokio::sync::Mutex::new(stdin),
            }),
        );
        Ok(running)
    }

    /// Forgets a process once its end has been reported.
    pub fn finished(&self, pid: u32) {
        self.table().remove(&pid);
    }

    pub async fn send_input(&self, pid: u32, data: &[u8]) -> Result<(), ProcessError> {
        let entry = self.entry(pid)?;
        let mut stdin = entry.stdin.lock().await;
        let pipe = stdin.as_mut().ok_or(ProcessError::NoStdin(pid))?;
        pipe.write_all(data)
            .await
            .map_err(|source| ProcessError::Stdin { pid, source })
    }

    pub async fn close_stdin(&self, pid: u32) -> Result<(), ProcessError> {
        let entry = self.entry(pid)?;
        // Dropping the sender closes our end: the process reads EOF.
        entry.stdin.lock().await.take();
        Ok(())
    }

    pub fn signal(&self, pid: u32, sig: i32) -> Result<(), ProcessError> {
        self.entry(pid)?;
        let pgid = libc::pid_t::try_from(pid).map_err(|_| ProcessError::NotFound(pid))?;
        // SAFETY: kill(2) with a negative pid signals the process group we created at spawn
        // (the entry exists, so the leader has not been reaped and the group id is ours).
        if unsafe { libc::kill(-pgid, sig) } < 0 {
            let source = io::Error::last_os_error();
            if source.raw_os_error() == Some(libc::ESRCH) {
                // The whole group is gone; its end is about to be reported.
                return Err(ProcessError::NotFound(pid));
            }
            return Err(ProcessError::Signal { pid, sig, source });
        }
        Ok(())
    }
}

fn missing_pipe() -> io::Error {
    io::Error::other("std did not return a requested pipe")
}

fn check_cwd(cwd: &str) -> Result<(), StartError> {
    let reason = match std::fs::metadata(Path::new(cwd)) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => "not a directory".to_owned(),
        Err(e) => e.to_string(),
    };
    Err(StartError::Cwd {
        path: cwd.to_owned(),
        reason,
    })
}
