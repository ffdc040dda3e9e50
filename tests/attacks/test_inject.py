"""Secrets injection at the network layer (issue 17): a `network.rules` transform with a
`${e2b.secrets.<name>}` placeholder (the stock SDK's `Secret.fill`), filled on the host for
plain HTTP to the rule's domain, and every way a sandbox could try to get the value out.

The fake internet's recording upstream (run.sh, recorder.py) answers api.bars.test and
other.bars.test (one address, ports 80 and 8080) and writes down every request's headers:
the assertions read what actually arrived there.
"""

import json
import os
import shlex
import uuid

import pytest
from e2b import Secret

RECORDS = os.environ["ATTACK_RECORDS"]
API = "api.bars.test"
OTHER = "other.bars.test"


def records_for(tag):
    """The requests the upstream received whose path holds `tag`."""
    out = []
    with open(RECORDS) as f:
        for line in f:
            r = json.loads(line)
            if tag in r["path"]:
                r["h"] = {k.lower(): v for k, v in r["headers"]}
                out.append(r)
    return out


def run(sbx, cmd):
    return sbx.commands.run(cmd, timeout=60, on_stderr=lambda _: None)


def curl(sbx, url, *args):
    quoted = " ".join(shlex.quote(a) for a in args)
    r = sbx.commands.run(
        f"curl -s -o /dev/stdout -w ' %{{http_code}}' --max-time 10 {quoted} {shlex.quote(url)} || true",
        timeout=60,
    )
    return r.stdout


@pytest.fixture
def secret(env):
    """A secret of tenant A: (name, value); destroyed after the test."""
    name = f"inj-{uuid.uuid4().hex[:8]}"
    value = "sk-inj-" + uuid.uuid4().hex
    Secret.create(name, value, api_key=env["key_a"])
    yield name, value
    Secret.destroy(name, api_key=env["key_a"])


def rules_for(name):
    return {API: [{"transform": {"headers": {"Authorization": "Bearer " + Secret.fill(name)}}}]}


def injected(env, sandbox, name):
    return sandbox(
        env["key_a"],
        network={"allow_out": [API, OTHER], "rules": rules_for(name)},
    )


def test_the_header_arrives_filled_on_every_request_and_the_value_is_not_in_the_sandbox(
    env, api, sandbox, secret
):
    name, value = secret
    sbx = injected(env, sandbox, name)
    tag = uuid.uuid4().hex
    # Two requests on one connection (curl reuses it): both filled, the client's own
    # Authorization replaced.
    out = curl(sbx, f"http://{API}/{tag}-1", "-H", "Authorization: mine", f"http://{API}/{tag}-2")
    assert out.count("200") == 2, out
    got = records_for(tag)
    assert len(got) == 2, got
    for r in got:
        assert r["h"]["authorization"] == f"Bearer {value}", r
    # Shown back as E2B shows it (the REST answer and the SDK's reading of it).
    info = api(env["key_a"]).get(f"/sandboxes/{sbx.sandbox_id}").json()
    assert info["network"]["rules"] == rules_for(name), info
    assert sbx.get_info().network["rules"] == rules_for(name)
    # Nowhere in the sandbox: env, the processes' environments, the files it can read.
    scan = run(
        sbx,
        f"env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; "
        f"grep -rIl {shlex.quote(value)} /etc /home /tmp /root /run /var 2>/dev/null; true",
    )
    assert value not in scan.stdout
    # Audit: the owner sees the injection (name and version, never the value).
    log = api(env["key_a"]).get(f"/sandboxes/{sbx.sandbox_id}/network/log")
    assert log.status_code == 200, log.text
    inj = [i for i in log.json()["injections"] if i["secret"] == name]
    assert len(inj) >= 2 and all(i["version"] == 1 and i["domain"] == API for i in inj), inj
    assert value not in log.text
    with open(env["daemon_log"]) as f:
        assert value not in f.read(), "the value is in the daemon's log"


def test_the_placeholder_to_another_domain_port_or_through_a_redirect_gets_no_value(
    env, sandbox, secret
):
    name, value = secret
    sbx = injected(env, sandbox, name)
    tag = uuid.uuid4().hex
    ph = "Authorization: Bearer " + Secret.fill(name)
    curl(sbx, f"http://{OTHER}/{tag}-other", "-H", ph)
    curl(sbx, f"http://{API}:8080/{tag}-port", "-H", ph)
    # A forged Host on the rule's address: the proxy's Host check sends it to other.
    curl(sbx, f"http://{API}/{tag}-forged", "-H", f"Host: {OTHER}", "-H", ph)
    curl(sbx, f"http://{API}/redirect?{tag}", "-L", "--location-trusted", "-H", ph)
    got = records_for(tag) + records_for("/landed")
    assert any(r["path"].endswith("-other") for r in got), got
    assert any(r["path"].endswith("-port") for r in got), got
    for r in got:
        if r["path"].startswith("/redirect"):
            continue  # the rule's own domain: filled, as it should be
        assert value not in json.dumps(r), r


def test_another_host_on_the_same_connection_is_refused_before_it_leaves(env, sandbox, secret):
    name, value = secret
    sbx = injected(env, sandbox, name)
    tag = uuid.uuid4().hex
    script = (
        f"exec 3<>/dev/tcp/{API}/80; "
        f"printf 'GET /{tag}-first HTTP/1.1\\r\\nHost: {API}\\r\\n\\r\\n"
        f"GET /{tag}-second HTTP/1.1\\r\\nHost: {OTHER}\\r\\nAuthorization: x\\r\\n\\r\\n' >&3; "
        "timeout 5 cat <&3; true"
    )
    out = run(sbx, f"bash -c {shlex.quote(script)}").stdout
    assert "403" in out, out
    got = records_for(tag)
    assert [r["path"] for r in got] == [f"/{tag}-first"], got
    assert got[0]["h"]["authorization"] == f"Bearer {value}"


def test_a_deleted_secret_or_a_removed_rule_sends_no_value(env, api, sandbox, secret):
    name, value = secret
    sbx = injected(env, sandbox, name)
    tag = uuid.uuid4().hex
    ph = "Authorization: Bearer " + Secret.fill(name)
    # The rule removed live: requests leave as the sandbox wrote them.
    r = api(env["key_a"]).put(
        f"/sandboxes/{sbx.sandbox_id}/network", json={"allowOut": [API, OTHER]}
    )
    assert r.status_code == 204, r.text
    curl(sbx, f"http://{API}/{tag}-norule", "-H", ph)
    got = records_for(f"{tag}-norule")
    assert len(got) == 1 and got[0]["h"]["authorization"] == ph.split(": ", 1)[1], got
    # Back, then the secret deleted: refused with a 502, nothing sent.
    r = api(env["key_a"]).put(
        f"/sandboxes/{sbx.sandbox_id}/network",
        json={"allowOut": [API, OTHER], "rules": rules_for(name)},
    )
    assert r.status_code == 204, r.text
    assert "200" in curl(sbx, f"http://{API}/{tag}-back")
    assert records_for(f"{tag}-back")[0]["h"]["authorization"] == f"Bearer {value}"
    Secret.destroy(name, api_key=env["key_a"])
    out = curl(sbx, f"http://{API}/{tag}-deleted")
    assert out.strip().endswith("502"), out
    assert records_for(f"{tag}-deleted") == []


def test_another_key_naming_the_secret_gets_nothing(env, sandbox, secret):
    name, value = secret
    sbx = sandbox(env["key_b"], network={"allow_out": [API], "rules": rules_for(name)})
    tag = uuid.uuid4().hex
    out = curl(sbx, f"http://{API}/{tag}-b")
    assert out.strip().endswith("502"), out
    assert records_for(tag) == []


def test_rules_are_checked_at_create_and_on_update(env, api, sandbox):
    a = api(env["key_a"])
    hdr = {"transform": {"headers": {"Authorization": "${e2b.secrets.k}"}}}
    bad = [
        ({"allowOut": [OTHER], "rules": {API: [hdr]}}, "allowOut"),
        ({"allowOut": [API], "rules": {API: [hdr, hdr]}}, "one transform"),
        ({"allowOut": ["*.bars.test"], "rules": {"*.bars.test": [hdr]}}, "domain name"),
        (
            {"allowOut": [API], "rules": {API: [{"transform": {"headers": {
                f"X-{i}": f"${{e2b.secrets.s{i}}}" for i in range(33)}}}]}},
            "at most 32",
        ),
        (
            {"allowOut": [API], "rules": {API: [{"transform": {"headers": {
                "A": "${e2b.secrets.unclosed"}}}]}},
            "not closed",
        ),
    ]
    for network, why in bad:
        r = a.post("/sandboxes", json={"templateID": env["template"], "timeout": 60, "network": network})
        assert r.status_code == 400 and why in r.json()["message"], (network, r.text)
    sbx = sandbox(env["key_a"], network={"allow_out": [API]})
    for network, why in bad:
        r = a.put(f"/sandboxes/{sbx.sandbox_id}/network", json=network)
        assert r.status_code == 400 and why in r.json()["message"], (network, r.text)


# --- HTTPS: the daemon intercepts it for rule domains (the default), --egress-extra-ca (run.sh) ---


def test_https_to_the_rule_domain_is_filled_and_verifies_with_the_sandboxs_own_store(
    env, sandbox, secret
):
    name, value = secret
    sbx = injected(env, sandbox, name)
    tag = uuid.uuid4().hex
    # No -k, no CA option: curl, Python and Node each trust the daemon's CA through the
    # store /init installed (and the env vars that point Python and Node at it).
    out = curl(sbx, f"https://{API}/{tag}-curl1", "-H", "Authorization: mine", f"https://{API}/{tag}-curl2")
    assert out.count("200") == 2, out
    py = (
        "import urllib.request; "
        f"print(urllib.request.urlopen('https://{API}/{tag}-python', timeout=10).status)"
    )
    assert run(sbx, f"python3 -c {shlex.quote(py)}").stdout.strip() == "200"
    js = f"fetch('https://{API}/{tag}-node').then(r => console.log(r.status))"
    assert run(sbx, f"node -e {shlex.quote(js)}").stdout.strip() == "200"
    got = records_for(tag)
    assert sorted(r["path"].rsplit("-", 1)[1] for r in got) == ["curl1", "curl2", "node", "python"], got
    for r in got:
        assert r["port"] == 443 and r["h"]["authorization"] == f"Bearer {value}", r
    # What the sandbox trusts is the daemon's CA, and only its certificate (never the key).
    with open(os.path.join(env["data_dir"], "egress-ca.pem")) as f:
        ca = f.read().strip()
    anchor = run(sbx, "cat /usr/local/share/ca-certificates/sandcell-egress.crt").stdout.strip()
    assert anchor == ca
    bundle = run(sbx, "cat /etc/ssl/certs/ca-certificates.crt").stdout
    assert bundle.count("BEGIN sandcell egress CA") == 1 and ca in bundle
    issuer = run(sbx, f"curl -sv -o /dev/null https://{API}/{tag}-issuer 2>&1 | grep -i issuer; true")
    assert "Sandcell egress proxy CA" in issuer.stdout, issuer.stdout
    scan = run(
        sbx,
        f"env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; "
        f"grep -rIl {shlex.quote(value)} /etc /home /tmp /root /run /var /usr/local 2>/dev/null; true",
    )
    assert value not in scan.stdout
    keys = run(sbx, "grep -rIl 'PRIVATE KEY' /etc/ssl /usr/local/share/ca-certificates 2>/dev/null; true")
    assert keys.stdout.strip() == "", keys.stdout


def test_https_to_a_domain_without_a_rule_is_not_intercepted_and_gets_no_value(
    env, sandbox, secret
):
    name, value = secret
    sbx = injected(env, sandbox, name)
    tag = uuid.uuid4().hex
    ph = "Authorization: Bearer " + Secret.fill(name)
    # Passed through on its SNI: the certificate is the upstream's own, which the sandbox
    # does not trust (curl's 60), so nothing the daemon signs stands in for other.bars.test.
    r = run(sbx, f"curl -s -o /dev/null --max-time 10 https://{OTHER}/{tag}-verify; echo rc=$?")
    assert "rc=60" in r.stdout, r.stdout
    # Told to skip verification, the request arrives as the sandbox wrote it.
    out = curl(sbx, f"https://{OTHER}/{tag}-skip", "-k", "-H", ph)
    assert out.strip().endswith("200"), out
    got = records_for(f"{tag}-skip")
    assert len(got) == 1 and got[0]["h"]["authorization"] == ph.split(": ", 1)[1], got
    assert value not in json.dumps(records_for(tag))


def _files_holding(needle: bytes, *roots):
    """Every regular file under `roots` (links not followed) whose bytes hold `needle`."""
    hits = []
    for root in roots:
        for dirpath, _dirs, files in os.walk(root, followlinks=False):
            for f in files:
                path = os.path.join(dirpath, f)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                try:
                    with open(path, "rb") as fh:
                        tail = b""
                        while chunk := fh.read(8 << 20):
                            if needle in tail + chunk:
                                hits.append(path)
                                break
                            tail = chunk[-len(needle):]
                except OSError:
                    continue
    return hits


def test_the_value_is_in_no_snapshot_checkpoint_or_file_of_the_daemon(env, api, sandbox, secret):
    name, value = secret
    sbx = injected(env, sandbox, name)
    tag = uuid.uuid4().hex
    assert curl(sbx, f"http://{API}/{tag}-http").strip().endswith("200")
    assert curl(sbx, f"https://{API}/{tag}-https").strip().endswith("200")
    got = records_for(tag)
    assert len(got) == 2 and all(r["h"]["authorization"] == f"Bearer {value}" for r in got), got
    a = api(env["key_a"])
    r = a.post(f"/sandboxes/{sbx.sandbox_id}/snapshots", json={})
    assert r.status_code == 201, r.text
    r = a.post(f"/sandboxes/{sbx.sandbox_id}/pause", json={})
    assert r.status_code == 204, r.text
    # The sandbox's memory and files as saved (the snapshot, the paused checkpoint) and
    # everything else the daemon keeps on disk: the value is sealed in the database only.
    hits = _files_holding(value.encode(), env["data_dir"], env["run_dir"])
    assert hits == [], f"the value is in {hits}"
    # The scan does read the saved memory: the request's tag (in the sandbox's processes'
    # memory, as the placeholder would be) is found there.
    assert _files_holding(tag.encode(), env["data_dir"]), "no saved memory holds the tag"
    r = a.post(f"/sandboxes/{sbx.sandbox_id}/connect", json={"timeout": 120})
    assert r.status_code in (200, 201), r.text
    assert curl(sbx, f"http://{API}/{tag}-resumed").strip().endswith("200")
    assert records_for(f"{tag}-resumed")[0]["h"]["authorization"] == f"Bearer {value}"
