"""Attacks on the tenancy of templates and builds (issue 12, items 1 and "Builds"/"Id leaks").

Tenant A builds a small private template on `minimal` once (module fixture); tenant B then
tries to rebuild, delete, tag, publish, list, create from, build on (`fromTemplate`, a
tagless `fromImage`) and learn about it. Each must answer as if the template did not exist
(404, or 409 "not available" for taking the name) and leave A's template as A built it.
Then: a 409 from DELETE does not name other keys' sandboxes; a failed build's reason and
log name no host path; B's endless RUN does not hold up A's build; B's RUN cannot fill the
host's disk (run.sh bounds a build's RUN writes: `serve --build-disk-mib 512`); an oversized
upload is refused before it is read.

Builds are one RUN step on the suite's template, as tests/e2b/test_template.py's are, to
stay fast.
"""

import io
import os
import socket
import tarfile
import time
import uuid

import httpx
import pytest

# The suite's template (`base`): it has the /bin/bash the SDK's commands run with.
BASE = os.environ.get("ATTACK_TEMPLATE", "base")


def _name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def request_build(client, name, **extra):
    r = client.post("/v3/templates", json={"name": name, "cpuCount": 1, "memoryMB": 256, **extra})
    return r


def start_build(client, name, build_id, steps, **base):
    body = {"steps": steps, **(base or {"fromTemplate": BASE})}
    return client.post(f"/v2/templates/{name}/builds/{build_id}", json=body)


def wait_build(client, name, build_id, timeout=300):
    deadline = time.time() + timeout
    while True:
        r = client.get(f"/templates/{name}/builds/{build_id}/status")
        assert r.status_code == 200, r.text
        body = r.json()
        if body["status"] in ("ready", "error"):
            return body
        assert time.time() < deadline, f"build {name}/{build_id} still {body['status']}"
        time.sleep(0.5)


def build(client, name, steps, **base):
    r = request_build(client, name)
    assert r.status_code == 202, r.text
    build_id = r.json()["buildID"]
    r = start_build(client, name, build_id, steps, **base)
    assert r.status_code == 202, r.text
    return build_id, wait_build(client, name, build_id)


def run_step(cmd):
    return {"type": "RUN", "args": [cmd, "root"]}


@pytest.fixture(scope="module")
def a_private(api, env):
    """A private template of tenant A with a marker file; its name."""
    a = api(env["key_a"])
    name = _name("atk-priv")
    _, last = build(a, name, [run_step("echo built-by-a > /owner.txt")])
    assert last["status"] == "ready", last
    return name


def a_still_owns(api, env, name, sandbox):
    """A's template is there, A's, and still what A built."""
    r = api(env["key_a"]).get(f"/templates/aliases/{name}")
    assert r.status_code == 200, r.text
    sbx = sandbox(env["key_a"], template=name, timeout=60)
    assert sbx.commands.run("cat /owner.txt").stdout == "built-by-a\n"


def test_b_cannot_rebuild_a_private_template(api, env, a_private, sandbox):
    b = api(env["key_b"])
    r = request_build(b, a_private)
    assert r.status_code == 409, r.text
    assert "not available" in r.json()["message"]
    # Nor with a tag or the older SDKs' alias.
    assert request_build(b, f"{a_private}:evil").status_code == 409
    r = b.post("/v3/templates", json={"alias": a_private})
    assert r.status_code == 409, r.text
    a_still_owns(api, env, a_private, sandbox)


def test_b_cannot_delete_a_private_template(api, env, a_private, sandbox):
    b = api(env["key_b"])
    for target in (a_private, f"{a_private}:default"):
        r = b.delete(f"/templates/{target}")
        assert r.status_code == 404, r.text
    a_still_owns(api, env, a_private, sandbox)


def test_b_cannot_tag_or_read_tags_of_a_private_template(api, env, a_private):
    b = api(env["key_b"])
    r = b.post("/templates/tags", json={"target": f"{a_private}:default", "tags": ["pwned"]})
    assert r.status_code == 404, r.text
    r = b.request("DELETE", "/templates/tags", json={"name": a_private, "tags": ["default"]})
    assert r.status_code == 404, r.text
    assert b.get(f"/templates/{a_private}/tags").status_code == 404
    tags = api(env["key_a"]).get(f"/templates/{a_private}/tags").json()
    assert {t["tag"] for t in tags} == {"default"}, tags


def test_b_cannot_make_a_private_template_public(api, env, a_private):
    b = api(env["key_b"])
    for path in (f"/templates/{a_private}", f"/v2/templates/{a_private}"):
        r = b.patch(path, json={"public": True})
        assert r.status_code == 404, r.text
    assert b.get(f"/templates/aliases/{a_private}").status_code == 404


def test_b_does_not_see_a_private_template(api, env, a_private):
    b = api(env["key_b"])
    listed = [t["templateID"] for t in b.get("/templates").json()]
    assert a_private not in listed
    assert BASE in listed and "minimal" in listed, "system templates stay visible to all"
    assert b.get(f"/templates/aliases/{a_private}").status_code == 404
    a_listed = {t["templateID"]: t for t in api(env["key_a"]).get("/templates").json()}
    assert a_listed[a_private]["public"] is False


def test_b_cannot_create_a_sandbox_from_a_private_template(api, env, a_private):
    b = api(env["key_b"])
    for template in (a_private, f"{a_private}:default", f"{a_private}:nope"):
        r = b.post("/sandboxes", json={"templateID": template, "timeout": 30})
        assert r.status_code == 404, f"{template}: {r.text}"
        # The same answer as a name nobody has: nothing tells the template exists.
        assert "replaced" not in r.text and "tag" not in r.json()["message"].split("'")[0]


def test_b_cannot_build_on_a_private_template(api, env, a_private):
    b = api(env["key_b"])
    name = _name("atk-from")
    r = request_build(b, name)
    assert r.status_code == 202, r.text
    build_id = r.json()["buildID"]
    r = start_build(b, name, build_id, [run_step("cat /owner.txt")], fromTemplate=a_private)
    assert r.status_code == 400, r.text
    assert "no such template" in r.json()["message"]


def test_b_tagless_from_image_does_not_resolve_to_a_private_template(api, env, a_private):
    """`fromImage: "<A's name>"` names a registry image for B, never A's local template."""
    b = api(env["key_b"])
    name = _name("atk-img")
    r = request_build(b, name)
    assert r.status_code == 202, r.text
    build_id = r.json()["buildID"]
    r = start_build(b, name, build_id, [run_step("cat /owner.txt")], fromImage=a_private)
    if r.status_code == 202:
        last = wait_build(b, name, build_id, timeout=600)
        text = str(last)
        # Pulled from the registry (which has no such image here): it fails, and never with
        # A's file in its output.
        assert last["status"] == "error", last
        assert "built-by-a" not in text
        assert "docker.io/library" in text or "registry" in text.lower(), last
    else:
        assert r.status_code == 400, r.text


def test_delete_conflict_does_not_list_other_keys_sandboxes(api, env, sandbox):
    a, b = api(env["key_a"]), api(env["key_b"])
    name = _name("atk-pub")
    _, last = build(a, name, [run_step("echo shared > /shared.txt")])
    assert last["status"] == "ready", last
    assert a.patch(f"/templates/{name}", json={"public": True}).status_code == 200
    # B may use a public template, but still not change it.
    victim = sandbox(env["key_b"], template=name, timeout=120)
    assert b.delete(f"/templates/{name}").status_code == 403
    assert b.patch(f"/templates/{name}", json={"public": False}).status_code == 403
    r = a.delete(f"/templates/{name}")
    assert r.status_code == 409, r.text
    assert victim.sandbox_id not in r.text
    assert victim.sandbox_id.split("-")[0] not in r.text
    assert "other keys" in r.json()["message"], r.text
    victim.kill()


def _tar(files):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_build_errors_carry_no_host_paths(api, env):
    """A COPY of a file the upload lacks, and a RUN the sandbox cannot start: the reason and
    log say what failed without the daemon's data or run dir paths (layer and overlay
    directories, with their ids)."""
    b = api(env["key_b"])
    name = _name("atk-path")
    files_hash = uuid.uuid4().hex + uuid.uuid4().hex
    link = b.get(f"/templates/{name}/files/{files_hash}").json()
    put = httpx.put(link["url"], content=_tar({"present.txt": b"x"}), timeout=60)
    assert put.status_code == 200, put.text
    r = request_build(b, name)
    assert r.status_code == 202, r.text
    build_id = r.json()["buildID"]
    steps = [
        {"type": "COPY", "args": ["missing.txt", "/x/"], "filesHash": files_hash},
        run_step("true"),
    ]
    r = start_build(b, name, build_id, steps)
    assert r.status_code == 202, r.text
    last = wait_build(b, name, build_id)
    assert last["status"] == "error", last
    text = str(last)
    for host_dir in (env["data_dir"], env["run_dir"], os.path.realpath(env["data_dir"])):
        assert host_dir not in text, f"{host_dir} in {text}"
    assert "/cache/" not in text and "/layers/" not in text, text


def test_b_endless_build_does_not_block_a_build(api, env):
    """B's build sleeps (as `RUN sleep infinity` would, bounded so that it ends on its own
    well within this suite's default step deadline, and is waited for: a daemon stopped
    mid-build leaves the step's overlay mount behind); A's build runs and finishes
    meanwhile. The deadline itself: crates/server/tests/template_limits.rs."""
    a, b = api(env["key_a"]), api(env["key_b"])
    slow = _name("atk-slow")
    r = request_build(b, slow)
    assert r.status_code == 202, r.text
    slow_id = r.json()["buildID"]
    assert start_build(b, slow, slow_id, [run_step("sleep 45")]).status_code == 202
    # B's step is running before A asks.
    deadline = time.time() + 60
    while "sleep" not in str(b.get(f"/templates/{slow}/builds/{slow_id}/status").json()):
        assert time.time() < deadline, "B's build never reached its RUN step"
        time.sleep(0.5)
    _, last = build(a, _name("atk-quick"), [run_step("echo quick > /q")])
    assert last["status"] == "ready", last
    r = b.get(f"/templates/{slow}/builds/{slow_id}/status")
    assert r.json()["status"] == "building", "B's build was to be still running"
    assert wait_build(b, slow, slow_id, timeout=180)["status"] == "ready"


def _blocks_under(path):
    """Bytes the files under `path` take on the host (allocated blocks, links not followed)."""
    total = 0
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            try:
                total += os.lstat(os.path.join(root, n)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def test_b_build_cannot_fill_the_host_disk(api, env):
    """B's RUN writes 2 GiB (`dd`) where the daemon bounds a build's RUN writes at 512 MiB:
    ENOSPC inside, the build fails with a reason naming the limit and its flag, and nothing
    it wrote is left on the host: no step disk or mount under the data dir, the layer cache
    no larger than before (give or take a few MiB). Unbounded, the dd succeeded and its 2 GiB
    stayed in the layer cache."""
    b = api(env["key_b"])
    cache = os.path.join(env["data_dir"], "cache")
    before = _blocks_under(cache)
    _, last = build(b, _name("atk-fill"), [run_step("dd if=/dev/zero of=/fill bs=1M count=2048")])
    assert last["status"] == "error", last
    reason = str(last.get("reason", last))
    assert "--build-disk-mib" in reason and "512 MiB" in reason, reason
    assert "No space left on device" in str(last), last
    grown = _blocks_under(cache) - before
    assert grown < 32 << 20, f"the layer cache grew by {grown} bytes"
    left = [os.path.join(r, n) for r, ds, fs in os.walk(env["data_dir"]) for n in ds + fs
            if n in ("disk.ext4",) or (n == "disk" and "/cache/layers/" in r)]
    assert not left, left
    with open("/proc/self/mountinfo") as f:
        mounts = [l for l in f if os.path.join(env["data_dir"], "cache") in l]
    assert not mounts, mounts
    # B still builds under the limit.
    _, ok = build(b, _name("atk-fits"), [run_step("dd if=/dev/zero of=/fits bs=1M count=16")])
    assert ok["status"] == "ready", ok


def test_oversized_upload_is_refused_before_it_is_read(api, env):
    """An upload announcing 64 GiB is 413 after its first bytes, not after 64 GiB (raw
    socket: HTTP clients will not send less than they announce)."""
    b = api(env["key_b"])
    files_hash = uuid.uuid4().hex + uuid.uuid4().hex
    url = httpx.URL(b.get(f"/templates/atk-up/files/{files_hash}").json()["url"])
    target = url.raw_path.decode()
    with socket.create_connection((url.host, url.port), timeout=60) as conn:
        conn.sendall(
            f"PUT {target} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
            f"Content-Length: {64 << 30}\r\n\r\n".encode()
            + b"\0" * 65536
        )
        answer = conn.recv(4096).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 413"), answer
    uploads = os.path.join(env["data_dir"], "cache/e2b-files")
    left = [n for _, _, names in os.walk(uploads) for n in names if n.startswith(".upload-")]
    assert not left, left


def test_from_image_on_the_host_loopback_is_refused(api, env):
    """`fromImage` naming a registry on the host's loopback (the canary service) or the
    metadata address: the pull is refused before a request is sent, and the reason carries
    nothing the service answered."""
    b = api(env["key_b"])
    for image in (f"127.0.0.1:{env['canary_port']}/x:1", "169.254.169.254/latest:1"):
        name = _name("atk-ssrf")
        r = request_build(b, name)
        assert r.status_code == 202, r.text
        build_id = r.json()["buildID"]
        r = start_build(b, name, build_id, [run_step("true")], fromImage=image)
        assert r.status_code == 202, r.text
        last = wait_build(b, name, build_id, timeout=120)
        assert last["status"] == "error", last
        assert "internal address" in last["reason"]["message"], last
        assert env["canary"] not in str(last)
