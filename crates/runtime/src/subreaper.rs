//! The daemon as a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER)`), reaping the orphans
//! runsc leaves.
//!
//! Why: runsc's sandbox and gofer processes outlive the runsc command that started them
//! (`runsc restore --detach`, a `runsc run` that exits before them), so they are re-parented.
//! Without a subreaper they go to the host's init, which in containers and some VMs reaps
//! late; `runsc delete` and `runsc wait` poll until the pid is gone, and a zombie is not
//! gone: fork and pause waited 1.2-1.7 s for init on the build machines. As a subreaper the
//! daemon gets them and reaps them at once.
//!
//! What is reaped, and why not everything: a `waitpid(-1)` loop would also take the exit
//! statuses of the daemon's own `tokio::process` / `std::process` children, whose owners
//! then get ECHILD (std even panics when it cannot wait for a child whose exec failed).
//! So the reaper never waits on a pid it did not make sure is an orphan. Linux records no
//! "original parent", but the orphans are told apart by their name (`comm`, which a zombie
//! keeps): runsc re-executes itself through `/proc/self/exe` for the sandbox, the gofer and
//! its helpers, so they are named `exe`; the console writers (capped_log.rs) name
//! themselves [`LOG_WRITER_COMM`]. The daemon itself never executes a program of either
//! name, so none of its own children is ever taken. A zombie of another name stays until
//! its owner waits for it (tokio on SIGCHLD, as ever).
//!
//! When: on every SIGCHLD (tokio's signal driver fans the signal out to every listener, so
//! this coexists with tokio's own child reaping) and every [`BACKSTOP`], since signals
//! coalesce.

use std::io;
use std::time::Duration;

/// The `comm` of runsc's re-executed processes (sandbox, gofer, helpers).
const RUNSC_EXEC_COMM: &str = "exe";
/// The `comm` the console writers give themselves (capped_log.rs), at most 15 bytes.
pub const LOG_WRITER_COMM: &str = "sandcell-log";
/// A scan even without a SIGCHLD (signals coalesce; one may be missed between scans).
const BACKSTOP: Duration = Duration::from_secs(1);

/// Makes this process the subreaper of its descendants.
pub fn become_subreaper() -> io::Result<()> {
    set_subreaper(true)
}

/// Turns this process's subreaper flag on or off (off: later orphans go to init again;
/// benchmarks compare the two in one process).
pub fn set_subreaper(on: bool) -> io::Result<()> {
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER takes an integer flag and touches no
    // memory of ours.
    if unsafe {
        libc::prctl(
            libc::PR_SET_CHILD_SUBREAPER,
            libc::c_ulong::from(on),
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reaps orphaned runsc processes and console writers for as long as the runtime runs.
/// Call after [`become_subreaper`], from within a tokio runtime.
pub fn spawn_reaper() -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut sigchld = match signal(SignalKind::child()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("subreaper: no SIGCHLD handler ({e}); scanning every {BACKSTOP:?}");
                None
            }
        };
        loop {
            let reaped = reap_orphans();
            if reaped > 0 {
                tracing::debug!("subreaper: reaped {reaped} orphan(s)");
            }
            match &mut sigchld {
                Some(s) => {
                    let _ = tokio::time::timeout(BACKSTOP, s.recv()).await;
                }
                None => tokio::time::sleep(BACKSTOP).await,
            }
        }
    })
}

/// Reaps every zombie child of ours that is an orphan we adopted (see the module docs);
/// returns how many.
pub fn reap_orphans() -> usize {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut reaped = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<libc::pid_t>().ok())
        else {
            continue;
        };
        // Bounded: /proc/PID/stat is one line the kernel writes.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if is_adopted_zombie(&stat, me) {
            let mut status = 0;
            // SAFETY: waitpid on one pid with WNOHANG writes only `status`; the pid is a
            // zombie child of ours that nobody in this process waits for (module docs).
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                reaped += 1;
            }
        }
    }
    reaped
}

/// Whether a `/proc/PID/stat` line is a zombie whose parent is `me` and whose name is one
/// of the orphans' (module docs).
fn is_adopted_zombie(stat: &str, me: u32) -> bool {
    // `pid (comm) state ppid ...`; comm may hold spaces and parentheses: the last ')' ends it.
    let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
        return false;
    };
    let comm = &stat[open + 1..close];
    let mut rest = stat[close + 1..].split_whitespace();
    let (Some(state), Some(ppid)) = (rest.next(), rest.next()) else {
        return false;
    };
    state == "Z"
        && ppid.parse::<u32>().ok() == Some(me)
        && (comm == RUNSC_EXEC_COMM || comm == LOG_WRITER_COMM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_adopted_names_of_our_zombies_are_taken() {
        assert!(is_adopted_zombie("12 (exe) Z 100 1 1 0", 100));
        assert!(is_adopted_zombie("12 (sandcell-log) Z 100 1 1", 100));
        // Ours but alive, another parent's, or a name our own children have.
        assert!(!is_adopted_zombie("12 (exe) S 100 1 1", 100));
        assert!(!is_adopted_zombie("12 (exe) Z 101 1 1", 100));
        assert!(!is_adopted_zombie("12 (runsc) Z 100 1 1", 100));
        assert!(!is_adopted_zombie("12 (nft) Z 100 1 1", 100));
        // A name with ") Z 100" inside it is still parsed from the last ')'.
        assert!(!is_adopted_zombie("12 (x) Z 100 (y) S 100 1", 100));
        assert!(!is_adopted_zombie("garbage", 100));
    }

    /// A grandchild orphaned to us (we are its subreaper) is reaped; a direct child is not,
    /// its status stays for its owner's wait.
    #[test]
    fn reaps_an_orphan_but_not_our_own_child() {
        // Runs in its own process: the subreaper flag is per process and the test binary
        // runs other tests' children.
        // SAFETY: fork in a test; the child only makes syscalls and _exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: in the forked child; only syscalls, then _exit.
            unsafe {
                let ok = become_subreaper().is_ok() && orphan_then_own_child_checked();
                libc::_exit(if ok { 0 } else { 1 });
            }
        }
        let mut status = 0;
        // SAFETY: our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{status}"
        );
    }

    /// In the forked test process: a middle child forks a `sandcell-log`-named grandchild
    /// and exits; the grandchild exits and must be reaped by [`reap_orphans`]. Then a direct
    /// child under another name must be left for our own waitpid.
    unsafe fn orphan_then_own_child_checked() -> bool {
        // SAFETY: only syscalls in the children.
        unsafe {
            let name = c"sandcell-log";
            let middle = libc::fork();
            if middle == 0 {
                let grandchild = libc::fork();
                if grandchild == 0 {
                    libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0);
                    libc::usleep(100_000);
                    libc::_exit(0);
                }
                libc::_exit(if grandchild > 0 { 0 } else { 1 });
            }
            let mut status = 0;
            if libc::waitpid(middle, &mut status, 0) != middle {
                return false;
            }
            let mut reaped = 0;
            for _ in 0..200 {
                reaped += reap_orphans();
                if reaped > 0 {
                    break;
                }
                libc::usleep(10_000);
            }
            if reaped != 1 {
                return false;
            }
            // A direct child under another name (as every child the daemon spawns has):
            // its zombie stays, with its status, for our own waitpid.
            let own = libc::fork();
            if own == 0 {
                libc::prctl(libc::PR_SET_NAME, c"runsc".as_ptr(), 0, 0, 0);
                libc::_exit(7);
            }
            libc::usleep(100_000);
            let _ = reap_orphans();
            let mut status = 0;
            libc::waitpid(own, &mut status, 0) == own
                && libc::WIFEXITED(status)
                && libc::WEXITSTATUS(status) == 7
        }
    }
}
