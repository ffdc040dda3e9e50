"""The registry `e2b` Python SDK's pause, connect (resume), snapshot and fork calls,
unmodified, against a real `sandcell serve` (run through tests/e2b/run.sh, environment as
test_sdk.py). gvisor: checkpoints are serialised host-wide and take seconds each.
"""

import os
import time

import httpx
import pytest

from e2b import Sandbox, SandboxNotFoundException, SandboxQuery, SandboxState

TEMPLATE = os.environ["SANDCELL_TEMPLATE"]
API_URL = os.environ["E2B_API_URL"]

WAKING = {"on_timeout": "pause", "auto_resume": True}

# Serves "awake" on port 8000: python3's server in `base`, busybox httpd in the fixture.
SERVE_8000 = (
    "mkdir -p /tmp/www && echo awake > /tmp/www/index.html && cd /tmp/www && "
    "if command -v python3 >/dev/null; then exec python3 -m http.server 8000; "
    "else exec httpd -f -p 8000 -h /tmp/www; fi"
)


def test_pause_then_connect_resumes_the_same_sandbox():
    sbx = Sandbox.create(template=TEMPLATE, timeout=120)
    try:
        sbx.files.write("/home/user/kept.txt", "before pause")
        sbx.commands.run("sleep 600", background=True)
        assert sbx.pause() is True
        assert sbx.pause() is False, "409: already paused"
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
        paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert [s.sandbox_id for s in paused] == [sbx.sandbox_id]
        running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items()
        assert sbx.sandbox_id not in [s.sandbox_id for s in running]

        same = Sandbox.connect(sbx.sandbox_id, timeout=120)
        assert same.sandbox_id == sbx.sandbox_id
        assert same.files.read("/home/user/kept.txt") == "before pause"
        assert "sleep 600" in same.commands.run("ps -eo args").stdout
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
        # Connecting to a running sandbox is fine too (200).
        assert Sandbox.connect(sbx.sandbox_id).commands.run("echo ok").stdout == "ok\n"
    finally:
        sbx.kill()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause(sbx.sandbox_id)


def test_auto_resume_wakes_a_paused_sandbox_for_its_ports_and_its_envd():
    # One sandbox woken by a port, another by a command (neither connected first).
    web = Sandbox.create(template=TEMPLATE, timeout=60, lifecycle=WAKING)
    cmd = Sandbox.create(template=TEMPLATE, timeout=60, lifecycle=WAKING)
    try:
        assert web.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
        web.commands.run(SERVE_8000, background=True)
        route = {"E2b-Sandbox-Id": web.sandbox_id, "E2b-Sandbox-Port": "8000"}
        for _ in range(100):
            if httpx.get(API_URL, headers=route, timeout=10).status_code == 200:
                break
            time.sleep(0.1)
        assert web.pause() is True
        assert Sandbox.get_info(web.sandbox_id).state == SandboxState.PAUSED
        r = httpx.get(API_URL, headers=route, timeout=90)
        assert (r.status_code, r.text.strip()) == (200, "awake")
        assert Sandbox.get_info(web.sandbox_id).state == SandboxState.RUNNING

        cmd.files.write("/home/user/kept.txt", "before pause")
        assert cmd.pause() is True
        # No connect: the command itself wakes it.
        assert cmd.commands.run("cat /home/user/kept.txt").stdout == "before pause"
        assert cmd.files.read("/home/user/kept.txt") == "before pause"
        assert Sandbox.get_info(cmd.sandbox_id).state == SandboxState.RUNNING
    finally:
        web.kill()
        cmd.kill()


def test_without_auto_resume_a_paused_sandbox_stays_paused():
    sbx = Sandbox.create(template=TEMPLATE, timeout=60, lifecycle={"on_timeout": "pause"})
    try:
        assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
        assert sbx.pause() is True
        route = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000"}
        r = httpx.get(API_URL, headers=route, timeout=30)
        assert r.status_code == 502 and "was not found" in r.text, r.text
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
    finally:
        sbx.kill()


def test_a_filesystem_only_pause_keeps_the_files_not_the_processes():
    sbx = Sandbox.create(template=TEMPLATE, timeout=120)
    try:
        sbx.files.write("/home/user/kept.txt", "before pause")
        sbx.commands.run("sleep 600", background=True)
        assert sbx.pause(mode="filesystem") is True
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED

        same = Sandbox.connect(sbx.sandbox_id, timeout=120)
        assert same.sandbox_id == sbx.sandbox_id
        assert same.files.read("/home/user/kept.txt") == "before pause"
        assert "sleep 600" not in same.commands.run("ps -eo args").stdout
        assert same.commands.run("echo $E2B_SANDBOX_ID").stdout.strip() == sbx.sandbox_id
    finally:
        sbx.kill()


def test_auto_pause_at_the_timeout_can_keep_the_files_only():
    sbx = Sandbox.create(
        template=TEMPLATE,
        timeout=20,
        lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}},
    )
    try:
        sbx.files.write("/home/user/kept.txt", "before the timeout")
        sbx.commands.run("sleep 600", background=True)
        deadline = time.monotonic() + 120
        while Sandbox.get_info(sbx.sandbox_id).state != SandboxState.PAUSED:
            assert time.monotonic() < deadline, "not auto-paused 100 s after its timeout"
            time.sleep(0.5)
        same = Sandbox.connect(sbx.sandbox_id, timeout=120)
        assert same.files.read("/home/user/kept.txt") == "before the timeout"
        assert "sleep 600" not in same.commands.run("ps -eo args").stdout
    finally:
        sbx.kill()


def test_snapshot_is_a_template_and_fork_makes_independent_sandboxes():
    sbx = Sandbox.create(template=TEMPLATE, timeout=120)
    made = []
    try:
        sbx.files.write("/home/user/mark", "source")
        info = sbx.create_snapshot()
        assert info.snapshot_id.startswith("snap-")
        listed = Sandbox.list_snapshots().next_items()
        assert info.snapshot_id in [s.snapshot_id for s in listed]
        # The source keeps running.
        assert sbx.files.read("/home/user/mark") == "source"

        from_snapshot = Sandbox.create(template=info.snapshot_id, timeout=60)
        made.append(from_snapshot)
        assert from_snapshot.files.read("/home/user/mark") == "source"

        forks = sbx.fork(count=2, timeout=60)
        assert len(forks) == 2
        for f in forks:
            assert isinstance(f, Sandbox), f
            made.append(f)
        forks[0].files.write("/home/user/mark", "fork 0")
        assert forks[1].files.read("/home/user/mark") == "source"
        assert sbx.files.read("/home/user/mark") == "source"
        assert forks[0].files.read("/home/user/mark") == "fork 0"

        assert Sandbox.delete_snapshot(info.snapshot_id) is True
        assert Sandbox.delete_snapshot(info.snapshot_id) is False
    finally:
        for s in made:
            s.kill()
        sbx.kill()


def test_snapshot_names_that_look_like_ids_are_names():
    sbx = Sandbox.create(template=TEMPLATE, timeout=120)
    made = []
    try:
        sbx.files.write("/home/user/mark", "nightly")
        info = sbx.create_snapshot(name="snap-nightly")
        child = Sandbox.create(template="snap-nightly", timeout=60)
        made.append(child)
        assert child.files.read("/home/user/mark") == "nightly"
        # The id's own form stays an id: refused as a name, with what to send instead.
        with pytest.raises(Exception) as refused:
            sbx.create_snapshot(name="snap-0123456789abcdef")
        assert "snapshot id" in str(refused.value)
        assert Sandbox.delete_snapshot("snap-nightly") is True
    finally:
        for s in made:
            s.kill()
        sbx.kill()
