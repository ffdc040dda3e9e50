//! The agent's side of `sudo`: who may ask, what runs, and the threads that run it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use super::{
    Control, MAX_MESSAGE, MAX_REQUEST, Mode, Preserve, Reply, Request, SOCKET_NAME, socket,
};
use crate::process::Credentials;
use crate::reaper::{ExitKind, Reaper};
use crate::users::{Snapshot, User, UserDb, UserError};

/// Debian's `secure_path`: the PATH every command gets, whatever the caller's.
pub const SECURE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The group whose members may run anything (Debian's `%sudo ALL=(ALL:ALL) ALL`).
pub const SUDO_GROUP: &str = "sudo";

/// Sessions at once; more are refused, so a guest cannot make the agent spawn threads
/// without bound.
const MAX_SESSIONS: usize = 64;

/// How long a connected client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The caller's variables `env_reset` keeps (Debian's env_keep and env_check lists), besides
/// every `LC_*`.
const ENV_KEEP: &[&str] = &[
    "DISPLAY",
    "XAUTHORITY",
    "XAUTHORIZATION",
    "XDG_CURRENT_DESKTOP",
    "COLORS",
    "LS_COLORS",
    "PS1",
    "PS2",
    "HOSTNAME",
    "KRB5CCNAME",
    "TZ",
    "TERM",
    "COLORTERM",
    "LINGUAS",
    "LANG",
    "LANGUAGE",
];

#[derive(Debug, thiserror::Error)]
pub enum SudoError {
    #[error("{0} is not in the sudoers file")]
    NotAllowed(String),
    #[error("unknown user {0}")]
    UnknownUser(String),
    #[error("unknown group {0}")]
    UnknownGroup(String),
    #[error("{0}: command not found")]
    NotFound(String),
    #[error("{0}")]
    Users(#[from] UserError),
    #[error("malformed request: {0}")]
    BadRequest(String),
    #[error("unable to execute {program}: {source}")]
    Spawn { program: String, source: io::Error },
    #[error("the exit status of {0} was lost")]
    Lost(String),
}

/// What runs, as whom, where, with what: everything decided before the fork.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub program: PathBuf,
    pub argv0: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// Decides what a request runs, for the caller with this uid.
pub fn plan(req: &Request, caller_uid: u32, db: &Snapshot) -> Result<Plan, SudoError> {
    let caller = db.user_by_uid(caller_uid).ok();
    let caller_name = caller
        .as_ref()
        .map_or_else(|| format!("#{caller_uid}"), |u| u.name.clone());
    let in_sudo_group = match (&caller, db.group_gid(SUDO_GROUP)) {
        (Some(u), Some(gid)) => u.groups.contains(&gid),
        _ => false,
    };
    if caller_uid != 0 && !in_sudo_group {
        return Err(SudoError::NotAllowed(caller_name));
    }
    let target = lookup_user(db, req.user.as_deref().unwrap_or("root"))?;
    let gid = match req.group.as_deref() {
        None => target.gid,
        Some(g) => lookup_group(db, g)?,
    };
    // The primary group first, then the target's others (its own primary one among them).
    let mut groups = vec![gid];
    groups.extend(target.groups.iter().filter(|g| **g != gid));

    let caller_cwd = PathBuf::from(&req.cwd);
    let cwd = match (&req.chdir, req.mode) {
        (Some(dir), _) => caller_cwd.join(dir),
        (None, Mode::Login) => target.home.clone(),
        (None, _) => caller_cwd.clone(),
    };
    let (program, argv0, args) = match req.mode {
        Mode::Command => {
            let cmd = req
                .command
                .first()
                .ok_or_else(|| SudoError::BadRequest("no command".to_owned()))?;
            let program = resolve(cmd, &cwd).ok_or_else(|| SudoError::NotFound(cmd.clone()))?;
            (program, cmd.clone(), req.command[1..].to_vec())
        }
        Mode::Shell | Mode::Login => {
            let shell = match req.mode {
                // -s: the caller's $SHELL, as sudo; -i: the target's login shell.
                Mode::Shell => env_value(&req.env, "SHELL")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| target.shell.clone()),
                _ => target.shell.clone(),
            };
            let base = shell
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "sh".to_owned());
            let argv0 = if req.mode == Mode::Login {
                format!("-{base}")
            } else {
                shell.display().to_string()
            };
            let args = if req.command.is_empty() {
                Vec::new()
            } else {
                vec!["-c".to_owned(), shell_command(&req.command)]
            };
            (shell, argv0, args)
        }
    };
    let mut command_line = program.display().to_string();
    for a in &args {
        command_line.push(' ');
        command_line.push_str(a);
    }
    let env = environment(
        req,
        &target,
        &caller_name,
        caller_uid,
        caller.as_ref(),
        &command_line,
    );
    Ok(Plan {
        program,
        argv0,
        args,
        env,
        cwd,
        uid: target.uid,
        gid,
        groups,
    })
}

fn lookup_user(db: &Snapshot, name: &str) -> Result<User, SudoError> {
    let found = match name.strip_prefix('#') {
        Some(n) => n.parse().ok().map(|uid| db.user_by_uid(uid)),
        None => Some(db.user(name)),
    };
    match found {
        Some(Ok(u)) => Ok(u),
        _ => Err(SudoError::UnknownUser(name.to_owned())),
    }
}

fn lookup_group(db: &Snapshot, name: &str) -> Result<u32, SudoError> {
    let found = match name.strip_prefix('#') {
        Some(n) => n.parse().ok(),
        None => db.group_gid(name),
    };
    found.ok_or_else(|| SudoError::UnknownGroup(name.to_owned()))
}

fn env_value<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// sudo's environment: the caller's (all with `-E`, else env_keep and the named ones), then
/// the target's identity, `secure_path`, the `SUDO_*` variables, then `VAR=value` operands.
fn environment(
    req: &Request,
    target: &User,
    caller_name: &str,
    caller_uid: u32,
    caller: Option<&User>,
    command_line: &str,
) -> Vec<(String, String)> {
    let keep = |name: &str| match &req.preserve {
        Preserve::All => !name.starts_with("SUDO_"),
        Preserve::Default => ENV_KEEP.contains(&name) || name.starts_with("LC_"),
        Preserve::Names(names) => {
            ENV_KEEP.contains(&name) || name.starts_with("LC_") || names.iter().any(|n| n == name)
        }
    };
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: String| {
        env.retain(|(name, _)| name != k);
        env.push((k.to_owned(), v));
    };
    for (k, v) in &req.env {
        if keep(k) {
            set(k, v.clone());
        }
    }
    let all = req.preserve == Preserve::All;
    set("PATH", SECURE_PATH.to_owned());
    if !all || env_value(&req.env, "HOME").is_none() {
        set("HOME", target.home.display().to_string());
    }
    if !all || env_value(&req.env, "SHELL").is_none() {
        set("SHELL", target.shell.display().to_string());
    }
    set("USER", target.name.clone());
    set("LOGNAME", target.name.clone());
    set("MAIL", format!("/var/mail/{}", target.name));
    set("SUDO_COMMAND", command_line.to_owned());
    set("SUDO_USER", caller_name.to_owned());
    set("SUDO_UID", caller_uid.to_string());
    set("SUDO_GID", caller.map_or(caller_uid, |u| u.gid).to_string());
    for (k, v) in &req.set_env {
        set(k, v.clone());
    }
    env
}

/// The `-c` string sudo builds for `-i`/`-s` with a command: every character but letters,
/// digits, `_`, `-` and `$` escaped with a backslash, arguments joined by spaces.
pub fn shell_command(command: &[String]) -> String {
    let mut out = String::new();
    for (i, arg) in command.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        for c in arg.chars() {
            if !(c.is_alphanumeric() || c == '_' || c == '-' || c == '$') {
                out.push('\\');
            }
            out.push(c);
        }
    }
    out
}

/// A command name as sudo finds it: a path as given (relative to `cwd`), else the first
/// executable file of that name in `secure_path`.
fn resolve(cmd: &str, cwd: &Path) -> Option<PathBuf> {
    if cmd.is_empty() {
        return None;
    }
    if cmd.contains('/') {
        return Some(cwd.join(cmd));
    }
    SECURE_PATH
        .split(':')
        .map(|dir| Path::new(dir).join(cmd))
        .find(|p| is_executable(p))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Binds the service's socket and serves it on a thread of its own. An error (the name taken,
/// no abstract sockets) leaves the agent without the service, not without its API.
pub fn start(reaper: Arc<Reaper>, users: UserDb) -> io::Result<()> {
    let listener = socket::listen(SOCKET_NAME, 64)?;
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("sudo-listen".to_owned())
        .spawn(move || {
            loop {
                match socket::accept(&listener) {
                    Ok(conn) => admit(conn, &reaper, &users, &active),
                    Err(e) => {
                        crate::log!("sudo: accepting a connection: {e}");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        })?;
    Ok(())
}

/// Decrements the session count when a session thread ends, however it ends.
struct SessionSlot(Arc<AtomicUsize>);

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn admit(conn: OwnedFd, reaper: &Arc<Reaper>, users: &UserDb, active: &Arc<AtomicUsize>) {
    if active.fetch_add(1, Ordering::SeqCst) >= MAX_SESSIONS {
        active.fetch_sub(1, Ordering::SeqCst);
        let busy = Reply::Error(format!("too many sudo sessions (at most {MAX_SESSIONS})"));
        send_reply(&conn, &busy);
        return;
    }
    let slot = SessionSlot(active.clone());
    let (reaper, users) = (reaper.clone(), users.clone());
    let spawned = std::thread::Builder::new()
        .name("sudo-session".to_owned())
        .spawn(move || {
            let _slot = slot;
            let reply =
                session(&conn, &reaper, &users).unwrap_or_else(|e| Reply::Error(e.to_string()));
            send_reply(&conn, &reply);
        });
    if let Err(e) = spawned {
        crate::log!("sudo: starting a session thread: {e}");
    }
}

fn send_reply(conn: &OwnedFd, reply: &Reply) {
    if let Ok(bytes) = serde_json::to_vec(reply) {
        // The client may be gone (killed): nothing to tell then.
        let _ = socket::send(conn.as_raw_fd(), &bytes, &[]);
    }
}

/// One request: check it, run it, wait for its end while forwarding the client's signals.
fn session(conn: &OwnedFd, reaper: &Reaper, users: &UserDb) -> Result<Reply, SudoError> {
    let bad = |what: &str| SudoError::BadRequest(what.to_owned());
    socket::set_recv_timeout(conn.as_raw_fd(), REQUEST_TIMEOUT)
        .map_err(|e| SudoError::BadRequest(format!("setting a timeout: {e}")))?;
    let msg = socket::recv(conn.as_raw_fd(), MAX_REQUEST)
        .map_err(|e| SudoError::BadRequest(format!("reading it: {e}")))?
        .ok_or_else(|| bad("the client closed before sending it"))?;
    if msg.truncated {
        return Err(bad("larger than the service reads"));
    }
    let (_, uid, _) = msg.creds.ok_or_else(|| bad("no credentials attached"))?;
    let [stdin, stdout, stderr]: [OwnedFd; 3] = msg
        .fds
        .try_into()
        .map_err(|_| bad("it must carry exactly stdin, stdout and stderr"))?;
    let req: Request =
        serde_json::from_slice(&msg.data).map_err(|e| SudoError::BadRequest(e.to_string()))?;
    let plan = plan(&req, uid, &users.snapshot()?)?;
    // No deadline from here on (a command runs as long as it runs), and before the signal
    // forwarder's first recv: one begun under the request's 10 s timeout would end in EAGAIN.
    socket::set_recv_timeout(conn.as_raw_fd(), Duration::ZERO)
        .map_err(|e| SudoError::BadRequest(format!("clearing the timeout: {e}")))?;

    let name = plan.program.display().to_string();
    let mut cmd = Command::new(&plan.program);
    cmd.arg0(&plan.argv0)
        .args(&plan.args)
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&plan.cwd)
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));
    let creds = Credentials::new(plan.uid, plan.gid, plan.groups.clone());
    // SAFETY: the closure only makes async-signal-safe syscalls (setsid, setgroups, setgid,
    // setuid) on data prepared before the fork. A session of its own: the caller's session
    // keeps its terminal, and the command's process group is ours to signal.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            creds.apply()
        });
    }
    let (_child, pid, exit) = reaper
        .spawn_registered(|| {
            let child = cmd.spawn()?;
            let pid = child.id() as i32;
            Ok((child, pid))
        })
        .map_err(|source| SudoError::Spawn {
            program: name.clone(),
            source,
        })?;
    // The Command holds the caller's descriptors: the command's ends must be its only ones.
    drop(cmd);

    let ended = Arc::new(AtomicBool::new(false));
    let forwarder = conn.try_clone().ok().and_then(|control| {
        let ended = ended.clone();
        std::thread::Builder::new()
            .name("sudo-signals".to_owned())
            .spawn(move || forward_signals(&control, pid, &ended))
            .ok()
    });
    let status = exit.blocking_recv();
    ended.store(true, Ordering::SeqCst);
    // Wakes the forwarder from its recv; the reply still goes out on the socket.
    if let Some(f) = forwarder {
        socket::shutdown_read(conn.as_raw_fd());
        let _ = f.join();
    }
    match status {
        Ok(ExitKind::Exited(code)) => Ok(Reply::Exit(code)),
        Ok(ExitKind::Signaled(sig)) => Ok(Reply::Signal(sig)),
        Err(_) => Err(SudoError::Lost(name)),
    }
}

/// Passes the client's signals to the command's process group until the command ends; a
/// client that goes away (killed, its terminal closed) hangs the command up, as a terminal
/// would.
fn forward_signals(conn: &OwnedFd, pgid: i32, ended: &AtomicBool) {
    loop {
        let msg = socket::recv(conn.as_raw_fd(), MAX_MESSAGE);
        if ended.load(Ordering::SeqCst) {
            return;
        }
        let (sig, client_gone) = match msg {
            Ok(Some(m)) => match serde_json::from_slice::<Control>(&m.data) {
                Ok(Control::Signal(sig)) if (1..=64).contains(&sig) => (sig, false),
                _ => continue,
            },
            // EINTR, or a timeout the socket should not have (see `session`): not an end.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) =>
            {
                continue;
            }
            Ok(None) | Err(_) => (libc::SIGHUP, true),
        };
        // SAFETY: kill on the command's process group (the session leader's pid); the group
        // outlives the leader while any member runs, and its id is not reused before then.
        unsafe { libc::kill(-pgid, sig) };
        if client_gone {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> (tempfile::TempDir, Snapshot) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("passwd"),
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/bash\n\
             guest:x:1001:1001::/home/guest:\n",
        )
        .expect("passwd");
        std::fs::write(
            dir.path().join("group"),
            "root:x:0:\nsudo:x:27:user\nuser:x:1000:\nguest:x:1001:\n",
        )
        .expect("group");
        let snap = UserDb::new(dir.path()).snapshot().expect("snapshot");
        (dir, snap)
    }

    fn request(command: &[&str]) -> Request {
        Request {
            user: None,
            group: None,
            mode: Mode::Command,
            command: command.iter().map(|s| s.to_string()).collect(),
            preserve: Preserve::Default,
            set_env: Vec::new(),
            env: vec![
                ("PATH".into(), "/home/user/bin:/usr/bin".into()),
                ("HOME".into(), "/home/user".into()),
                ("TERM".into(), "xterm".into()),
                ("LC_ALL".into(), "C.UTF-8".into()),
                ("SECRET".into(), "s".into()),
                ("SUDO_USER".into(), "forged".into()),
            ],
            cwd: "/tmp".into(),
            chdir: None,
        }
    }

    fn env<'a>(plan: &'a Plan, name: &str) -> Option<&'a str> {
        env_value(&plan.env, name)
    }

    #[test]
    fn only_root_and_the_sudo_group_may_ask() {
        let (_d, db) = db();
        assert!(plan(&request(&["true"]), 1000, &db).is_ok());
        assert!(plan(&request(&["true"]), 0, &db).is_ok());
        let refused = plan(&request(&["true"]), 1001, &db);
        assert!(
            matches!(refused, Err(SudoError::NotAllowed(ref n)) if n == "guest"),
            "{refused:?}"
        );
        // Not in passwd at all: refused, by number.
        assert!(
            matches!(plan(&request(&["true"]), 4242, &db), Err(SudoError::NotAllowed(ref n)) if n == "#4242")
        );
    }

    #[test]
    fn a_command_runs_as_root_with_sudo_s_environment() {
        let (_d, db) = db();
        let p = plan(&request(&["true", "-x"]), 1000, &db).expect("plan");
        assert_eq!((p.uid, p.gid, p.groups.clone()), (0, 0, vec![0]));
        assert!(
            p.program.ends_with("true") && p.program.is_absolute(),
            "{:?}",
            p.program
        );
        assert_eq!(
            (p.argv0.as_str(), p.args.clone()),
            ("true", vec!["-x".to_owned()])
        );
        assert_eq!(p.cwd, PathBuf::from("/tmp"));
        assert_eq!(env(&p, "PATH"), Some(SECURE_PATH));
        assert_eq!(env(&p, "HOME"), Some("/root"));
        assert_eq!(env(&p, "USER"), Some("root"));
        assert_eq!(env(&p, "TERM"), Some("xterm"));
        assert_eq!(env(&p, "LC_ALL"), Some("C.UTF-8"));
        assert_eq!(env(&p, "SECRET"), None);
        assert_eq!(env(&p, "SUDO_USER"), Some("user"));
        assert_eq!(
            (env(&p, "SUDO_UID"), env(&p, "SUDO_GID")),
            (Some("1000"), Some("1000"))
        );
        assert_eq!(p.env.iter().filter(|(k, _)| k == "SUDO_USER").count(), 1);
    }

    #[test]
    fn preserve_env_set_env_and_groups() {
        let (_d, db) = db();
        let mut r = request(&["env"]);
        r.preserve = Preserve::All;
        r.set_env = vec![("FOO".into(), "bar".into())];
        let p = plan(&r, 1000, &db).expect("plan");
        assert_eq!(env(&p, "SECRET"), Some("s"));
        assert_eq!(env(&p, "HOME"), Some("/home/user"));
        assert_eq!(env(&p, "PATH"), Some(SECURE_PATH));
        assert_eq!(env(&p, "SUDO_USER"), Some("user"));
        assert_eq!(env(&p, "FOO"), Some("bar"));
        r.preserve = Preserve::Names(vec!["SECRET".into()]);
        r.user = Some("#1001".into());
        r.group = Some("sudo".into());
        let p = plan(&r, 0, &db).expect("plan");
        assert_eq!(env(&p, "SECRET"), Some("s"));
        assert_eq!((p.uid, p.gid, p.groups.clone()), (1001, 27, vec![27, 1001]));
        assert_eq!(
            env(&p, "SHELL"),
            Some("/bin/sh"),
            "an empty passwd shell is /bin/sh"
        );
        r.user = Some("nobody-here".into());
        assert!(matches!(plan(&r, 0, &db), Err(SudoError::UnknownUser(_))));
        r.user = None;
        r.group = Some("nogroup-here".into());
        assert!(matches!(plan(&r, 0, &db), Err(SudoError::UnknownGroup(_))));
    }

    #[test]
    fn login_and_shell_modes_build_sudo_s_c_string() {
        let (_d, db) = db();
        let mut r = request(&["echo", "a b", "$HOME;x"]);
        r.mode = Mode::Login;
        r.user = Some("user".into());
        let p = plan(&r, 0, &db).expect("plan");
        assert_eq!(p.program, PathBuf::from("/bin/bash"));
        assert_eq!(p.argv0, "-bash");
        assert_eq!(p.args, ["-c", "echo a\\ b $HOME\\;x"]);
        assert_eq!(p.cwd, PathBuf::from("/home/user"));
        r.mode = Mode::Shell;
        r.command.clear();
        r.env.push(("SHELL".into(), "/bin/dash".into()));
        let p = plan(&r, 0, &db).expect("plan");
        assert_eq!(
            (p.program.clone(), p.argv0.as_str()),
            (PathBuf::from("/bin/dash"), "/bin/dash")
        );
        assert!(p.args.is_empty());
        assert_eq!(p.cwd, PathBuf::from("/tmp"));
    }

    #[test]
    fn commands_are_found_in_secure_path_only() {
        let (_d, db) = db();
        let r = request(&["no-such-command-anywhere"]);
        assert!(
            matches!(plan(&r, 0, &db), Err(SudoError::NotFound(ref c)) if c == "no-such-command-anywhere")
        );
        let mut r = request(&["./run.sh"]);
        r.chdir = Some("sub".into());
        let p = plan(&r, 0, &db).expect("plan");
        assert_eq!(p.program, PathBuf::from("/tmp/sub/./run.sh"));
        assert_eq!(p.cwd, PathBuf::from("/tmp/sub"));
    }
}
