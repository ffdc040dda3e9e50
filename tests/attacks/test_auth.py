"""Attacks without a valid key, with forged or borrowed tokens, and from a guest at the host.

Every route of the REST API needs a key; a forged, revoked or misplaced key gets 401 and
nothing else. envd of a secure sandbox needs that sandbox's access token: none, a forged one
and another sandbox's are all refused. A guest with the default (open) egress reaches the
internet but no address of the host: loopback, the gateway of its own network, the host's
other addresses.
"""

import secrets
import subprocess

import httpx

PUBLIC = {"/health", "/openapi.json"}


def every_route(env):
    """Every (method, path) of the daemon's own OpenAPI document, path parameters filled with
    plausible ids (the routes must refuse before looking anything up)."""
    spec = httpx.get(env["url"] + "/openapi.json", timeout=30).json()
    routes = []
    for path, ops in spec["paths"].items():
        if path in PUBLIC:
            continue
        concrete = path
        for name in ("sandboxID", "templateID", "snapshotID", "buildID", "secretID", "volumeID", "name", "alias", "hash", "windowID"):
            concrete = concrete.replace("{" + name + "}", "x1")
        assert "{" not in concrete, f"a path parameter the attack does not fill: {path}"
        routes += [(m.upper(), concrete) for m in ops if m in ("get", "post", "put", "patch", "delete")]
    assert len(routes) > 20, "the OpenAPI document lists the routes"
    return routes


def test_every_route_refuses_no_key_forged_key_and_key_in_query(env, api):
    forged = "e2b_" + secrets.token_hex(20)
    for method, path in every_route(env):
        for client in (api(None), api(forged), api(""), api("Bearer " + env["key_a"] + "x")):
            r = client.request(method, path, json={})
            assert r.status_code == 401, f"{method} {path} answered {r.status_code} to a bad key"
            assert env["canary"] not in r.text
        r = api(None).request(method, path, params={"api_key": env["key_a"]}, json={})
        assert r.status_code == 401, f"{method} {path} took the key from the query string"


def test_revoked_key_stops_working_at_once(env, api):
    key = subprocess.run(
        [env["bin"], "keys", "--data-dir", env["data_dir"], "create", "--name", "short-lived"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    assert api(key).get("/sandboxes").status_code == 200
    subprocess.run(
        [env["bin"], "keys", "--data-dir", env["data_dir"], "revoke", "short-lived"],
        check=True, capture_output=True, text=True,
    )
    assert api(key).get("/sandboxes").status_code == 401


def _envd(env, sandbox_id, token=None, path="/health"):
    headers = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983"}
    if token is not None:
        headers["X-Access-Token"] = token
    return httpx.get(env["url"] + path, headers=headers, timeout=30)


def test_secure_sandbox_envd_refuses_missing_forged_and_foreign_tokens(env, api, sandbox):
    victim = sandbox(env["key_a"], secure=True)
    victim.files.write("/home/user/secret.txt", "victim-data")
    # Tenant B's own secure sandbox: its token is real, for another sandbox.
    b = api(env["key_b"])
    r = b.post("/sandboxes", json={"templateID": env["template"], "secure": True, "timeout": 120})
    assert r.status_code == 201, r.text
    other = r.json()
    try:
        foreign = other.get("envdAccessToken")
        assert foreign, "a secure sandbox's create answer carries its envd access token"
        for token in [None, "", secrets.token_hex(16), "x" * 4096, foreign]:
            r = _envd(env, victim.sandbox_id, token, "/files?path=/home/user/secret.txt")
            assert r.status_code in (401, 403), f"envd answered {r.status_code} to token {token!r:.20}"
            assert "victim-data" not in r.text
    finally:
        b.delete(f"/sandboxes/{other['sandboxID']}")


def test_guest_cannot_reach_the_hosts_addresses(env, sandbox):
    sbx = sandbox(env["key_a"])
    port = env["canary_port"]
    # The host's loopback, the gateway of the sandbox's own network, the host's end of the
    # fake internet's veth, and the names the fake DNS gives such addresses.
    gateway = sbx.commands.run("ip route | awk '/default/ {print $3}'", timeout=30).stdout.strip()
    targets = ["127.0.0.1", "203.0.113.1", "loop.bars.test", "host.bars.test", "zero.bars.test"]
    if gateway:
        targets.append(gateway)
    for t in targets:
        r = sbx.commands.run(
            f"curl -s --max-time 3 http://{t}:{port}/ || true", timeout=30
        )
        assert env["canary"] not in r.stdout, f"the guest read the host's canary at {t}:{port}"
    # The internet itself still works: the attack proves something only if egress is on.
    r = sbx.commands.run("curl -s --max-time 5 http://pub.bars.test/", timeout=30)
    assert "pub-ok" in r.stdout, "the sandbox cannot reach the fake internet at all"
