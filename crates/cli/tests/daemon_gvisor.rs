//! The client commands (`create`, `ls`, `exec`, `shell`, `cp`, `kill`) of the real `sandcell`
//! binary against a real `sandcell serve` on loopback (gvisor runtime, its own data and run
//! dirs, the installed `minimal` image linked in). Needs root, runsc and `make images
//! install` ($SANDCELL_DATA_DIR or /var/lib/sandcell); fails loudly without them. The
//! `shell` test drives a pseudo-terminal with python3.
//!
//! The commands find the daemon by `SANDCELL_URL` and, unless a test says otherwise, the key
//! by reading the daemon's `admin.key` through `--data-dir` (the root-on-the-same-host
//! path). `HOME` and `SANDCELL_CONFIG` point into the test's temp dir, so no user config
//! is read.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

mod common;
use common::{Daemon, text};

fn start() -> Daemon {
    Daemon::start("sc-clid", &[])
}

/// What these tests ask of the daemon beyond the shared helper.
trait DaemonExt {
    fn create(&self) -> String;
    fn leftovers(&self) -> Vec<String>;
}

impl DaemonExt for Daemon {
    fn create(&self) -> String {
        self.ok(&["create", "--template", "minimal", "--timeout", "120"])
            .trim()
            .to_string()
    }

    /// Sandbox directories left in the run dir.
    fn leftovers(&self) -> Vec<String> {
        std::fs::read_dir(self.tmp.path().join("run"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[test]
fn create_ls_exec_kill() {
    let d = start();
    let created = d.ok(&[
        "create",
        "--template",
        "minimal",
        "--metadata",
        "suite=cli",
        "--env",
        "FROM_CREATE=yes",
        "--json",
    ]);
    let created: serde_json::Value = serde_json::from_str(&created).unwrap();
    let id = created["sandboxID"].as_str().unwrap().to_string();
    assert_eq!(created["templateID"], "minimal");
    let other = d.create();

    // ls: the table, and JSON filtered by metadata and state.
    let table = d.ok(&["ls"]);
    assert!(table.starts_with("SANDBOX ID"), "{table}");
    assert!(table.contains(&id) && table.contains(&other), "{table}");
    let listed: serde_json::Value =
        serde_json::from_str(&d.ok(&["ls", "--json", "--metadata", "suite=cli"])).unwrap();
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sandboxID"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [id.as_str()]);
    assert_eq!(listed[0]["metadata"]["suite"], "cli");
    let running: serde_json::Value =
        serde_json::from_str(&d.ok(&["ls", "--json", "--state", "running"])).unwrap();
    assert_eq!(running.as_array().unwrap().len(), 2);
    let paused: serde_json::Value =
        serde_json::from_str(&d.ok(&["ls", "--json", "--state", "paused"])).unwrap();
    assert_eq!(paused, serde_json::json!([]));

    // exec: stdout and stderr apart, exit status, env from create and per command.
    let out = d.run(&[
        "exec",
        &id,
        "-e",
        "PER=cmd",
        "--",
        "sh",
        "-c",
        "echo out $FROM_CREATE $PER; echo err >&2; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(text(&out.stdout), "out yes cmd\n");
    assert_eq!(text(&out.stderr), "err\n");
    // User and working directory.
    let out = d.ok(&[
        "exec",
        &id,
        "--user",
        "user",
        "--cwd",
        "/tmp",
        "--",
        "sh",
        "-c",
        "id -un; pwd",
    ]);
    assert_eq!(out, "user\n/tmp\n");
    assert_eq!(
        d.ok(&["exec", &id, "--user", "root", "--", "id", "-u"]),
        "0\n"
    );
    // A signal ends it: 128 + n.
    let out = d.run(&["exec", &id, "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15));
    // No such command: 127 and a message.
    let out = d.run(&["exec", &id, "--", "/no/such/command"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        text(&out.stderr).contains("cannot run"),
        "{}",
        text(&out.stderr)
    );

    // stdin: forwarded when it is not a terminal, EOF closes it.
    let mut child = d
        .cmd(&["exec", &id, "--", "sh", "-c", "wc -c; echo done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = vec![b'x'; 300 * 1024];
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout).split_whitespace().collect::<Vec<_>>(),
        ["307200", "done"]
    );
    // /dev/null on stdin: EOF at once.
    assert_eq!(d.ok(&["exec", &id, "--", "cat"]), "");

    // kill: both go; the list is empty; a second kill says so.
    assert_eq!(d.ok(&["kill", &id, &other]), format!("{id}\n{other}\n"));
    let listed: serde_json::Value = serde_json::from_str(&d.ok(&["ls", "--json"])).unwrap();
    assert_eq!(listed, serde_json::json!([]));
    assert_eq!(
        d.leftovers(),
        Vec::<String>::new(),
        "killed sandboxes leave nothing"
    );
    let out = d.run(&["kill", &id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(&format!("no sandbox {id}")));
    let out = d.run(&["exec", &id, "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("sandcell ls"),
        "{}",
        text(&out.stderr)
    );
}

fn random_file(path: &Path, len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    let mut urandom = std::fs::File::open("/dev/urandom").unwrap();
    std::io::Read::read_exact(&mut urandom, &mut data).unwrap();
    std::fs::write(path, &data).unwrap();
    data
}

#[test]
fn cp_streams_both_ways_intact() {
    let d = start();
    let id = d.create();
    let local = d.tmp.path().join("five.bin");
    let data = random_file(&local, 5 * 1024 * 1024);
    let local_s = local.to_str().unwrap();

    d.ok(&["cp", local_s, &format!("{id}:/tmp/in/five.bin")]);
    let size = d.ok(&["exec", &id, "--", "wc", "-c", "/tmp/in/five.bin"]);
    assert!(size.starts_with("5242880 "), "{size}");
    // Into a directory: under the source's name.
    d.ok(&["cp", local_s, &format!("{id}:/tmp/")]);
    let back = d.tmp.path().join("back.bin");
    d.ok(&["cp", &format!("{id}:/tmp/five.bin"), back.to_str().unwrap()]);
    assert!(
        std::fs::read(&back).unwrap() == data,
        "the copy back differs"
    );
    // Out into a directory, and the in-sandbox copy made above.
    let dir = d.tmp.path().join("out");
    std::fs::create_dir(&dir).unwrap();
    d.ok(&[
        "cp",
        &format!("{id}:/tmp/in/five.bin"),
        dir.to_str().unwrap(),
    ]);
    assert!(std::fs::read(dir.join("five.bin")).unwrap() == data);
    // No partial files left beside the destinations.
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["five.bin"]);

    // `-`: stdin in, stdout out; as another user (the file is theirs).
    let mut child = d
        .cmd(&[
            "cp",
            "--user",
            "user",
            "-",
            &format!("{id}:/home/user/s.txt"),
        ])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"via stdin\n")
        .unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(
        d.ok(&["cp", &format!("{id}:/home/user/s.txt"), "-"]),
        "via stdin\n"
    );
    assert_eq!(
        d.ok(&["exec", &id, "--", "stat", "-c", "%U", "/home/user/s.txt"]),
        "user\n"
    );

    // A missing file: an error, and no local file made.
    let missing = d.tmp.path().join("missing");
    let out = d.run(&["cp", &format!("{id}:/tmp/nope"), missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("/tmp/nope"),
        "{}",
        text(&out.stderr)
    );
    assert!(!missing.exists());
    let out = d.run(&["cp", local_s, back.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "two local paths are refused");
    let out = d.run(&["cp", dir.to_str().unwrap(), &format!("{id}:/tmp/d")]);
    assert_eq!(out.status.code(), Some(2), "a directory is refused");
    assert!(
        text(&out.stderr).contains("is a directory"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn errors_say_what_to_do() {
    let d = start();
    // A port nothing listens on (bound, then closed).
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let out = d
        .cmd(&["ls"])
        .env("SANDCELL_URL", format!("http://{closed}"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("no daemon at http://{closed}")) && err.contains("sandcell serve"),
        "{err}"
    );

    let out = d
        .cmd(&["ls"])
        .env("SANDCELL_API_KEY", format!("e2b_{}", "0".repeat(40)))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("refused the API key from $SANDCELL_API_KEY"),
        "{err}"
    );

    // No key anywhere: says where keys come from.
    let out = d
        .cmd(&["ls"])
        .env("SANDCELL_DATA_DIR", d.tmp.path().join("elsewhere"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("SANDCELL_API_KEY") && err.contains("config.toml"),
        "{err}"
    );

    let out = d.run(&["exec", "sc-0000000000000000", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("no sandbox sc-0000000000000000"),
        "{}",
        text(&out.stderr)
    );

    // The config file: url and key from it (the environment names neither).
    let key = std::fs::read_to_string(d.data().join("admin.key")).unwrap();
    let config = d.tmp.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "# test\nurl = \"{}\"\napi_key = \"{}\"\n",
            d.url,
            key.trim()
        ),
    )
    .unwrap();
    let out = d
        .cmd(&["ls", "--json"])
        .env_remove("SANDCELL_URL")
        .env("SANDCELL_DATA_DIR", d.tmp.path().join("elsewhere"))
        .env("SANDCELL_CONFIG", &config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap(),
        serde_json::json!([])
    );
    std::fs::write(&config, "url = http://x\n").unwrap();
    let out = d
        .cmd(&["ls"])
        .env("SANDCELL_CONFIG", &config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("line 1"),
        "{}",
        text(&out.stderr)
    );
}

/// Drives `sandcell shell` on a pseudo-terminal: a command, a resize, `exit 7`.
const PTY_DRIVER: &str = r##"
import os, pty, select, signal, struct, sys, termios, fcntl, time
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
seen = b""
def pump(wait):
    # Reads what is there; answers cursor-position queries as a terminal does (busybox
    # ash asks before its first prompt).
    global seen
    if not select.select([fd], [], [], wait)[0]:
        return True
    try:
        data = os.read(fd, 4096)
    except OSError:
        return False
    if not data:
        return False
    if b"\x1b[6n" in data:
        os.write(fd, b"\x1b[1;1R")
    seen += data
    return True
def until(token):
    end = time.time() + 60
    while time.time() < end and token not in seen and pump(0.5):
        pass
    if token not in seen:
        sys.exit("never saw %r in %r" % (token, seen))
until(b"# ")
os.write(fd, b"stty size; echo M$((40+2))\r")
until(b"M42")
fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
os.kill(pid, signal.SIGWINCH)
# The resize travels on its own call: ask until the shell sees it.
for _ in range(60):
    os.write(fd, b"stty size\r")
    end = time.time() + 0.5
    while time.time() < end and pump(0.1):
        pass
    if b"40 120" in seen:
        break
until(b"40 120")
os.write(fd, b"exit 7\r")
end = time.time() + 60
while time.time() < end and pump(0.5):
    pass
_, status = os.waitpid(pid, 0)
sys.stdout.write(seen.decode(errors="replace"))
sys.exit(100 + os.waitstatus_to_exitcode(status))
"##;

#[test]
fn shell_is_an_interactive_pty() {
    let d = start();
    let id = d.create();
    let driver = d.tmp.path().join("drive.py");
    std::fs::write(&driver, PTY_DRIVER).unwrap();
    let out = Command::new("python3")
        .arg(&driver)
        .arg(env!("CARGO_BIN_EXE_sandcell"))
        // As root, so the prompt the driver waits for is `# ` (the default user is `user`).
        .args(["shell", "-u", "root", &id])
        .env("SANDCELL_URL", &d.url)
        .env("SANDCELL_DATA_DIR", d.data())
        .env("SANDCELL_CONFIG", d.tmp.path().join("no-config.toml"))
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .output()
        .expect("python3 is needed to drive a pseudo-terminal");
    let seen = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(107),
        "the shell's exit status comes back; driver stderr: {}; terminal: {seen}",
        text(&out.stderr)
    );
    assert!(seen.contains("30 100"), "initial size: {seen}");
    assert!(seen.contains("40 120"), "resized: {seen}");

    // Without a terminal it refuses, and says what to use.
    let out = d.run(&["shell", &id]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("sandcell exec"),
        "{}",
        text(&out.stderr)
    );
}
