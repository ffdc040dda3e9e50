"""The unmodified E2B Python SDK (registry package `e2b`) against a bare agent, in the SDK's
debug mode (no control plane: envd at http://localhost:49983, envd version 99.99.99).
Run by run-e2b-smoke.sh; every check asserts."""
import os
import tempfile
import time

os.environ["E2B_DEBUG"] = "true"
os.environ.setdefault("E2B_API_KEY", "e2b_00")
from e2b import CommandExitException, PtySize, Sandbox  # noqa: E402

base = tempfile.mkdtemp(prefix="e2b-smoke-")
sbx = Sandbox.create()
assert sbx.is_running()

r = sbx.commands.run("echo hello-$FOO; echo err >&2", envs={"FOO": "bar"})
assert (r.stdout, r.stderr, r.exit_code) == ("hello-bar\n", "err\n", 0), r
try:
    sbx.commands.run("exit 3")
    raise AssertionError("exit 3 did not raise")
except CommandExitException as e:
    assert e.exit_code == 3

sbx.files.write(f"{base}/x/hello.txt", "content!")
assert sbx.files.read(f"{base}/x/hello.txt") == "content!"
assert sbx.files.exists(f"{base}/x/hello.txt") and not sbx.files.exists(f"{base}/nope")
assert [e.name for e in sbx.files.list(f"{base}/x")] == ["hello.txt"]
info = sbx.files.get_info(f"{base}/x/hello.txt")
assert (info.name, info.size, info.permissions) == ("hello.txt", 8, "-rw-r--r--"), info
sbx.files.make_dir(f"{base}/d")
sbx.files.rename(f"{base}/x/hello.txt", f"{base}/d/h2.txt")
assert sbx.files.exists(f"{base}/d/h2.txt")
sbx.files.remove(f"{base}/d")
assert not sbx.files.exists(f"{base}/d")

h = sbx.commands.run("read x; echo got $x", background=True, stdin=True)
assert any(p.pid == h.pid for p in sbx.commands.list())
sbx.commands.send_stdin(h.pid, "abc\n")
assert h.wait().stdout == "got abc\n"

w = sbx.files.watch_dir(base)
sbx.files.write(f"{base}/w.txt", "w")
time.sleep(0.3)
events = {(e.name, e.type.name) for e in w.get_new_events()}
w.stop()
assert ("w.txt", "CREATE") in events and ("w.txt", "WRITE") in events, events

out = []
pty = sbx.pty.create(PtySize(rows=24, cols=80))
sbx.pty.resize(pty.pid, PtySize(rows=33, cols=90))
sbx.pty.send_stdin(pty.pid, b"stty size; exit\n")
pty.wait(on_pty=lambda d: out.append(d))
assert b"33 90" in b"".join(out), out
print("e2b SDK smoke: ok")
