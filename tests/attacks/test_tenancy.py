"""Attacks of one tenant on another and on the host's capacity (quotas, admission, the
admin view, ids and tokens).

A key has quotas (sandboxes, memory, disk): past one, creates get 429 naming the limit. The
host admits sandboxes' memory up to `--memory-overcommit` times its MemTotal: past it, 503,
and the sandboxes already running keep answering. Another key's sandbox does not exist for
a tenant on any route under /sandboxes/{id}; ids and names with path tricks are refused
with 400/404. An access token opens only its own sandbox. The admin key lists every key's
sandboxes with `?all=true` and kills any of them.
"""

import subprocess

import httpx
import pytest

ENVD_PORT = "49983"
# A new connection for each request: the daemon closes a kept-alive connection after
# answering a request whose body it did not read, which races with the next request.
CLOSE = {"connection": "close"}


def _key(env, name, *flags):
    return subprocess.run(
        [env["bin"], "keys", "--data-dir", env["data_dir"], "create", "--name", name, *flags],
        check=True, capture_output=True, text=True,
    ).stdout.strip()


def _create(client, env, **body):
    body.setdefault("templateID", env["template"])
    body.setdefault("timeout", 300)
    return client.post("/v2/sandboxes", json=body)


def _kill_all(client, ids):
    for sid in ids:
        client.delete(f"/sandboxes/{sid}")


def _envd_run(env, sandbox_id, token, path="/files?path=/etc/hostname"):
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": ENVD_PORT}
    if token is not None:
        headers["X-Access-Token"] = token
    return httpx.get(env["url"] + path, headers=headers, timeout=30)


def test_b_over_its_memory_quota_gets_429_naming_the_limit(env, api):
    q = api(_key(env, "tenant-quota", "--max-memory-mib", "768"))
    made = []
    try:
        r = _create(q, env, memoryMB=512)
        assert r.status_code == 201, r.text
        made.append(r.json()["sandboxID"])
        r = _create(q, env, memoryMB=512)
        assert r.status_code == 429, f"over its memory quota: {r.status_code} {r.text}"
        msg = r.json()["message"]
        assert "768 MiB" in msg and "512 MiB" in msg and "--max-memory-mib" in msg, msg
        # Forking into it is refused the same way: each child over the quota fails.
        r = q.post(f"/sandboxes/{made[0]}/fork", json={"count": 1})
        if r.status_code == 201:
            for child in r.json():
                if child.get("sandbox"):
                    made.append(child["sandbox"]["sandboxID"])
                assert child.get("error", {}).get("code") == 429, child
        else:
            assert r.status_code == 429, r.text
    finally:
        _kill_all(q, made)


def test_b_over_its_sandbox_quota_gets_429(env, api):
    q = api(_key(env, "tenant-two", "--max-sandboxes", "1"))
    made = []
    try:
        r = _create(q, env)
        assert r.status_code == 201, r.text
        made.append(r.json()["sandboxID"])
        r = _create(q, env)
        assert r.status_code == 429, r.text
        assert "maximum number of concurrent sandboxes (1)" in r.json()["message"]
    finally:
        _kill_all(q, made)


def _sandbox_routes(env):
    spec = httpx.get(env["url"] + "/openapi.json", timeout=30).json()
    for path, ops in spec["paths"].items():
        if "{sandboxID}" in path:
            for m in ops:
                if m in ("get", "post", "put", "patch", "delete"):
                    yield m.upper(), path


def test_b_walks_every_route_of_as_sandbox_and_gets_404(env, api, sandbox):
    victim = sandbox(env["key_a"], secure=True)
    victim.files.write("/home/user/mine.txt", "a-data")
    b = api(env["key_b"])
    assert b.post("/networks", json={"name": "b-net"}).status_code in (200, 201)
    # A body every route takes, so that none answers 400 before looking the id up.
    body = {"timeout": 30, "duration": 30, "count": 1, "name": "stolen"}
    routes = list(_sandbox_routes(env))
    assert len(routes) >= 10, routes
    for method, path in routes:
        concrete = path.replace("{sandboxID}", victim.sandbox_id).replace("{name}", "b-net")
        r = b.request(method, concrete, json=body, headers=CLOSE)
        assert r.status_code == 404, f"{method} {concrete} answered {r.status_code}: {r.text}"
        assert "a-data" not in r.text and (victim._envd_access_token or "-") not in r.text
    # Nothing B did reached A's sandbox: running, its file, its timeout and token as they were.
    a = api(env["key_a"])
    detail = a.get(f"/sandboxes/{victim.sandbox_id}")
    assert detail.status_code == 200 and detail.json()["state"] == "running"
    assert victim.files.read("/home/user/mine.txt") == "a-data"
    assert not [s for s in a.get("/snapshots").json() if s["sandboxID"] == victim.sandbox_id]
    b.delete("/networks/b-net")


def test_tokens_swapped_between_a_and_b_are_refused(env, api, sandbox):
    sa = sandbox(env["key_a"], secure=True)
    sb = sandbox(env["key_b"], secure=True)
    ta, tb = sa._envd_access_token, sb._envd_access_token
    assert ta and tb and ta != tb
    for target, token in [(sb.sandbox_id, ta), (sa.sandbox_id, tb),
                          (sa.sandbox_id, ta[:-1]), (sa.sandbox_id, ta + "0"),
                          (sa.sandbox_id, ta.upper())]:
        r = _envd_run(env, target, token)
        assert r.status_code in (401, 403), f"{target} with {token!r:.12}: {r.status_code}"
    # Both tokens twice on one request, the wrong one first.
    headers = [("E2b-Sandbox-Id", sa.sandbox_id), ("E2b-Sandbox-Port", ENVD_PORT),
               ("X-Access-Token", tb), ("X-Access-Token", ta)]
    r = httpx.get(env["url"] + "/files?path=/etc/hostname", headers=headers, timeout=30)
    assert r.status_code in (401, 403), r.status_code
    # Each with its own still works.
    assert _envd_run(env, sa.sandbox_id, ta).status_code == 200
    assert _envd_run(env, sb.sandbox_id, tb).status_code == 200


def test_a_killed_sandboxs_token_is_not_replayable(env, api, sandbox):
    old = sandbox(env["key_b"], secure=True)
    token = old._envd_access_token
    old.kill()
    new = sandbox(env["key_b"], secure=True)
    for target in (old.sandbox_id, new.sandbox_id):
        r = _envd_run(env, target, token)
        assert r.status_code in (401, 403, 404, 502), f"{target}: {r.status_code}"
        assert r.status_code != 200


def test_traffic_token_of_one_sandbox_does_not_open_another(env, api):
    a, b = api(env["key_a"]), api(env["key_b"])
    made = []
    try:
        ra = _create(a, env, network={"allowPublicTraffic": False})
        rb = _create(b, env, network={"allowPublicTraffic": False})
        if ra.status_code != 201 or rb.status_code != 201:
            pytest.skip(f"allowPublicTraffic: false not available: {ra.text} {rb.text}")
        made = [(a, ra.json()), (b, rb.json())]
        ta, tb = ra.json().get("trafficAccessToken"), rb.json().get("trafficAccessToken")
        assert ta and tb and ta != tb
        for target, token in [(rb.json()["sandboxID"], ta), (ra.json()["sandboxID"], tb),
                              (ra.json()["sandboxID"], None)]:
            headers = {"E2b-Sandbox-Id": target, "E2b-Sandbox-Port": "8000"}
            if token:
                headers["E2b-Traffic-Access-Token"] = token
            r = httpx.get(env["url"] + "/", headers=headers, timeout=30)
            assert r.status_code == 403, f"{target} with {token!r:.12}: {r.status_code} {r.text}"
    finally:
        for client, s in made:
            client.delete(f"/sandboxes/{s['sandboxID']}")


def test_admin_lists_both_tenants_and_kills_any(env, api, sandbox):
    sa = sandbox(env["key_a"])
    sb = sandbox(env["key_b"])
    admin = api(env["admin_key"])
    for path in ("/v2/sandboxes?all=true", "/sandboxes?all=true"):
        r = admin.get(path)
        assert r.status_code == 200, r.text
        ids = {s["sandboxID"]: s.get("keyID") for s in r.json()}
        assert sa.sandbox_id in ids and sb.sandbox_id in ids, path
        assert ids[sa.sandbox_id] != ids[sb.sandbox_id]
    # Tenants cannot ask for the admin view, and keep seeing only their own.
    for key, own, other in ((env["key_a"], sa, sb), (env["key_b"], sb, sa)):
        assert api(key).get("/v2/sandboxes?all=true").status_code == 403
        listed = {s["sandboxID"] for s in api(key).get("/v2/sandboxes").json()}
        assert own.sandbox_id in listed and other.sandbox_id not in listed
    assert admin.delete(f"/sandboxes/{sa.sandbox_id}").status_code == 204
    assert api(env["key_a"]).get(f"/sandboxes/{sa.sandbox_id}").status_code == 404
    assert sb.commands.run("echo still").stdout == "still\n"


def _mem_total_mib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no MemTotal")


def test_a_flood_of_creates_past_the_host_ratio_gets_503_and_others_answer(env, api, sandbox):
    keeper = sandbox(env["key_a"])
    # The admin key has no quota: only the host's admission stops it. Sandboxes of the
    # largest size the daemon allows (8192 MiB, not allocated up front by gvisor).
    admin = api(env["admin_key"])
    tries = int(_mem_total_mib() * 2 / 8192) + 3
    made, refused = [], None
    try:
        for _ in range(tries):
            r = _create(admin, env, memoryMB=8192, timeout=120)
            if r.status_code == 201:
                made.append(r.json()["sandboxID"])
                continue
            refused = r
            break
        assert refused is not None, f"{len(made)} sandboxes of 8 GiB admitted on this host"
        assert refused.status_code == 503, refused.text
        msg = refused.json()["message"]
        assert "at capacity" in msg and "--memory-overcommit" in msg, msg
        # A tenant's small sandbox is refused too while the host is full, and says why.
        r = _create(api(env["key_b"]), env, memoryMB=512)
        if r.status_code == 201:
            made.append(r.json()["sandboxID"])
        else:
            assert r.status_code == 503, r.text
        assert keeper.commands.run("echo alive").stdout == "alive\n"
    finally:
        _kill_all(admin, made)
    # Room again once they are gone.
    r = _create(api(env["key_b"]), env)
    assert r.status_code == 201, r.text
    api(env["key_b"]).delete(f"/sandboxes/{r.json()['sandboxID']}")


# Raw `..` and `.` segments are left out: httpx normalizes them away before sending.
TRICKS = ["..%2f..%2fadmin.key", "..%2F..%2Fsandcell.db", "%2e%2e", "%2e", "sc-" + "a" * 5000,
          "%00", "sc-1%00..", "%2f", "sc-%0d%0aX-Injected:1", "sc-%ff%fe", "%252e%252e%252f"]


def test_path_tricks_in_ids_are_400_or_404(env, api):
    b = api(env["key_b"])
    routes = list(_sandbox_routes(env))
    for trick in TRICKS:
        for method, path in routes:
            concrete = path.replace("{sandboxID}", trick).replace("{name}", "n")
            r = b.request(method, concrete, json={"timeout": 30}, headers=CLOSE)
            assert r.status_code in (400, 404, 405), f"{method} {concrete[:80]}: {r.status_code}"
            assert "e2b_" not in r.text and "SQLite" not in r.text
        for path in (f"/templates/{trick}", f"/snapshots/{trick}", f"/networks/{trick}"):
            r = b.delete(path, headers=CLOSE)
            assert r.status_code in (400, 404, 405), f"DELETE {path[:80]}: {r.status_code}"
    # Names that are paths, on create.
    for name in ["../../etc", "/etc/passwd", "base/../../..", "base\x00", "a" * 5000, "..", "."]:
        r = b.post("/v2/sandboxes", json={"templateID": name, "timeout": 30}, headers=CLOSE)
        assert r.status_code in (400, 404), f"templateID {name[:30]!r}: {r.status_code} {r.text}"
    r = b.post("/v2/sandboxes", content=b'{"templateID": "base\\u0000"}',
               headers={"content-type": "application/json"})
    assert r.status_code in (400, 404), r.text
