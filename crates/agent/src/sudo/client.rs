//! `sudo` itself, inside the sandbox: the agent binary run by the name `sudo`.

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStringExt;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};

use super::args::{self, Action};
use super::service::SUDO_GROUP;
use super::{Control, MAX_MESSAGE, Reply, Request, SOCKET_NAME, socket};
use crate::users::UserDb;

/// The real sudo, for where the service does not run (setuid works there).
const SYSTEM_SUDO: &str = "/usr/bin/sudo";

/// The write end of the self-pipe the signal handler writes to (-1 before it exists). A
/// static because a signal handler can reach nothing else.
static SIGNAL_PIPE: AtomicI32 = AtomicI32::new(-1);

/// The signals passed on to the command (what a terminal or `kill` sends a foreground job).
const FORWARDED: &[libc::c_int] = &[
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("sudo: {msg}");
    ExitCode::FAILURE
}

/// Runs `sudo ARGS` (the arguments after the program name).
pub fn main(argv: Vec<String>) -> ExitCode {
    let action = match args::parse(&argv) {
        Ok(a) => a,
        Err(usage) => {
            eprintln!("{usage}");
            return ExitCode::FAILURE;
        }
    };
    let conn = match socket::connect(SOCKET_NAME) {
        Ok(c) => c,
        Err(_) => return exec_system_sudo(&argv),
    };
    match action {
        Action::Help => {
            println!(
                "sudo - execute a command as another user (Sandcell's sudo service)\n\n{}",
                args::USAGE
            );
            ExitCode::SUCCESS
        }
        Action::Version => {
            println!(
                "Sudo version 1.9 (Sandcell's sudo service: the sandbox's agent runs the command)"
            );
            ExitCode::SUCCESS
        }
        Action::Nothing => ExitCode::SUCCESS,
        Action::List => list(),
        Action::Run(parsed) => {
            let env = std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect();
            let cwd = match std::env::current_dir() {
                Ok(d) => d.display().to_string(),
                Err(e) => return fail(format_args!("unable to read the current directory: {e}")),
            };
            let req = Request {
                user: parsed.user,
                group: parsed.group,
                mode: parsed.mode,
                command: parsed.command,
                preserve: parsed.preserve,
                set_env: parsed.set_env,
                env,
                cwd,
                chdir: parsed.chdir,
            };
            match run(&conn, &req) {
                Ok(code) => code,
                Err(e) => fail(format_args!("talking to the sandbox's sudo service: {e}")),
            }
        }
    }
}

/// `sudo -l`, from the same rule the service applies.
fn list() -> ExitCode {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let Ok(db) = UserDb::new("/etc").snapshot() else {
        return fail("unable to read /etc/passwd");
    };
    let user = db.user_by_uid(uid).ok();
    let name = user
        .as_ref()
        .map_or_else(|| format!("#{uid}"), |u| u.name.clone());
    let allowed = uid == 0
        || matches!((&user, db.group_gid(SUDO_GROUP)), (Some(u), Some(g)) if u.groups.contains(&g));
    if allowed {
        println!("User {name} may run the following commands:\n    (ALL : ALL) NOPASSWD: ALL");
        ExitCode::SUCCESS
    } else {
        fail(format_args!("{name} is not in the sudoers file"))
    }
}

fn exec_system_sudo(argv: &[String]) -> ExitCode {
    // A system sudo that is this binary again would loop (same file: same device and inode).
    if is_this_program(SYSTEM_SUDO) {
        return fail(format_args!(
            "the sandbox's sudo service is not running, and {SYSTEM_SUDO} is this program too"
        ));
    }
    let mut cargs: Vec<CString> = Vec::with_capacity(argv.len() + 1);
    for a in std::iter::once("sudo").chain(argv.iter().map(String::as_str)) {
        match CString::new(a) {
            Ok(c) => cargs.push(c),
            Err(_) => return fail("an argument holds a NUL byte"),
        }
    }
    let Ok(path) = CString::new(SYSTEM_SUDO) else {
        return fail("bad system sudo path");
    };
    let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: path and every argument are NUL-terminated CStrings alive across the call; the
    // array is null-terminated. execv returns only on failure.
    unsafe { libc::execv(path.as_ptr(), ptrs.as_ptr()) };
    let e = io::Error::last_os_error();
    fail(format_args!(
        "the sandbox's sudo service is not running, and {SYSTEM_SUDO} cannot run: {e}"
    ))
}

fn is_this_program(path: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata("/proc/self/exe"), std::fs::metadata(path)) {
        (Ok(me), Ok(other)) => me.dev() == other.dev() && me.ino() == other.ino(),
        _ => false,
    }
}

/// Makes sure fds 0-2 are open (a closed one becomes /dev/null), as sudo does.
fn ensure_stdio() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only queries the descriptor.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            // SAFETY: open of a constant path; the lowest free descriptor is `fd`.
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        }
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = SIGNAL_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        let byte = sig as u8;
        // SAFETY: write(2) is async-signal-safe; one byte from the stack.
        unsafe { libc::write(fd, (&raw const byte).cast(), 1) };
    }
}

fn signal_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills a two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    use std::os::fd::FromRawFd;
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn install_handlers(write_end: RawFd) {
    SIGNAL_PIPE.store(write_end, Ordering::Relaxed);
    for &sig in FORWARDED {
        // SAFETY: a handler that only calls write(2); SA_RESTART keeps poll's caller simple.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as usize;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&raw mut action.sa_mask);
            libc::sigaction(sig, &raw const action, std::ptr::null_mut());
        }
    }
}

/// Sends the request with fds 0-2 and waits for the command's end, passing signals on.
fn run(conn: &OwnedFd, req: &Request) -> io::Result<ExitCode> {
    ensure_stdio();
    let (read_end, write_end) = signal_pipe()?;
    install_handlers(write_end.as_raw_fd());
    let bytes = serde_json::to_vec(req).map_err(io::Error::other)?;
    socket::send(conn.as_raw_fd(), &bytes, &[0, 1, 2])?;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: conn.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: read_end.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll over a live two-element array.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[1].revents & libc::POLLIN != 0 {
            let mut sigs = [0u8; 64];
            // SAFETY: read into a live buffer of its length; the pipe is non-blocking.
            let n =
                unsafe { libc::read(read_end.as_raw_fd(), sigs.as_mut_ptr().cast(), sigs.len()) };
            for &sig in sigs.iter().take(n.max(0) as usize) {
                let msg = serde_json::to_vec(&Control::Signal(i32::from(sig)))
                    .map_err(io::Error::other)?;
                // The command may have just ended: its reply comes next.
                let _ = socket::send(conn.as_raw_fd(), &msg, &[]);
            }
        }
        if fds[0].revents != 0 {
            let Some(msg) = socket::recv(conn.as_raw_fd(), MAX_MESSAGE)? else {
                return Err(io::Error::other(
                    "the service closed the connection without an answer",
                ));
            };
            let reply: Reply = serde_json::from_slice(&msg.data).map_err(io::Error::other)?;
            return Ok(finish(reply));
        }
    }
}

/// Ends as the command did: its exit status, or the signal that killed it.
fn finish(reply: Reply) -> ExitCode {
    match reply {
        Reply::Exit(code) => ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1)),
        Reply::Signal(sig) => {
            // SAFETY: default disposition, then the same signal to ourselves (as sudo does);
            // a signal whose default is not to terminate falls through to 128 + sig.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
            ExitCode::from(u8::try_from((128 + sig) & 0xff).unwrap_or(1))
        }
        Reply::Error(msg) => fail(msg),
    }
}

/// The arguments after the program name, as strings (a non-UTF-8 one is refused by sudo's
/// parser as a bad operand, here as an error).
pub fn arguments() -> Result<Vec<String>, OsString> {
    std::env::args_os()
        .skip(1)
        .map(|a| String::from_utf8(a.into_vec()).map_err(|e| OsString::from_vec(e.into_bytes())))
        .collect()
}
