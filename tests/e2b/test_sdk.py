"""The registry `e2b` Python SDK, unmodified, against a real `sandcell serve`.

Run through tests/e2b/run.sh, which starts the daemon on loopback with a temp data dir and
sets E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, plus:
  SANDCELL_TEMPLATE        template with /bin/bash (the SDK runs commands with `bash -l -c`)
  SANDCELL_LIMITED_KEY     a key created with `sandcell keys create --max-sandboxes 1`
  SANDCELL_OTHER_KEY       another key (isolation)
"""

import os
import time

import httpx
import pytest

from e2b import (
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    FilesystemEventType,
    NotFoundException,
    RateLimitException,
    Sandbox,
    SandboxQuery,
    TimeoutException,
)

TEMPLATE = os.environ["SANDCELL_TEMPLATE"]
API_URL = os.environ["E2B_API_URL"]
API_KEY = os.environ["E2B_API_KEY"]


@pytest.fixture
def sbx():
    sandbox = Sandbox.create(template=TEMPLATE, timeout=120)
    try:
        yield sandbox
    finally:
        sandbox.kill()


def test_create_returns_a_running_sandbox_with_envd_info():
    sandbox = Sandbox.create(template=TEMPLATE, timeout=60, metadata={"suite": "create"})
    try:
        info = sandbox.get_info()
        assert info.sandbox_id == sandbox.sandbox_id
        assert info.template_id == TEMPLATE
        assert info.metadata == {"suite": "create"}
        assert info.state.value == "running"
        assert sandbox.is_running()
    finally:
        assert sandbox.kill() is True


def test_commands_run_stdout_stderr_exit_codes_and_env():
    sandbox = Sandbox.create(template=TEMPLATE, timeout=120, envs={"FOO": "from-create"})
    try:
        r = sandbox.commands.run("echo hi")
        assert r.stdout == "hi\n"
        assert r.exit_code == 0
        r = sandbox.commands.run("echo $FOO; echo err >&2")
        assert r.stdout == "from-create\n"
        assert r.stderr == "err\n"
        r = sandbox.commands.run("echo $BAR", envs={"BAR": "per-command"})
        assert r.stdout == "per-command\n"
        with pytest.raises(CommandExitException) as exc:
            sandbox.commands.run("exit 3")
        assert exc.value.exit_code == 3
    finally:
        sandbox.kill()


def test_commands_user_and_cwd(sbx):
    assert sbx.commands.run("whoami", user="root").stdout == "root\n"
    assert sbx.commands.run("whoami", user="user").stdout == "user\n"
    assert sbx.commands.run("echo $HOME", user="user").stdout == "/home/user\n"
    assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sbx.commands.run("pwd", user="user", cwd="/").stdout == "/\n"
    # What one user writes, the other sees with its owner.
    sbx.commands.run("echo mine > /tmp/owned", user="user")
    assert sbx.files.get_info("/tmp/owned", user="root").owner == "user"


def runsc_date() -> int:
    """The release date of the host's runsc (20221219 for Debian 12's), 0 if unknown."""
    import re
    import shutil
    import subprocess

    runsc = os.environ.get("SANDCELL_RUNSC") or shutil.which("runsc")
    if not runsc:
        return 0
    out = subprocess.run([runsc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"(\d{8})", out)
    return int(m.group(1)) if m else 0


@pytest.mark.xfail(
    runsc_date() < 20230101,
    strict=True,
    reason="gvisor runtime: statx(2) answers EINVAL in the sandbox on Debian 12's runsc "
    "(0.0~20221219), so coreutils' `stat` and `ls -l` fail "
    "(\"stat: cannot statx '/tmp': Invalid argument\"); fixed in later runsc",
)
def test_coreutils_stat_works(sbx):
    assert sbx.commands.run("stat -c %U /tmp/", user="root").stdout == "root\n"


def test_sudo_works_for_user_as_in_e2bs_template(sbx):
    """E2B's `user` has passwordless sudo. gVisor cannot elevate a setuid program, so there the
    agent serves sudo: identity, exit status, environment rules, -u/-i/-E/-n, sh -c."""
    if TEMPLATE != "base":
        pytest.skip(f"sudo is part of base, not of {TEMPLATE}")
    run = lambda cmd: sbx.commands.run(cmd, user="user")  # noqa: E731
    assert run("sudo id -u").stdout == "0\n"
    assert run("sudo -n whoami").stdout == "root\n"
    assert run("sudo -u user id -un").stdout == "user\n"
    assert run("sudo sh -c 'echo $USER $HOME $SUDO_USER'").stdout == "root /root user\n"
    assert run("sudo -i pwd").stdout == "/root\n"
    assert run("FOO=kept sudo -E sh -c 'echo $FOO'").stdout == "kept\n"
    assert run("FOO=dropped sudo sh -c 'echo x$FOO'").stdout == "x\n"
    assert run("echo piped | sudo cat").stdout == "piped\n"
    with pytest.raises(CommandExitException) as exc:
        run("sudo sh -c 'echo out; echo err >&2; exit 7'")
    assert (exc.value.exit_code, exc.value.stdout, exc.value.stderr) == (7, "out\n", "err\n")
    # What root made is root's.
    run("sudo touch /opt/made-by-sudo")
    assert sbx.files.get_info("/opt/made-by-sudo").owner == "root"
    # Ctrl-C (SIGINT to sudo) reaches the command, which is gone afterwards.
    r = run("timeout -s INT 1 sudo sleep 30; echo rc=$?; sleep 0.5; pgrep -x sleep || echo none")
    assert r.stdout == "rc=124\nnone\n"
    # Only the sudo group: another account is refused, with sudo's message.
    sbx.commands.run("useradd -M guest", user="root")
    with pytest.raises(CommandExitException) as exc:
        sbx.commands.run("runuser -u guest -- sudo true", user="root")
    assert exc.value.exit_code == 1
    assert "guest is not in the sudoers file" in exc.value.stderr


def test_node_and_npm_are_there(sbx):
    if TEMPLATE != "base":
        pytest.skip(f"node is part of base, not of {TEMPLATE}")
    r = sbx.commands.run("node -e 'console.log(process.version.split(\".\")[0], 6*7)'; npm --version")
    lines = r.stdout.splitlines()
    assert lines[0] == "v26 42"
    assert lines[1].split(".")[0] == "12"


def test_commands_default_user_is_user(sbx):
    assert sbx.commands.run("whoami").stdout == "user\n"


def test_commands_exit_codes_and_streaming_callbacks(sbx):
    with pytest.raises(CommandExitException) as exc:
        sbx.commands.run("echo partial; echo oops >&2; exit 42")
    assert exc.value.exit_code == 42
    assert exc.value.stdout == "partial\n"
    assert exc.value.stderr == "oops\n"
    with pytest.raises(CommandExitException) as exc:
        sbx.commands.run("no-such-command-here")
    assert exc.value.exit_code == 127
    out, err = [], []
    r = sbx.commands.run(
        "for i in 1 2 3; do echo o$i; echo e$i >&2; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == r.stdout == "o1\no2\no3\n"
    assert "".join(err) == r.stderr == "e1\ne2\ne3\n"


def test_commands_timeout(sbx):
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)
    # The sandbox still answers.
    assert sbx.commands.run("echo alive").stdout == "alive\n"


def test_commands_background_list_and_kill(sbx):
    handle = sbx.commands.run("sleep 300", background=True)
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    assert handle.kill() is True
    with pytest.raises(CommandExitException) as exc:
        handle.wait()
    assert exc.value.exit_code != 0
    assert handle.pid not in [p.pid for p in sbx.commands.list()]
    # By pid, through the commands API.
    other = sbx.commands.run("sleep 300", background=True)
    assert sbx.commands.kill(other.pid) is True
    with pytest.raises(CommandExitException):
        other.wait()
    assert sbx.commands.kill(other.pid) is False
    # A background command's output is collected.
    done = sbx.commands.run("echo bg; echo bg-err >&2", background=True).wait()
    assert (done.stdout, done.stderr, done.exit_code) == ("bg\n", "bg-err\n", 0)


def test_commands_stdin(sbx):
    handle = sbx.commands.run("cat; echo end", background=True, stdin=True)
    handle.send_stdin("hello\n")
    sbx.commands.send_stdin(handle.pid, b"bytes too\n")
    handle.close_stdin()
    r = handle.wait()
    assert r.stdout == "hello\nbytes too\nend\n"


def test_files_binary_10mib_rename_remove_make_dir(sbx):
    blob = os.urandom(10 * 1024 * 1024)
    info = sbx.files.write("/tmp/big/blob.bin", blob)
    assert info.path == "/tmp/big/blob.bin"
    assert sbx.files.read("/tmp/big/blob.bin", format="bytes") == blob
    assert sbx.commands.run("wc -c < /tmp/big/blob.bin").stdout.strip() == str(len(blob))
    # rename, remove, make_dir.
    moved = sbx.files.rename("/tmp/big/blob.bin", "/tmp/big/moved.bin")
    assert moved.path == "/tmp/big/moved.bin"
    assert not sbx.files.exists("/tmp/big/blob.bin")
    assert sbx.files.exists("/tmp/big/moved.bin")
    sbx.files.remove("/tmp/big/moved.bin")
    assert not sbx.files.exists("/tmp/big/moved.bin")
    assert sbx.files.make_dir("/tmp/big/a/b") is True
    assert sbx.files.make_dir("/tmp/big/a/b") is False
    assert [e.name for e in sbx.files.list("/tmp/big")] == ["a"]
    deep = sorted(e.path for e in sbx.files.list("/tmp/big", depth=2))
    assert deep == ["/tmp/big/a", "/tmp/big/a/b"]
    sbx.files.remove("/tmp/big")
    assert not sbx.files.exists("/tmp/big")
    with pytest.raises(FileNotFoundException):
        sbx.files.read("/tmp/big/nothing")


def test_files_as_user(sbx):
    sbx.files.write("notes.txt", "relative to home", user="user")
    assert sbx.files.read("/home/user/notes.txt") == "relative to home"
    assert sbx.files.get_info("/home/user/notes.txt").owner == "user"


def test_files_watch_dir(sbx):
    sbx.files.make_dir("/tmp/watched")
    handle = sbx.files.watch_dir("/tmp/watched")
    try:
        sbx.files.write("/tmp/watched/new.txt", "x")
        sbx.commands.run("rm /tmp/watched/new.txt")
        events = []
        deadline = time.time() + 20
        while time.time() < deadline:
            events += handle.get_new_events()
            if any(e.type == FilesystemEventType.REMOVE for e in events):
                break
            time.sleep(0.2)
        seen = {(e.name, e.type) for e in events}
        assert ("new.txt", FilesystemEventType.CREATE) in seen, events
        assert ("new.txt", FilesystemEventType.REMOVE) in seen, events
    finally:
        handle.stop()


def test_files_write_read_list_exists(sbx):
    sbx.files.write("/tmp/sdk/hello.txt", "hello file")
    assert sbx.files.read("/tmp/sdk/hello.txt") == "hello file"
    blob = bytes(range(256)) * 4096  # 1 MiB, every byte value
    sbx.files.write("/tmp/sdk/blob.bin", blob)
    assert sbx.files.read("/tmp/sdk/blob.bin", format="bytes") == blob
    names = sorted(e.name for e in sbx.files.list("/tmp/sdk"))
    assert names == ["blob.bin", "hello.txt"]
    assert sbx.files.exists("/tmp/sdk/hello.txt")
    assert not sbx.files.exists("/tmp/sdk/nope")
    # Written through /files, seen by processes.
    assert sbx.commands.run("cat /tmp/sdk/hello.txt").stdout == "hello file"


def test_list_filters_by_metadata_and_paginates():
    a = Sandbox.create(template=TEMPLATE, timeout=60, metadata={"suite": "list", "n": "1"})
    b = Sandbox.create(template=TEMPLATE, timeout=60, metadata={"suite": "list", "n": "2"})
    try:
        found = Sandbox.list(query=SandboxQuery(metadata={"suite": "list"})).next_items()
        assert sorted(s.sandbox_id for s in found) == sorted([a.sandbox_id, b.sandbox_id])
        one = Sandbox.list(query=SandboxQuery(metadata={"suite": "list", "n": "2"})).next_items()
        assert [s.sandbox_id for s in one] == [b.sandbox_id]
        pages = Sandbox.list(query=SandboxQuery(metadata={"suite": "list"}), limit=1)
        first = pages.next_items()
        assert pages.has_next
        second = pages.next_items()
        assert len(first) == 1 and len(second) == 1
        assert {first[0].sandbox_id, second[0].sandbox_id} == {a.sandbox_id, b.sandbox_id}
        # The raw route's other filters: start time either side, template, order.
        started_b = b.get_info().started_at.isoformat()
        raw = lambda **p: [  # noqa: E731
            x["sandboxID"]
            for x in httpx.get(
                f"{API_URL}/v2/sandboxes",
                params={"metadata": "suite=list", **p},
                headers={"X-API-KEY": API_KEY},
            ).json()
        ]
        assert raw(startedBefore=started_b) == [a.sandbox_id]
        assert raw(startedAfter=started_b) == []
        assert raw(order="asc") == [a.sandbox_id, b.sandbox_id]
        assert raw(order="desc") == [b.sandbox_id, a.sandbox_id]
        assert raw(template="no-such-template") == []
        bad = httpx.get(
            f"{API_URL}/v2/sandboxes",
            params={"startedBefore": "last week"},
            headers={"X-API-KEY": API_KEY},
        )
        assert bad.status_code == 400 and "RFC 3339" in bad.json()["message"]
    finally:
        a.kill()
        b.kill()


def test_set_timeout_and_connect_extend_the_end(sbx):
    before = sbx.get_info().end_at
    sbx.set_timeout(600)
    after = sbx.get_info().end_at
    assert after > before
    again = Sandbox.connect(sbx.sandbox_id, timeout=900)
    assert again.sandbox_id == sbx.sandbox_id
    assert again.commands.run("echo again").stdout == "again\n"
    assert sbx.get_info().end_at > after


def test_timeout_kills_the_sandbox():
    sandbox = Sandbox.create(template=TEMPLATE, timeout=2)
    deadline = time.time() + 30
    while time.time() < deadline and sandbox.is_running():
        time.sleep(0.5)
    assert not sandbox.is_running()
    with pytest.raises(NotFoundException):
        sandbox.get_info()


def test_kill_removes_it_from_the_list():
    sandbox = Sandbox.create(template=TEMPLATE, timeout=60)
    sid = sandbox.sandbox_id
    assert Sandbox.kill(sid) is True
    assert sid not in [s.sandbox_id for s in Sandbox.list().next_items()]
    assert Sandbox.kill(sid) is False


def test_bad_key_is_401():
    with pytest.raises(AuthenticationException):
        Sandbox.create(template=TEMPLATE, api_key="e2b_" + "0" * 40)
    r = httpx.get(f"{API_URL}/v2/sandboxes", headers={"X-API-KEY": "e2b_00"})
    assert r.status_code == 401
    assert r.json()["code"] == 401 and r.json()["message"]


def test_unknown_sandbox_is_404():
    with pytest.raises(NotFoundException):
        Sandbox.get_info("sc-0000000000000000")
    with pytest.raises(NotFoundException):
        Sandbox.connect("sc-0000000000000000")
    assert Sandbox.kill("sc-0000000000000000") is False


def test_bad_body_is_400():
    r = httpx.post(
        f"{API_URL}/v2/sandboxes",
        headers={"X-API-KEY": API_KEY, "Content-Type": "application/json"},
        content=b"{not json",
    )
    assert r.status_code == 400
    body = r.json()
    assert body["code"] == 400 and body["message"]
    r = httpx.post(
        f"{API_URL}/v2/sandboxes",
        headers={"X-API-KEY": API_KEY},
        json={"templateID": TEMPLATE, "timeout": -1},
    )
    assert r.status_code == 400


def test_over_quota_is_429():
    key = os.environ["SANDCELL_LIMITED_KEY"]
    first = Sandbox.create(template=TEMPLATE, timeout=60, api_key=key)
    try:
        with pytest.raises(RateLimitException):
            Sandbox.create(template=TEMPLATE, timeout=60, api_key=key)
    finally:
        first.kill()
    # The slot is free again.
    Sandbox.create(template=TEMPLATE, timeout=60, api_key=key).kill()


def test_keys_see_only_their_own_sandboxes(sbx):
    other = os.environ["SANDCELL_OTHER_KEY"]
    assert sbx.sandbox_id not in [
        s.sandbox_id for s in Sandbox.list(api_key=other).next_items()
    ]
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id, api_key=other)
    assert Sandbox.kill(sbx.sandbox_id, api_key=other) is False
    assert sbx.is_running()


def test_envd_traffic_needs_the_access_token(sbx):
    r = httpx.get(
        f"{API_URL}/health",
        headers={"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"},
    )
    assert r.status_code == 401
    r = httpx.get(
        f"{API_URL}/health",
        headers={
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": sbx._envd_access_token,
        },
    )
    assert r.is_success


def test_get_metrics_reports_sampled_cpu_memory_and_disk(sbx):
    info = sbx.get_info()
    # Keep a vCPU busy across at least one sampling interval (5 s).
    sbx.commands.run('timeout 7 sh -c "while :; do :; done" || true', timeout=30)
    metrics = []
    deadline = time.time() + 30
    while len(metrics) < 2 and time.time() < deadline:
        metrics = sbx.get_metrics()
        time.sleep(0.5)
    assert len(metrics) >= 2, metrics
    last = metrics[-1]
    assert last.cpu_count == info.cpu_count
    assert last.mem_total == info.memory_mb * 1024 * 1024
    assert 0 < last.mem_used
    assert any(m.cpu_used_pct > 10 for m in metrics), [m.cpu_used_pct for m in metrics]
    assert all(0 <= m.cpu_used_pct <= 100 for m in metrics)
    stamps = [m.timestamp for m in metrics]
    assert stamps == sorted(stamps)
    # A window before the sandbox existed is empty; the class method sees the same series.
    from datetime import datetime, timedelta, timezone

    old = datetime.now(timezone.utc) - timedelta(days=2)
    assert Sandbox.get_metrics(sbx.sandbox_id, start=old, end=old + timedelta(hours=1)) == []
    assert len(Sandbox.get_metrics(sbx.sandbox_id)) >= len(metrics)
    # Another key's sandbox does not exist for it, and bad ranges say what to send.
    with pytest.raises(NotFoundException):
        Sandbox.get_metrics(sbx.sandbox_id, api_key=os.environ["SANDCELL_OTHER_KEY"])
    r = httpx.get(
        f"{API_URL}/sandboxes/{sbx.sandbox_id}/metrics",
        params={"start": "yesterday"},
        headers={"X-API-KEY": API_KEY},
    )
    assert r.status_code == 400 and "Unix seconds" in r.json()["message"]
    r = httpx.get(
        f"{API_URL}/sandboxes/metrics",
        params={"sandbox_ids": f"{sbx.sandbox_id},sbx-nope"},
        headers={"X-API-KEY": API_KEY},
    )
    assert r.status_code == 200
    assert list(r.json()["sandboxes"]) == [sbx.sandbox_id]


def test_signed_file_urls_work_once_bound_and_expire():
    sbx = Sandbox.create(template=TEMPLATE, timeout=120, secure=True)
    try:
        sbx.files.write("/home/user/signed.txt", "signed content")
        # The SDK's URLs point at E2B_SANDBOX_URL; a deployment routes them by Host
        # (`49983-<id>.<domain>`), here the routing headers stand for that. No access token.
        route = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
        url = sbx.download_url("/home/user/signed.txt")
        assert "signature=v1_" in url
        r = httpx.get(url, headers=route)
        assert r.status_code == 200, r.text
        assert r.text == "signed content"

        up = sbx.upload_url("/home/user/uploaded.txt", use_signature_expiration=60)
        r = httpx.post(up, headers=route, files={"file": ("uploaded.txt", b"via signed url")})
        assert r.status_code == 200, r.text
        assert sbx.files.read("/home/user/uploaded.txt") == "via signed url"

        # Bound to its path, its operation and its time.
        other_path = url.replace("signed.txt", "uploaded.txt")
        assert httpx.get(other_path, headers=route).status_code == 401
        r = httpx.post(url, headers=route, files={"file": ("x", b"overwrite")})
        assert r.status_code == 401, "a read signature used to write"
        assert sbx.files.read("/home/user/signed.txt") == "signed content"
        expired = sbx.download_url("/home/user/signed.txt", use_signature_expiration=-5)
        r = httpx.get(expired, headers=route)
        assert r.status_code == 401 and "expired" in r.json()["message"]
        forged = url.split("signature=")[0] + "signature=v1_AAAA"
        assert httpx.get(forged, headers=route).status_code == 401
        assert httpx.get(url.split("&signature=")[0], headers=route).status_code == 401
    finally:
        sbx.kill()


def test_v2_logs_tell_the_sandboxes_life_and_filter():
    sbx = Sandbox.create(template=TEMPLATE, timeout=120)
    sbx_id = sbx.sandbox_id
    headers = {"X-API-KEY": API_KEY}
    url = f"{API_URL}/v2/sandboxes/{sbx_id}/logs"
    live = httpx.get(url, headers=headers).json()["logs"]
    sources = {e["fields"]["source"] for e in live}
    assert "runtime" in sources
    assert any("created from template" in e["message"] for e in live)
    assert any(e["message"] == "started" for e in live)
    sbx.kill()
    logs = httpx.get(url, headers=headers).json()["logs"]
    assert logs[-1]["message"].startswith("killed"), logs[-1]
    stamps = [e["timestamp"] for e in logs]
    assert stamps == sorted(stamps)
    back = httpx.get(url, headers=headers, params={"direction": "backward", "limit": 1})
    assert back.json()["logs"] == [logs[-1]]
    assert httpx.get(url, headers=headers, params={"level": "error"}).json()["logs"] == []
    found = httpx.get(url, headers=headers, params={"search": "CREATED FROM"}).json()["logs"]
    assert len(found) == 1
    r = httpx.get(url, headers=headers, params={"level": "loud"})
    assert r.status_code == 400 and "debug, info, warn or error" in r.json()["message"]
    other = {"X-API-KEY": os.environ["SANDCELL_OTHER_KEY"]}
    assert httpx.get(url, headers=other).status_code == 404


def test_errors_map_to_the_sdks_exceptions():
    from e2b import SandboxNotFoundException
    from e2b.exceptions import SandboxNotRunningException

    sandbox = Sandbox.create(template=TEMPLATE, timeout=120)
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 5", timeout=1)
    import threading

    threading.Timer(1.0, lambda: Sandbox.kill(sandbox.sandbox_id)).start()
    started = time.time()
    with pytest.raises(SandboxNotRunningException):
        sandbox.commands.run("sleep 30", timeout=60)
    assert time.time() - started < 20, "the stream ends when the sandbox is killed"
    started = time.time()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id)
    with pytest.raises(SandboxNotRunningException):
        sandbox.commands.run("echo hi")
    assert time.time() - started < 10, "a killed sandbox is 404 at once"
