"""Sandcell's MCP server with the official MCP Python SDK as the client, over stdio
(`sandcell mcp`, spawned as an MCP client spawns servers) and over streamable HTTP (the
daemon's /mcp), against a real daemon (tests/mcp/run.sh starts it and sets the environment:
SANDCELL_URL, SANDCELL_BIN, SANDCELL_KEY_A, SANDCELL_KEY_B, SANDCELL_TEMPLATE)."""

import contextlib
import os

import anyio
import httpx2
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

URL = os.environ["SANDCELL_URL"]
BIN = os.environ["SANDCELL_BIN"]
KEY_A = os.environ["SANDCELL_KEY_A"]
KEY_B = os.environ["SANDCELL_KEY_B"]
TEMPLATE = os.environ.get("SANDCELL_TEMPLATE", "base")

TOOLS = {
    "sandbox_create", "sandbox_list", "sandbox_info", "sandbox_kill", "sandbox_pause",
    "sandbox_resume", "sandbox_fork", "sandbox_snapshot", "sandbox_set_timeout", "exec",
    "file_read", "file_write", "file_list", "file_stat", "file_remove", "file_mkdir",
    "port_url", "network_update", "computer_screenshot", "computer_click", "computer_type",
    "computer_key", "computer_scroll", "computer_launch", "computer_windows",
}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@contextlib.asynccontextmanager
async def stdio_session(key):
    params = StdioServerParameters(
        command=BIN,
        args=["mcp"],
        env={"SANDCELL_URL": URL, "SANDCELL_API_KEY": key, "SANDCELL_CONFIG": "/nonexistent"},
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


@contextlib.asynccontextmanager
async def http_session(key, header="bearer"):
    headers = {"Authorization": f"Bearer {key}"} if header == "bearer" else {"X-API-KEY": key}
    timeout = httpx2.Timeout(30.0, read=300.0)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        async with streamable_http_client(f"{URL}/mcp", http_client=http) as streams:
            read, write = streams[0], streams[1]
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


SESSIONS = {"stdio": stdio_session, "http": http_session}


def text_of(result):
    return "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def call(session, tool, **args):
    """A tool call that must succeed; its structured content."""
    result = await session.call_tool(tool, args)
    assert not result.is_error, f"{tool} failed: {text_of(result)}"
    return result.structured_content


async def create(session, **args):
    return (await call(session, "sandbox_create", template=TEMPLATE, **args))["sandbox_id"]


@contextlib.asynccontextmanager
async def sandbox(session, **args):
    sid = await create(session, **args)
    try:
        yield sid
    finally:
        with anyio.CancelScope(shield=True):
            await session.call_tool("sandbox_kill", {"sandbox_id": sid})


@pytest.mark.anyio
async def test_tools_are_listed_with_schemas():
    async with stdio_session(KEY_A) as s:
        tools = (await s.list_tools()).tools
    names = {t.name for t in tools}
    assert TOOLS <= names, TOOLS - names
    for t in tools:
        assert t.input_schema["type"] == "object", t.name
        assert t.description and len(t.description) > 40, t.name
    exec_tool = next(t for t in tools if t.name == "exec")
    assert {"sandbox_id", "command"} <= set(exec_tool.input_schema["required"])


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_session_creates_execs_moves_files_forks_and_kills(transport):
    async with SESSIONS[transport](KEY_A) as s:
        sid = await create(s, metadata={"test": transport}, env_vars={"GREETING": "hi"})
        children = []
        try:
            progress = []

            async def on_progress(value, total, message):
                progress.append((value, message))

            result = await s.call_tool(
                "exec",
                {"sandbox_id": sid,
                 "command": "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo oops >&2; "
                            "echo $GREETING; exit 3"},
                progress_callback=on_progress,
            )
            assert not result.is_error, text_of(result)
            out = result.structured_content
            assert out["exit_code"] == 3, out
            assert out["stdout"] == "line1\nline2\nline3\nhi\n", out
            assert out["stderr"] == "oops\n", out
            assert out["truncated"] is False
            streamed = "".join(m or "" for _, m in progress)
            assert "line1" in streamed and "line3" in streamed, progress
            values = [v for v, _ in progress]
            assert values == sorted(values) and len(values) >= 2, progress

            # Long output: head and tail kept, the middle marked.
            big = await call(s, "exec", sandbox_id=sid, command="seq 1 100000")
            assert big["truncated"] is True
            assert big["stdout"].startswith("1\n2\n") and big["stdout"].endswith("99999\n100000\n")

            payload = "hello from MCP\nsecond line\n"
            await call(s, "file_write", sandbox_id=sid, path="/tmp/mcp/note.txt", content=payload)
            read = await s.call_tool("file_read", {"sandbox_id": sid, "path": "/tmp/mcp/note.txt"})
            assert not read.is_error and text_of(read) == payload
            binary = bytes(range(256))
            import base64
            await call(s, "file_write", sandbox_id=sid, path="/tmp/mcp/bin",
                       content=base64.b64encode(binary).decode(), encoding="base64")
            back = await call(s, "file_read", sandbox_id=sid, path="/tmp/mcp/bin", encoding="base64")
            assert base64.b64decode(back["content"]) == binary
            not_text = await s.call_tool("file_read", {"sandbox_id": sid, "path": "/tmp/mcp/bin"})
            assert not_text.is_error and "base64" in text_of(not_text)

            listing = await call(s, "file_list", sandbox_id=sid, path="/tmp/mcp")
            assert {e["name"] for e in listing["entries"]} == {"note.txt", "bin"}
            st = await call(s, "file_stat", sandbox_id=sid, path="/tmp/mcp/note.txt")
            assert st["exists"] is True and st["size"] == len(payload) and st["type"] == "file"
            made = await call(s, "file_mkdir", sandbox_id=sid, path="/tmp/mcp/sub/dir")
            assert made["created"] is True
            again = await call(s, "file_mkdir", sandbox_id=sid, path="/tmp/mcp/sub/dir")
            assert again["created"] is False
            await call(s, "file_remove", sandbox_id=sid, path="/tmp/mcp/sub")
            gone = await call(s, "file_stat", sandbox_id=sid, path="/tmp/mcp/sub")
            assert gone["exists"] is False

            listed = await call(s, "sandbox_list", metadata={"test": transport})
            assert [x["sandbox_id"] for x in listed["sandboxes"]] == [sid]
            info = await call(s, "sandbox_info", sandbox_id=sid)
            assert info["sandboxID"] == sid and "envdAccessToken" not in info
            await call(s, "sandbox_set_timeout", sandbox_id=sid, timeout_seconds=600)

            port = await call(s, "port_url", sandbox_id=sid, port=8123)
            assert port["listening"] is False

            forked = await call(s, "sandbox_fork", sandbox_id=sid, count=1)
            children = forked["sandbox_ids"]
            assert len(children) == 1 and children[0] != sid, forked
            child = await call(s, "exec", sandbox_id=children[0], command="cat /tmp/mcp/note.txt")
            assert child["stdout"] == payload
        finally:
            for id_ in [sid, *children]:
                with anyio.CancelScope(shield=True):
                    await s.call_tool("sandbox_kill", {"sandbox_id": id_})
        left = await call(s, "sandbox_list", metadata={"test": transport})
        assert left["sandboxes"] == [], left
        after = await s.call_tool("sandbox_info", {"sandbox_id": sid})
        assert after.is_error and "sandbox_list" in text_of(after)


@pytest.mark.anyio
async def test_another_key_sees_nothing_of_the_first():
    async with http_session(KEY_A) as a, http_session(KEY_B, header="x-api-key") as b:
        async with sandbox(a) as sid:
            theirs = await call(b, "sandbox_list")
            assert sid not in [x["sandbox_id"] for x in theirs["sandboxes"]]
            for tool, args in [
                ("sandbox_info", {}),
                ("exec", {"command": "id"}),
                ("file_read", {"path": "/etc/hostname"}),
                ("sandbox_kill", {}),
                ("sandbox_fork", {}),
            ]:
                r = await b.call_tool(tool, {"sandbox_id": sid, **args})
                assert r.is_error, f"key B's {tool} on key A's sandbox: {text_of(r)}"
                assert f"no sandbox {sid}" in text_of(r), text_of(r)
            # Still there and A's.
            mine = await call(a, "sandbox_list")
            assert sid in [x["sandbox_id"] for x in mine["sandboxes"]]


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_resources_are_a_sandboxs_info_and_log_for_its_key_only(transport):
    import json
    from mcp.shared.exceptions import MCPError
    async with SESSIONS[transport](KEY_A) as a, SESSIONS[transport](KEY_B) as b:
        templates = (await a.list_resource_templates()).resource_templates
        assert {t.uri_template for t in templates} == {
            "sandcell://sandboxes/{sandbox_id}", "sandcell://sandboxes/{sandbox_id}/logs"}
        async with sandbox(a) as sid:
            await call(a, "exec", sandbox_id=sid, command="echo hi")
            listed = {str(r.uri) for r in (await a.list_resources()).resources}
            assert {f"sandcell://sandboxes/{sid}", f"sandcell://sandboxes/{sid}/logs"} <= listed
            info = await a.read_resource(f"sandcell://sandboxes/{sid}")
            detail = json.loads(info.contents[0].text)
            assert detail["sandboxID"] == sid, detail
            assert "envdAccessToken" not in detail and "trafficAccessToken" not in detail
            log = json.loads((await a.read_resource(f"sandcell://sandboxes/{sid}/logs")).contents[0].text)
            messages = " ".join(e["message"] for e in log["logs"])
            assert "created" in messages.lower(), log
            # Key B: not listed, and reading it is "not found", the same as a made-up id.
            theirs = {str(r.uri) for r in (await b.list_resources()).resources}
            assert f"sandcell://sandboxes/{sid}" not in theirs
            for uri in (f"sandcell://sandboxes/{sid}", f"sandcell://sandboxes/{sid}/logs",
                        "sandcell://sandboxes/sc-0000000000000000", "sandcell://sandboxes/../x"):
                with pytest.raises(MCPError) as e:
                    await b.read_resource(uri)
                assert e.value.error.code == -32002, (uri, e.value.error)


@pytest.mark.anyio
async def test_http_without_a_valid_key_is_refused():
    async with httpx2.AsyncClient() as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "t", "version": "1"}}}
        accept = {"Accept": "application/json, text/event-stream"}
        r = await http.post(f"{URL}/mcp", json=body, headers=accept)
        assert r.status_code == 401
        r = await http.post(f"{URL}/mcp", json=body,
                            headers={**accept, "Authorization": "Bearer e2b_" + "0" * 40})
        assert r.status_code == 401
        # DNS rebinding: a foreign Host is refused even with a valid key.
        r = await http.post(f"{URL}/mcp", json=body,
                            headers={**accept, "X-API-KEY": KEY_A, "Host": "evil.example"})
        assert r.status_code == 403, r.text


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_malformed_calls_are_tool_errors_with_a_message(transport):
    async with SESSIONS[transport](KEY_A) as s:
        r = await s.call_tool("exec", {"sandbox_id": "nope"})
        assert r.is_error and "command" in text_of(r), text_of(r)
        r = await s.call_tool("exec", {"sandbox_id": "nope", "command": "true", "shell": "bash"})
        assert r.is_error and "shell" in text_of(r), text_of(r)
        r = await s.call_tool("sandbox_fork", {"sandbox_id": 7})
        assert r.is_error and "sandbox_fork" in text_of(r), text_of(r)
        r = await s.call_tool("sandbox_info", {"sandbox_id": "does-not-exist"})
        assert r.is_error and "sandbox_list" in text_of(r), text_of(r)
        r = await s.call_tool("no_such_tool", {})
        assert r.is_error and "tools/list" in text_of(r), text_of(r)


PS = ("for p in /proc/[0-9]*; do tr '\\0' ' ' <$p/cmdline 2>/dev/null; echo; done "
      "| grep -c '^[s]leep 313' || true")


@pytest.mark.anyio
@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_cancelled_exec_kills_its_process(transport):
    async with SESSIONS[transport](KEY_A) as s:
        async with sandbox(s) as sid:
            started = anyio.Event()

            async def on_progress(value, total, message):
                if message and "started" in message:
                    started.set()

            async def long_exec():
                await s.call_tool(
                    "exec",
                    {"sandbox_id": sid, "command": "echo started; sleep 313; echo never",
                     "timeout_seconds": 600},
                    progress_callback=on_progress,
                )

            async with anyio.create_task_group() as tg:
                tg.start_soon(long_exec)
                with anyio.fail_after(60):
                    await started.wait()
                running = await call(s, "exec", sandbox_id=sid, command=PS)
                assert running["stdout"].strip() == "1", running
                tg.cancel_scope.cancel()

            # The kill goes through envd after the cancel arrives: wait for it, bounded.
            count = None
            with anyio.fail_after(30):
                while count != "0":
                    count = (await call(s, "exec", sandbox_id=sid, command=PS))["stdout"].strip()
                    if count != "0":
                        await anyio.sleep(0.5)


@pytest.mark.anyio
async def test_exec_timeout_kills_and_says_so():
    async with stdio_session(KEY_A) as s:
        async with sandbox(s) as sid:
            out = await call(s, "exec", sandbox_id=sid, command="echo a; sleep 317",
                             timeout_seconds=2)
            assert out["timed_out"] is True and out["exit_code"] is None, out
            assert out["stdout"] == "a\n"
            left = await call(s, "exec", sandbox_id=sid, command=PS.replace("313", "317"))
            assert left["stdout"].strip() == "0", left


@pytest.mark.anyio
async def test_snapshot_pause_resume_and_egress_rules():
    async with stdio_session(KEY_A) as s:
        async with sandbox(s) as sid:
            await call(s, "file_write", sandbox_id=sid, path="/tmp/state", content="kept")
            snap = await call(s, "sandbox_snapshot", sandbox_id=sid)
            assert snap["snapshot_id"], snap
            copy = (await call(s, "sandbox_create", template=snap["snapshot_id"]))["sandbox_id"]
            try:
                out = await call(s, "exec", sandbox_id=copy, command="cat /tmp/state")
                assert out["stdout"] == "kept"
            finally:
                await s.call_tool("sandbox_kill", {"sandbox_id": copy})

            rules = await call(s, "network_update", sandbox_id=sid, allow_out=["192.0.2.1"],
                               allow_internet=False)
            assert rules["allow_internet"] is False
            bad = await s.call_tool("network_update", {"sandbox_id": sid, "deny_out": ["nonsense/99"]})
            assert bad.is_error, text_of(bad)

            await call(s, "sandbox_pause", sandbox_id=sid)
            paused = await call(s, "sandbox_list", state=["paused"])
            assert sid in [x["sandbox_id"] for x in paused["sandboxes"]]
            busy = await s.call_tool("exec", {"sandbox_id": sid, "command": "true"})
            assert busy.is_error and "sandbox_resume" in text_of(busy), text_of(busy)
            await call(s, "sandbox_resume", sandbox_id=sid)
            out = await call(s, "exec", sandbox_id=sid, command="cat /tmp/state")
            assert out["stdout"] == "kept"


@pytest.mark.anyio
async def test_stdio_explains_a_missing_daemon_and_a_bad_key():
    params = StdioServerParameters(
        command=BIN, args=["mcp"],
        env={"SANDCELL_URL": "http://127.0.0.1:9", "SANDCELL_API_KEY": KEY_A,
             "SANDCELL_CONFIG": "/nonexistent"},
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            r = await s.call_tool("sandbox_list", {})
            assert r.is_error and "does not answer" in text_of(r), text_of(r)
    async with stdio_session("e2b_" + "0" * 40) as s:
        r = await s.call_tool("sandbox_list", {})
        assert r.is_error and "API key" in text_of(r), text_of(r)


@pytest.mark.anyio
async def test_a_session_belongs_to_the_key_that_opened_it():
    accept = {"Accept": "application/json, text/event-stream",
              "MCP-Protocol-Version": "2025-06-18"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "t", "version": "1"}}}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    async with httpx2.AsyncClient(timeout=30) as http:
        r = await http.post(f"{URL}/mcp", json=init, headers={**accept, "X-API-KEY": KEY_A})
        assert r.status_code == 200, r.text
        session = r.headers["mcp-session-id"]
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        with_a = {**accept, "X-API-KEY": KEY_A, "Mcp-Session-Id": session}
        with_b = {**accept, "X-API-KEY": KEY_B, "Mcp-Session-Id": session}
        r = await http.post(f"{URL}/mcp", json=done, headers=with_a)
        assert r.status_code in (200, 202), r.text
        r = await http.post(f"{URL}/mcp", json=listing, headers=with_b)
        assert r.status_code == 404, r.text
        r = await http.delete(f"{URL}/mcp", headers=with_b)
        assert r.status_code == 404, r.text
        r = await http.post(f"{URL}/mcp", json=listing, headers=with_a)
        assert r.status_code == 200 and "sandbox_create" in r.text, r.text
        r = await http.delete(f"{URL}/mcp", headers=with_a)
        assert r.status_code in (200, 202, 204), r.text


@pytest.mark.anyio
async def test_a_client_going_away_mid_exec_leaves_no_process():
    """A client that exits mid-call (its stdin to `sandcell mcp` closes, no cancel sent)."""
    import json
    import subprocess

    async with stdio_session(KEY_A) as keeper:
        async with sandbox(keeper) as sid:
            env = {**os.environ, "SANDCELL_URL": URL, "SANDCELL_API_KEY": KEY_A,
                   "SANDCELL_CONFIG": "/nonexistent"}
            proc = subprocess.Popen([BIN, "mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, env=env, text=True)
            try:
                def send(msg):
                    proc.stdin.write(json.dumps(msg) + "\n")
                    proc.stdin.flush()

                send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "raw", "version": "1"}}})
                assert json.loads(proc.stdout.readline())["id"] == 1
                send({"jsonrpc": "2.0", "method": "notifications/initialized"})
                send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "exec", "_meta": {"progressToken": "p"},
                                 "arguments": {"sandbox_id": sid, "timeout_seconds": 600,
                                               "command": "echo started; sleep 319"}}})
                for line in proc.stdout:
                    msg = json.loads(line)
                    if "started" in msg.get("params", {}).get("message", ""):
                        break
                proc.stdin.close()
                proc.wait(timeout=30)
            finally:
                if proc.poll() is None:
                    proc.kill()
            ps = PS.replace("313", "319")
            assert (await call(keeper, "exec", sandbox_id=sid, command=ps))["stdout"].strip() == "0"


@pytest.mark.anyio
async def test_the_computer_tools_see_and_drive_a_desktop():
    """A `desktop` sandbox: the screenshot is image content a model sees (a PNG of the
    1024x768 screen); a launched terminal shows in the window list; a click off the screen
    and a sandbox without a desktop are tool errors that say why."""
    import base64
    import struct
    async with stdio_session(KEY_A) as s:
        sid = (await call(s, "sandbox_create", template="desktop", timeout_seconds=300))["sandbox_id"]
        try:
            shot = await s.call_tool("computer_screenshot", {"sandbox_id": sid})
            assert not shot.is_error, text_of(shot)
            image = next(c for c in shot.content if c.type == "image")
            assert image.mime_type == "image/png"
            png = base64.b64decode(image.data)
            assert png[:8] == b"\x89PNG\r\n\x1a\n"
            assert struct.unpack(">II", png[16:24]) == (1024, 768)
            assert "1024x768" in text_of(shot)
            await call(s, "computer_launch", sandbox_id=sid, target="xfce4-terminal")
            for _ in range(60):
                listed = await call(s, "computer_windows", sandbox_id=sid)
                if any("terminal" in w["class"].lower() for w in listed["windows"]):
                    break
                await anyio.sleep(0.5)
            else:
                pytest.fail(f"no terminal window: {listed}")
            await call(s, "computer_click", sandbox_id=sid, x=500, y=300)
            await call(s, "computer_type", sandbox_id=sid, text="echo hi")
            await call(s, "computer_key", sandbox_id=sid, keys=["enter"])
            off = await s.call_tool("computer_click", {"sandbox_id": sid, "x": 4000, "y": 1})
            assert off.is_error and "off the screen" in text_of(off), text_of(off)
        finally:
            with anyio.CancelScope(shield=True):
                await s.call_tool("sandbox_kill", {"sandbox_id": sid})
        async with sandbox(s) as plain:
            none = await s.call_tool("computer_screenshot", {"sandbox_id": plain})
            assert none.is_error and "has no desktop" in text_of(none), text_of(none)
