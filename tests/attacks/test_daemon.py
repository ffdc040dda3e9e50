"""Attacks on the daemon's own edges: slow clients (slowloris), a flood of idle
connections, oversized heads and bodies on every route, and its files on the host.

The API listener (crates/server/src/http/listener.rs) closes a connection that has not sent
a whole request head within 30 s (idle keep-alive ones too), serves at most
--max-connections (1024) at once and pauses accepting beyond, and answers heads over 64 KiB
with 431. The conftest checks after each attack that the daemon answers and that tenant B's
bystander still runs a command.
"""

import os
import resource
import select
import socket
import stat
import time
from urllib.parse import urlparse

import httpx

from test_auth import every_route


def _addr(env):
    u = urlparse(env["url"])
    return (u.hostname, u.port)


def _open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_slowloris_clients_do_not_stop_the_daemon(env, api):
    addr = _addr(env)
    slow = []
    for _ in range(300):
        s = socket.create_connection(addr, timeout=10)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
        slow.append(s)
    try:
        # The daemon answers everyone else meanwhile.
        r = api(env["key_a"]).get("/sandboxes", timeout=60)
        assert r.status_code == 200
        # And the slow ones are dropped once their head is late (30 s), not held forever.
        deadline = time.monotonic() + 90
        open_ = list(slow)
        while open_ and time.monotonic() < deadline:
            ready, _, _ = select.select(open_, [], [], 5)
            for s in ready:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data or b"408" in data or b"HTTP/1.1" in data:
                    open_.remove(s)
            # a trickle of header bytes does not extend the deadline
            for s in open_:
                try:
                    s.sendall(b"X-a: b\r\n")
                except OSError:
                    pass
        assert not open_, f"{len(open_)} slowloris connections still held after 90 s"
    finally:
        for s in slow:
            s.close()


def test_ten_thousand_idle_connections_are_capped(env):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 12000)
    resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    addr = _addr(env)
    conns = []
    try:
        for _ in range(min(10000, want - 500)):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(addr)
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                continue
            conns.append(s)
        # Let the kernel complete what handshakes it will and the daemon accept what it
        # will (an uncapped daemon takes them all within seconds).
        fds = 0
        for _ in range(10):
            time.sleep(1)
            fds = max(fds, _open_fds(env["daemon_pid"]))
        # The cap (1024) plus the daemon's own files (db, sandboxes, sockets).
        assert fds < 1024 + 600, f"the daemon holds {fds} descriptors under 10k idle connections"
        # The daemon still answers: idle connections are dropped after the header timeout,
        # freeing slots for real clients (which wait in the backlog, not refused).
        r = httpx.get(env["url"] + "/health", timeout=120)
        assert r.status_code == 200
    finally:
        for s in conns:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_oversized_heads_and_bodies_on_every_route(env, api):
    a = api(env["key_a"])
    before = a.get("/sandboxes").json()
    big_header = "a" * (100 * 1024)
    big_body = b"{" + b'"x":"' + b"a" * (40 * 1024 * 1024) + b'"}'
    for method, path in every_route(env) + [("GET", "/health")]:
        r = httpx.request(
            method, env["url"] + path,
            headers={"X-API-KEY": env["key_a"], "X-Big": big_header}, timeout=60,
        )
        assert r.status_code == 431, f"{method} {path} with a 100 KiB header: {r.status_code}"
        if method in ("POST", "PUT", "PATCH"):
            try:
                r = httpx.request(
                    method, env["url"] + path, content=big_body, timeout=120,
                    headers={"X-API-KEY": env["key_a"], "Content-Type": "application/json"},
                )
                code = r.status_code
            except httpx.HTTPError:
                code = 413  # the daemon closed on us mid-body: refused all the same
            assert 400 <= code < 500, f"{method} {path} with a 40 MiB body: {code}"
    # Nothing lost: the same sandboxes, the daemon still answers.
    after = a.get("/sandboxes").json()
    assert sorted(s["sandboxID"] for s in after) == sorted(s["sandboxID"] for s in before)


def test_database_and_data_dir_are_private(env):
    data = env["data_dir"]
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o700, oct(os.stat(data).st_mode)
    for f in ["sandcell.db", "sandcell.db-wal", "sandcell.db-shm", "admin.key"]:
        p = os.path.join(data, f)
        if os.path.exists(p):
            assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, f"{f}: {oct(os.stat(p).st_mode)}"
    assert os.path.exists(os.path.join(data, "sandcell.db"))
