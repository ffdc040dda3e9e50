"""Attacks through the egress rules: rules that would open the host, the cloud metadata
address or other tenants' sandboxes; names that resolve there under an allowed domain rule
(the Host/SNI proxy connects from the host's namespace); connections left open after a rule
is tightened; and the port proxy handing the caller's credentials to the app in the sandbox.

The harness's DNS zone (run.sh): pub.bars.test -> the fake internet, loop -> 127.0.0.1,
meta -> 169.254.169.254, pool -> 10.213.0.2 (inside --net-pool), zero -> 0.0.0.0,
host -> 203.0.113.1 (the host's end of the fake internet's veth). The canary listens on the
host's 0.0.0.0:$CANARY_PORT.
"""

import time

import httpx

# Entries no rule may open (the daemon runs without --allow-private-egress).
REFUSED = [
    "127.0.0.0/8",
    "127.0.0.1",
    "169.254.169.254",
    "169.254.0.0/16",
    "0.0.0.0/8",
    "10.213.0.0/16",  # the daemon's --net-pool
    "10.213.0.2",
    "203.0.113.1",  # an address of the host
    "224.0.0.1",
    "255.255.255.255",
    "10.0.0.0/8",  # private: only with --allow-private-egress
    "192.168.0.0/16",
    "172.16.0.1",
    "100.64.0.0/10",
    "::1",
    "fe80::/10",
    "::ffff:127.0.0.1",
    "fd00::/8",
]


def _refused(r, entry):
    assert r.status_code == 400, f"allowOut {entry}: answered {r.status_code} {r.text[:200]}"
    body = r.json()
    assert body.get("code") == 400 and entry in body.get("message", ""), body


def test_allow_out_of_reserved_ranges_is_refused_at_create(env, api):
    a = api(env["key_a"])
    before = len(a.get("/sandboxes").json())
    for entry in REFUSED:
        r = a.post(
            "/sandboxes",
            json={"templateID": env["template"], "timeout": 60,
                  "network": {"allowOut": ["*.bars.test", entry]}},
        )
        _refused(r, entry)
    assert len(a.get("/sandboxes").json()) == before, "a refused create left a sandbox"


def test_allow_out_of_reserved_ranges_is_refused_on_live_update(env, api, sandbox):
    sbx = sandbox(env["key_a"], network={"allow_out": ["pub.bars.test"]})
    a = api(env["key_a"])
    for entry in REFUSED:
        r = a.put(f"/sandboxes/{sbx.sandbox_id}/network", json={"allowOut": [entry]})
        _refused(r, entry)
    # The rules stayed as they were: the canary on the host stays out of reach.
    r = sbx.commands.run(
        f"curl -s --max-time 3 http://127.0.0.1:{env['canary_port']}/ || true", timeout=30
    )
    assert env["canary"] not in r.stdout
    assert "pub-ok" in sbx.commands.run("curl -s --max-time 5 http://pub.bars.test/", timeout=30).stdout


def test_names_under_an_allowed_domain_lead_nowhere_reserved(env, sandbox):
    """`*.bars.test` allowed; names of it resolve to loopback, metadata, the pool, 0.0.0.0 and
    the host. Neither DNS nor the proxy (Host header or direct name) lead there."""
    sbx = sandbox(env["key_a"], network={"allow_out": ["*.bars.test"]})
    port = env["canary_port"]
    # The proxy path works at all (else the attack proves nothing).
    assert "pub-ok" in sbx.commands.run("curl -s --max-time 5 http://pub.bars.test/", timeout=30).stdout
    for name in ["loop", "meta", "pool", "zero", "host"]:
        fq = f"{name}.bars.test"
        got = sbx.commands.run(f"getent ahostsv4 {fq} || true", timeout=30).stdout
        for bad in ["127.0.0.1", "169.254.169.254", "10.213.0.2", "0.0.0.0", "203.0.113.1"]:
            assert bad not in got, f"DNS handed out {bad} for {fq}: {got}"
        for cmd in [
            f"curl -s --max-time 5 -H 'Host: {fq}' http://pub.bars.test:{port}/",
            f"curl -s --max-time 5 -H 'Host: {fq}:{port}' http://pub.bars.test:{port}/",
            f"curl -s --max-time 5 --resolve {fq}:{port}:203.0.113.10 http://{fq}:{port}/",
            f"curl -s --max-time 5 http://{fq}:{port}/",
        ]:
            r = sbx.commands.run(cmd + " || true", timeout=30)
            assert env["canary"] not in r.stdout, f"read the host's canary with: {cmd}"


def test_other_tenants_sandbox_is_unreachable_directly_and_through_the_proxy(env, sandbox):
    victim = sandbox(env["key_b"])
    victim.commands.run(
        "mkdir -p /tmp/www && echo victim-secret > /tmp/www/index.html && "
        "cd /tmp/www && python3 -m http.server 8000",
        background=True,
    )
    vip = victim.commands.run("hostname -I", timeout=30).stdout.split()[0]
    for _ in range(50):
        if "victim-secret" in victim.commands.run(
            "curl -s --max-time 2 http://127.0.0.1:8000/ || true", timeout=30
        ).stdout:
            break
        time.sleep(0.2)
    for rules in [None, {"allow_out": ["*.bars.test"]}]:
        kw = {"network": rules} if rules else {}
        attacker = sandbox(env["key_a"], **kw)
        for cmd in [
            f"curl -s --max-time 3 http://{vip}:8000/",
            "curl -s --max-time 3 -H 'Host: pool.bars.test' http://pub.bars.test:8000/",
            "curl -s --max-time 3 http://pool.bars.test:8000/",
        ]:
            r = attacker.commands.run(cmd + " || true", timeout=30)
            assert "victim-secret" not in r.stdout, f"{rules}: reached tenant B's sandbox: {cmd}"


def test_tightened_rules_cut_an_open_connection(env, api, sandbox):
    """A connection opened while allowed must not outlive a rule change that refuses it."""
    sbx = sandbox(env["key_a"])
    script = (
        "import socket,os,time\n"
        "s=socket.create_connection(('203.0.113.10',80),timeout=5)\n"
        "s.sendall(b'GET / HTTP/1.1\\r\\nHost: pub\\r\\n')\n"
        "open('/tmp/connected','w').close()\n"
        "while not os.path.exists('/tmp/go'): time.sleep(0.1)\n"
        "try:\n"
        "    s.sendall(b'Connection: close\\r\\n\\r\\n'); d=s.recv(4096)\n"
        "    r='GOT '+d.decode(errors='replace')\n"
        "except Exception as e:\n"
        "    r='ERR '+type(e).__name__\n"
        "open('/tmp/result','w').write(r)\n"
    )
    sbx.files.write("/tmp/hold.py", script)
    sbx.commands.run("python3 /tmp/hold.py", background=True)
    for _ in range(100):
        if sbx.commands.run("test -e /tmp/connected && echo y || true", timeout=30).stdout.strip():
            break
        time.sleep(0.1)
    r = api(env["key_a"]).put(
        f"/sandboxes/{sbx.sandbox_id}/network", json={"denyOut": ["203.0.113.10"]}
    )
    assert r.status_code == 204, r.text
    sbx.commands.run("touch /tmp/go", timeout=30)
    result = ""
    for _ in range(150):
        result = sbx.commands.run("cat /tmp/result 2>/dev/null || true", timeout=30).stdout
        if result:
            break
        time.sleep(0.1)
    assert "pub-ok" not in result, f"the connection outlived the rule refusing it: {result!r}"


def test_the_app_in_a_sandbox_receives_no_credentials(env, sandbox):
    """The port proxy forwards a request to an app in the sandbox: the caller's API key and
    the sandbox's tokens must not come with it."""
    sbx = sandbox(env["key_a"])
    echo = (
        "import http.server\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        b=str(self.headers).encode(); self.send_response(200)\n"
        "        self.send_header('Content-Length',str(len(b))); self.end_headers(); self.wfile.write(b)\n"
        "    def log_message(self,*a): pass\n"
        "http.server.HTTPServer(('0.0.0.0',8001),H).serve_forever()\n"
    )
    sbx.files.write("/tmp/echo.py", echo)
    sbx.commands.run("python3 /tmp/echo.py", background=True)
    token = getattr(sbx, "_envd_access_token", None) or ""
    headers = {
        "E2b-Sandbox-Id": sbx.sandbox_id,
        "E2b-Sandbox-Port": "8001",
        "X-API-KEY": env["key_a"],
        "Authorization": "Bearer " + env["key_a"],
        "X-Access-Token": token or "t0ken",
        "X-App": "kept",
    }
    body = ""
    for _ in range(50):
        r = httpx.get(env["url"] + "/", headers=headers, timeout=30)
        body = r.text
        if r.status_code == 200:
            break
        time.sleep(0.2)
    assert "x-app: kept" in body.lower(), f"the app did not answer: {body[:300]}"
    assert env["key_a"] not in body, "the app in the sandbox received the caller's API key"
    if token:
        assert token not in body, "the app received the sandbox's envd access token"
    assert "x-access-token" not in body.lower()
