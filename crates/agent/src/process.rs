//! The processes the agent started: spawning (as the request's user, in their own process
//! group or, with a PTY, their own session), and the table that `Connect`, `List`, `Update`,
//! `SendInput`, `StreamInput`, `CloseStdin` and `SendSignal` look processes up in, by pid or
//! by tag. Exits are remembered for [`RETAIN_EXIT`] so a late `Connect` still learns them.

use sandcell_proto::sync::lock;
use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sandcell_proto::agent::process::{ProcessInfo, ProcessSelector, StartRequest};
use sandcell_proto::agent::{EndEvent, ProcessConfig};
use tokio::io::AsyncWriteExt;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::sync::oneshot;

use crate::hub::Hub;
use crate::pty::{self, PtyError};
use crate::reaper::{ExitKind, Reaper};
use crate::users::User;

/// PATH for processes when the agent's environment has none (as PID 1 the kernel gives the
/// agent no PATH) and the request sets none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long the end of an exited process stays available to `Connect` (envd: 30 s).
pub const RETAIN_EXIT: Duration = Duration::from_secs(30);
/// Bound on remembered exits, so a fork bomb of short processes cannot grow the list.
const MAX_RETAINED: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the process command is empty")]
    EmptyCommand,
    #[error("cwd '{path}': {reason}")]
    Cwd { path: String, reason: String },
    #[error("starting {cmd:?}: {source}")]
    Spawn { cmd: String, source: io::Error },
    #[error("setting up the pipes of process {pid}: {source}")]
    Pipe { pid: u32, source: io::Error },
    #[error("error starting pty: {0}")]
    Pty(#[from] PtyError),
    #[error("an environment variable or argument contains a NUL byte")]
    Nul,
}

impl StartError {
    /// The Connect error code the client sees.
    pub fn code(&self) -> &'static str {
        match self {
            StartError::EmptyCommand | StartError::Cwd { .. } | StartError::Nul => {
                "invalid_argument"
            }
            StartError::Spawn { source, .. } => match source.kind() {
                io::ErrorKind::NotFound => "not_found",
                io::ErrorKind::PermissionDenied => "permission_denied",
                _ => "internal",
            },
            StartError::Pipe { .. } | StartError::Pty(_) => "internal",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("process with {0} not found")]
    NotFound(String),
    #[error("the process selector names neither a pid nor a tag")]
    NoSelector,
    #[error("process {0} was not started with stdin, or its stdin is closed")]
    NoStdin(u32),
    #[error("process {0} has a tty: input goes to the pty, not stdin (send 0x04 for EOF)")]
    HasPty(u32),
    #[error("process {0} has no tty: input goes to stdin, and it cannot be resized")]
    NoPty(u32),
    #[error("writing to the input of process {pid}: {source}")]
    Input { pid: u32, source: io::Error },
    #[error("sending signal {sig} to the process group of {pid}: {source}")]
    Signal {
        pid: u32,
        sig: i32,
        source: io::Error,
    },
    #[error("error resizing tty: {0}")]
    Resize(#[from] PtyError),
}

impl ProcessError {
    pub fn code(&self) -> &'static str {
        match self {
            ProcessError::NotFound(_) => "not_found",
            // envd answers unimplemented for a selector of no known kind.
            ProcessError::NoSelector => "unimplemented",
            ProcessError::NoStdin(_) | ProcessError::HasPty(_) | ProcessError::NoPty(_) => {
                "failed_precondition"
            }
            ProcessError::Input { .. } | ProcessError::Signal { .. } | ProcessError::Resize(_) => {
                "internal"
            }
        }
    }
}

/// What the table keeps per running process.
#[derive(Debug)]
pub struct Entry {
    pub pid: u32,
    pub tag: Option<String>,
    pub config: ProcessConfig,
    pub hub: Arc<Hub>,
    stdin: tokio::sync::Mutex<Option<pipe::Sender>>,
    pty: Option<Arc<AsyncFd<OwnedFd>>>,
}

/// Where a process's output comes from.
#[derive(Debug)]
pub enum Output {
    Pipes {
        stdout: pipe::Receiver,
        stderr: pipe::Receiver,
    },
    Pty(Arc<AsyncFd<OwnedFd>>),
}

/// A freshly started process, for the task that pumps its output into its hub.
#[derive(Debug)]
pub struct Running {
    pub entry: Arc<Entry>,
    pub output: Output,
    pub exit: oneshot::Receiver<ExitKind>,
    /// `Connect-Timeout-Ms` of the Start request: the process is killed when it elapses.
    pub timeout: Option<Duration>,
}

/// Everything [`Processes::start`] needs besides the request.
#[derive(Debug)]
pub struct Launch<'a> {
    pub req: &'a StartRequest,
    pub user: &'a User,
    /// The default env vars (`/init`'s and the agent's), under the request's own.
    pub default_env: BTreeMap<String, String>,
    pub cwd: PathBuf,
    pub timeout: Option<Duration>,
}

#[derive(Debug)]
struct Retained {
    pid: u32,
    tag: Option<String>,
    end: EndEvent,
    until: Instant,
}

#[derive(Debug)]
pub struct Processes {
    reaper: Arc<Reaper>,
    table: Mutex<HashMap<u32, Arc<Entry>>>,
    retained: Mutex<Vec<Retained>>,
}

impl Processes {
    pub fn new(reaper: Arc<Reaper>) -> Self {
        Processes {
            reaper,
            table: Mutex::new(HashMap::new()),
            retained: Mutex::new(Vec::new()),
        }
    }

    /// The running process a selector names (by tag: the first match, as envd).
    pub fn lookup(&self, sel: &ProcessSelector) -> Result<Arc<Entry>, ProcessError> {
        let table = lock(&self.table);
        match (sel.pid, &sel.tag) {
            (Some(pid), _) => table
                .get(&pid)
                .cloned()
                .ok_or_else(|| ProcessError::NotFound(format!("pid {pid}"))),
            (None, Some(tag)) => table
                .values()
                .find(|e| e.tag.as_deref() == Some(tag.as_str()))
                .cloned()
                .ok_or_else(|| ProcessError::NotFound(format!("tag {tag}"))),
            (None, None) => Err(ProcessError::NoSelector),
        }
    }

    /// The pid and remembered end of a process that exited in the last [`RETAIN_EXIT`].
    pub fn retained_end(&self, sel: &ProcessSelector) -> Option<(u32, EndEvent)> {
        let mut retained = lock(&self.retained);
        let now = Instant::now();
        retained.retain(|r| r.until > now);
        retained
            .iter()
            .find(|r| match (sel.pid, &sel.tag) {
                (Some(pid), _) => r.pid == pid,
                (None, Some(tag)) => r.tag.as_deref() == Some(tag.as_str()),
                (None, None) => false,
            })
            .map(|r| (r.pid, r.end.clone()))
    }

    pub fn list(&self) -> Vec<ProcessInfo> {
        let mut list: Vec<ProcessInfo> = lock(&self.table)
            .values()
            .map(|e| ProcessInfo {
                config: e.config.clone(),
                pid: e.pid,
                tag: e.tag.clone(),
            })
            .collect();
        list.sort_by_key(|p| p.pid);
        list
    }

    pub fn start(&self, launch: Launch<'_>) -> Result<Running, StartError> {
        let req = launch.req;
        let cfg = &req.process;
        if cfg.cmd.is_empty() {
            return Err(StartError::EmptyCommand);
        }
        check_cwd(&launch.cwd)?;
        let mut cmd = Command::new(&cfg.cmd);
        cmd.args(&cfg.args).current_dir(&launch.cwd).env_clear();
        // envd passes only its own PATH through, then the user's identity, the defaults and
        // the request's variables, later ones winning.
        let path = std::env::var("PATH").unwrap_or_else(|_| DEFAULT_PATH.to_owned());
        cmd.env("PATH", path)
            .env("HOME", &launch.user.home)
            .env("USER", &launch.user.name)
            .env("LOGNAME", &launch.user.name)
            .env("PWD", &launch.cwd)
            .envs(&launch.default_env)
            .envs(&cfg.envs);

        let creds = Credentials::for_user(launch.user);
        let pty_pair = match &req.pty {
            Some(p) => {
                let size = p.size.unwrap_or_default();
                let pair = pty::open(clamp_u16(size.cols), clamp_u16(size.rows))?;
                let stdio = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
                let spawn_err = |source| StartError::Spawn {
                    cmd: cfg.cmd.clone(),
                    source,
                };
                cmd.stdin(stdio(&pair.slave).map_err(spawn_err)?)
                    .stdout(stdio(&pair.slave).map_err(spawn_err)?)
                    .stderr(stdio(&pair.slave).map_err(spawn_err)?);
                if let Some(c) = &creds {
                    // The user owns their terminal, as login(1) arranges.
                    // SAFETY: fchown on a descriptor we own; -1 keeps the group.
                    unsafe { libc::fchown(pair.slave.as_raw_fd(), c.uid, libc::gid_t::MAX) };
                }
                Some(pair)
            }
            None => {
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
                None
            }
        };
        let with_pty = pty_pair.is_some();
        // SAFETY: the closure only makes async-signal-safe syscalls (setsid, ioctl,
        // setgroups, setgid, setuid) on data prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if with_pty {
                    pty::make_controlling_terminal()?;
                }
                if let Some(c) = &creds {
                    c.apply()?;
                }
                Ok(())
            });
        }

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
        // The Command holds the parent's copies of the pty slave: close them, or the master
        // never sees the end of the child's output.
        drop(cmd);
        let pid = pid as u32;
        let pipe_err = |source| StartError::Pipe { pid, source };

        let (output, stdin, pty_master) = match pty_pair {
            Some(pair) => {
                drop(pair.slave);
                let master = Arc::new(pty::async_fd(pair.master).map_err(pipe_err)?);
                (Output::Pty(master.clone()), None, Some(master))
            }
            None => {
                // The std Child is only a bag of pipes from here on: the reaper owns the
                // wait, and dropping a std Child neither waits nor kills.
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
                    Some(fd) => {
                        Some(pipe::Sender::from_owned_fd(OwnedFd::from(fd)).map_err(pipe_err)?)
                    }
                    None => None,
                };
                let output = Output::Pipes {
                    stdout: pipe::Receiver::from_owned_fd(stdout).map_err(pipe_err)?,
                    stderr: pipe::Receiver::from_owned_fd(stderr).map_err(pipe_err)?,
                };
                (output, stdin, None)
            }
        };
        let entry = Arc::new(Entry {
            pid,
            tag: req.tag.clone(),
            config: cfg.clone(),
            hub: Hub::new(),
            stdin: tokio::sync::Mutex::new(stdin),
            pty: pty_master,
        });
        // A new process reusing a pid or a tag must not be answered with an old exit.
        lock(&self.retained).retain(|r| r.pid != pid && (req.tag.is_none() || r.tag != req.tag));
        lock(&self.table).insert(pid, entry.clone());
        Ok(Running {
            entry,
            output,
            exit,
            timeout: launch.timeout,
        })
    }

    /// Forgets a process once its end is known, remembering the end for late `Connect`s.
    pub fn finished(&self, entry: &Arc<Entry>, end: &EndEvent) {
        {
            let mut table = lock(&self.table);
            if table.get(&entry.pid).is_some_and(|e| Arc::ptr_eq(e, entry)) {
                table.remove(&entry.pid);
            }
        }
        let mut retained = lock(&self.retained);
        let now = Instant::now();
        retained.retain(|r| r.until > now);
        if retained.len() >= MAX_RETAINED {
            retained.remove(0);
        }
        retained.push(Retained {
            pid: entry.pid,
            tag: entry.tag.clone(),
            end: end.clone(),
            until: now + RETAIN_EXIT,
        });
    }

    pub fn signal(&self, sel: &ProcessSelector, sig: i32) -> Result<(), ProcessError> {
        let entry = self.lookup(sel)?;
        signal_group(entry.pid, sig)
    }
}

/// Signals the process group led by `pid` (its own group, or its session with a PTY).
pub fn signal_group(pid: u32, sig: i32) -> Result<(), ProcessError> {
    let pgid =
        libc::pid_t::try_from(pid).map_err(|_| ProcessError::NotFound(format!("pid {pid}")))?;
    // SAFETY: kill(2) with a negative pid signals the process group we created at spawn (the
    // entry exists, so the leader has not been reaped and the group id is still ours).
    if unsafe { libc::kill(-pgid, sig) } < 0 {
        let source = io::Error::last_os_error();
        if source.raw_os_error() == Some(libc::ESRCH) {
            // The whole group is gone; its end is about to be reported.
            return Err(ProcessError::NotFound(format!("pid {pid}")));
        }
        return Err(ProcessError::Signal { pid, sig, source });
    }
    Ok(())
}

impl Entry {
    pub async fn write_stdin(&self, data: &[u8]) -> Result<(), ProcessError> {
        let pid = self.pid;
        if self.pty.is_some() {
            return Err(ProcessError::HasPty(pid));
        }
        let mut stdin = self.stdin.lock().await;
        let pipe = stdin.as_mut().ok_or(ProcessError::NoStdin(pid))?;
        pipe.write_all(data)
            .await
            .map_err(|source| ProcessError::Input { pid, source })
    }

    pub async fn write_pty(&self, mut data: &[u8]) -> Result<(), ProcessError> {
        let pid = self.pid;
        let master = self.pty.as_ref().ok_or(ProcessError::NoPty(pid))?;
        let input_err = |source| ProcessError::Input { pid, source };
        while !data.is_empty() {
            let mut guard = master.writable().await.map_err(input_err)?;
            match guard.try_io(|fd| {
                // SAFETY: writing from a live slice to the master descriptor the AsyncFd owns.
                let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
                if n < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            }) {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) => return Err(input_err(e)),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    pub async fn close_stdin(&self) -> Result<(), ProcessError> {
        if self.pty.is_some() {
            return Err(ProcessError::HasPty(self.pid));
        }
        // Dropping the sender closes our end: the process reads EOF.
        self.stdin.lock().await.take();
        Ok(())
    }

    pub fn resize(&self, cols: u32, rows: u32) -> Result<(), ProcessError> {
        let master = self.pty.as_ref().ok_or(ProcessError::NoPty(self.pid))?;
        pty::resize(master.as_raw_fd(), clamp_u16(cols), clamp_u16(rows))?;
        Ok(())
    }
}

fn clamp_u16(v: u32) -> u16 {
    u16::try_from(v).unwrap_or(u16::MAX)
}

/// The identity a child switches to after fork, prepared before it (no allocation after).
#[derive(Debug, Clone)]
pub(crate) struct Credentials {
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
}

impl Credentials {
    /// Exactly this identity, switched to even when the agent already has it.
    pub(crate) fn new(uid: libc::uid_t, gid: libc::gid_t, groups: Vec<libc::gid_t>) -> Self {
        Credentials { uid, gid, groups }
    }

    /// `None` when the agent already runs as that user (nothing to switch, and switching
    /// would fail without privileges anyway).
    fn for_user(user: &User) -> Option<Self> {
        // SAFETY: geteuid/getegid cannot fail and touch no memory.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if euid == user.uid && egid == user.gid {
            return None;
        }
        Some(Credentials {
            uid: user.uid,
            gid: user.gid,
            groups: user.groups.clone(),
        })
    }

    /// In the child: groups, then gid, then uid (after setuid the others are not allowed).
    pub(crate) fn apply(&self) -> io::Result<()> {
        // SAFETY: async-signal-safe syscalls; `groups` is a live Vec prepared before fork.
        unsafe {
            if libc::setgroups(self.groups.len(), self.groups.as_ptr()) < 0
                || libc::setgid(self.gid) < 0
                || libc::setuid(self.uid) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

fn missing_pipe() -> io::Error {
    io::Error::other("std did not return a requested pipe")
}

fn check_cwd(cwd: &Path) -> Result<(), StartError> {
    let reason = match std::fs::metadata(cwd) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => "not a directory".to_owned(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => "does not exist".to_owned(),
        Err(e) => e.to_string(),
    };
    Err(StartError::Cwd {
        path: cwd.display().to_string(),
        reason,
    })
}

/// Refuses requests whose strings cannot reach execve.
pub fn check_nul(req: &StartRequest) -> Result<(), StartError> {
    let strings = std::iter::once(&req.process.cmd)
        .chain(&req.process.args)
        .chain(req.process.envs.keys())
        .chain(req.process.envs.values());
    for s in strings {
        if CString::new(s.as_bytes()).is_err() {
            return Err(StartError::Nul);
        }
    }
    Ok(())
}
