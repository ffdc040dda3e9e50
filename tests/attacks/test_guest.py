"""Attacks of a hostile guest on the host (gvisor runtime): through the agent directory the
host shares with it (`/run/sandcell-host`), through its console, through snapshots, and
through the resources it shares with other tenants' sandboxes.

- Symlinks planted at the host's marker name during a snapshot: the host never writes
  through them (no file of the guest's choosing appears on the host, an existing one keeps
  its contents).
- 300 MB written to the agent's stdout (`/proc/1/fd/1`): the host's console log stays under
  its cap.
- A Unix socket bound in the agent directory, created again and again during a snapshot:
  the snapshot (and a pause) is refused with a 409 naming the cause, and the sandbox runs
  on, answering, as it was.
- A fork bomb and a memory hog in one sandbox: another sandbox keeps answering.
- A user outside group `sudo` at the agent's sudo service (forged root credentials, no
  descriptors, garbage, 100 held connections): no root, and sudo works for `user` after.
"""

import os
import time
import uuid

import httpx
import pytest

CONSOLE_CAP = 4 << 20  # sandcell_runtime::capped_log::CONSOLE_LOG_CAP


def _root(sbx, cmd, timeout=120):
    return sbx.commands.run(cmd, user="root", timeout=timeout)


def _answers(sbx):
    out = sbx.commands.run("echo alive", timeout=60)
    assert out.stdout.strip() == "alive", f"the sandbox no longer answers: {out}"


def test_links_planted_at_the_hosts_marker_name_are_not_written_through(env, api, sandbox):
    """The host writes `agent.resume` in the guest's agent directory around every checkpoint.
    The guest keeps pointing that name at a host file to create and at one to truncate.
    (Fighting over the markers can break the guest's own agent, and so its own sandbox: that
    is the guest's loss only; the conftest checks that the daemon and tenant B are fine.)"""
    sbx = sandbox(env["key_a"])
    tmp = os.path.abspath(os.path.join(env["data_dir"], ".."))
    pwned = os.path.join(tmp, f"PWNED-{uuid.uuid4().hex[:8]}")
    victim = os.path.join(tmp, f"victim-{uuid.uuid4().hex[:8]}")
    with open(victim, "w") as f:
        f.write("precious")
    try:
        sbx.commands.run(
            f"sh -c 'while :; do ln -sfn {pwned} /run/sandcell-host/agent.resume; "
            f"ln -sfn {victim} /run/sandcell-host/agent.resume; done' >/dev/null 2>&1",
            user="root", background=True,
        )
        time.sleep(1)
        for _ in range(2):
            r = api(env["key_a"]).post(f"/sandboxes/{sbx.sandbox_id}/snapshots", json={})
            # Taken or refused: either way nothing on the host is written through a link.
            assert r.status_code < 600, r.text
            assert not os.path.lexists(pwned), "the host created the file the guest named"
            with open(victim) as f:
                assert f.read() == "precious", "the host wrote through the guest's link"
    finally:
        for p in (pwned, victim):
            if os.path.lexists(p):
                os.remove(p)


def test_a_guest_flooding_its_console_leaves_a_capped_host_log(env, sandbox):
    sbx = sandbox(env["key_a"])
    out = _root(sbx, "dd if=/dev/zero bs=1M count=300 of=/proc/1/fd/1 2>&1; "
                     "echo flood-done >/proc/1/fd/1", timeout=600)
    assert out.exit_code == 0, out
    log = os.path.join(env["run_dir"], sbx.sandbox_id, "console.log")
    size = 0
    for _ in range(300):
        try:
            with open(log, "rb") as f:
                data = f.read()
        except FileNotFoundError:  # a moment while it rotates
            data = b""
        size = len(data)
        if data.endswith(b"flood-done\n"):
            break
        time.sleep(0.1)
    assert size <= CONSOLE_CAP, f"console.log grew to {size} bytes (cap {CONSOLE_CAP})"
    total = sum(os.path.getsize(os.path.join(os.path.dirname(log), n))
                for n in os.listdir(os.path.dirname(log)) if n.startswith("console.log"))
    assert total <= 2 * CONSOLE_CAP, f"console logs hold {total} bytes"
    _answers(sbx)


BIND_LOOP = """
import os, socket, time
socks = []
i = 0
while True:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind("/run/sandcell-host/evil%d.sock" % i)
        s.listen(1)
        socks.append(s)
    except OSError:
        pass
    i += 1
    time.sleep(0.05)
"""


@pytest.mark.parametrize("op", ["snapshots", "pause"])
def test_a_socket_bound_in_the_agent_dir_fails_the_checkpoint_and_the_sandbox_runs_on(
    env, api, sandbox, op
):
    sbx = sandbox(env["key_a"])
    sbx.files.write("/tmp/bind.py", BIND_LOOP)
    sbx.commands.run("python3 /tmp/bind.py >/dev/null 2>&1", user="root", background=True)
    _root(sbx, "for i in $(seq 100); do ls /run/sandcell-host | grep -q evil && exit 0; "
               "sleep 0.1; done; exit 1")
    _root(sbx, "echo kept > /tmp/state")
    r = api(env["key_a"]).post(f"/sandboxes/{sbx.sandbox_id}/{op}", json={})
    assert r.status_code == 409, f"{op}: {r.status_code} {r.text}"
    assert "evil" in r.text and "socket" in r.text, f"the answer names no cause: {r.text}"
    # It runs on, as it was.
    info = api(env["key_a"]).get(f"/sandboxes/{sbx.sandbox_id}")
    assert info.status_code == 200 and info.json().get("state") == "running", info.text
    _answers(sbx)
    assert _root(sbx, "cat /tmp/state").stdout == "kept\n"
    assert _root(sbx, "pgrep -f bind.py").exit_code == 0


def test_a_fork_bomb_and_a_memory_hog_leave_another_sandbox_answering(env, sandbox):
    victim = sandbox(env["key_b"])
    hostile = sandbox(env["key_a"])
    hostile.files.write("/tmp/hog.py", "b = []\nwhile True:\n    b.append(bytearray(16 << 20))\n")
    hostile.commands.run("python3 /tmp/hog.py >/dev/null 2>&1", background=True)
    hostile.commands.run("sh -c 'b() { b | b & }; b' >/dev/null 2>&1", background=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        started = time.time()
        _answers(victim)
        assert time.time() - started < 30, "the victim took over 30 s to answer"
        time.sleep(1)
    r = httpx.get(env["url"] + "/health", timeout=30)
    assert r.status_code == 200
    try:
        hostile.kill()
    except Exception:  # noqa: BLE001 - it may have been ended for its memory already
        pass


def test_writing_past_the_disk_is_enospc_and_the_sandbox_runs_on(env, api, sandbox):
    sbx = sandbox(env["key_a"])
    info = api(env["key_a"]).get(f"/sandboxes/{sbx.sandbox_id}").json()
    disk_mb = info.get("diskSizeMB", 0)
    if not disk_mb:
        pytest.skip("the daemon runs without `serve --disk-mib` (root writes live in memory)")
    df = _root(sbx, "df -m / | tail -1").stdout.split()
    assert abs(int(df[1]) - disk_mb) <= disk_mb // 10 + 16, f"df / says {df}, the API {disk_mb}"
    out = _root(sbx, f"dd if=/dev/zero of=/root/fill bs=1M count={disk_mb + 512} 2>&1; echo rc=$?",
                timeout=900)
    assert "No space left on device" in out.stdout, out.stdout
    _root(sbx, "rm -f /root/fill")
    _answers(sbx)


SUDO_ATTACK = r'''
import array, json, os, socket, struct
NAME = "\0sandcell-sudo"
REQ = json.dumps({"user": None, "group": None, "mode": "command", "command": ["id", "-u"],
                  "preserve": "default", "set_env": [], "env": [], "cwd": "/", "chdir": None}).encode()
FDS = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))]
import time
def conn():
    # gVisor answers EAGAIN while the listen backlog is full (Linux would block): retry.
    for _ in range(500):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            s.connect(NAME)
            return s
        except BlockingIOError:
            s.close()
            time.sleep(0.02)
    raise SystemExit("the service never accepted")
def answer(s):
    s.settimeout(30)
    return s.recv(4096).decode()
s = conn()
try:
    s.sendmsg([REQ], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("3i", os.getpid(), 0, 0))] + FDS)
    print("forged:", answer(s))
except PermissionError:
    print("forged: EPERM")
s = conn(); s.sendmsg([REQ], FDS); print("plain:", answer(s))
s = conn(); s.send(REQ); print("nofds:", answer(s))
s = conn(); s.sendmsg([b"\xff" * 1000], FDS); print("garbage:", answer(s))
held = [conn() for _ in range(100)]
print("flood:", answer(held[-1]))
for h in held:
    h.close()
'''


def test_the_sudo_service_gives_nothing_to_a_user_outside_the_sudo_group(env, sandbox):
    """On gVisor the agent (root, PID 1) runs `sudo` for the sandbox's users over an abstract
    socket. A user outside group `sudo` talks to it directly: forged root credentials, a
    plain request, one without descriptors, garbage, and 100 held connections. It gets no
    root, and `user`'s sudo still works afterwards."""
    if env["template"] != "base":
        pytest.skip("the attack runs python3 in base")
    sbx = sandbox(env["key_a"])
    _root(sbx, "useradd -M guest")
    sbx.files.write("/tmp/sudo_attack.py", SUDO_ATTACK)
    out = _root(sbx, "runuser -u guest -- python3 /tmp/sudo_attack.py").stdout
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert lines.get("forged") == "EPERM", out
    assert lines.get("plain") == '{"error":"guest is not in the sudoers file"}', out
    assert "malformed request" in lines.get("nofds", ""), out
    assert "malformed request" in lines.get("garbage", ""), out
    assert "too many sudo sessions" in lines.get("flood", ""), out
    # The held connections are closed: sessions end, and sudo works for `user` again.
    assert sbx.commands.run("sudo id -u", user="user", timeout=60).stdout == "0\n"
    assert _root(sbx, "runuser -u guest -- id -u").stdout == "1001\n"
    _answers(sbx)
