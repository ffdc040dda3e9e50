"""The registry `e2b` Python SDK's `Volume` class and `volume_mounts`, unmodified, against a
real `sandcell serve` whose bucket is a real SeaweedFS (run through tests/e2b/run.sh:
E2B_API_URL, E2B_API_KEY, E2B_VOLUME_API_URL, SANDCELL_OTHER_KEY and SANDCELL_TEMPLATE set).

A volume outlives its sandboxes: what one writes, the next one mounting it reads, byte for
byte. Another key neither sees nor mounts it; a mounted one is not deleted.
"""

import os
import uuid

import httpx
import pytest

from e2b import Sandbox, Volume

API_URL = os.environ["E2B_API_URL"]
API_KEY = os.environ["E2B_API_KEY"]
OTHER_KEY = os.environ["SANDCELL_OTHER_KEY"]
TEMPLATE = os.environ["SANDCELL_TEMPLATE"]


# SeaweedFS's filer (tests/lib/volumes.sh's `weed mini`) shows the bucket's objects as files.
FILER = "http://127.0.0.1:8888/buckets/sandcell"


def bucket_objects(prefix: str) -> list:
    """The objects under `prefix/` (the filer keeps emptied directories: not counted)."""
    found, todo = [], [prefix]
    while todo:
        d = todo.pop()
        r = httpx.get(f"{FILER}/{d}/", params={"limit": 10000}, headers={"Accept": "application/json"})
        if r.status_code == 404:
            continue
        r.raise_for_status()
        for e in r.json().get("Entries") or []:
            path = e["FullPath"].split("/buckets/sandcell/", 1)[-1]
            # A directory entry has no chunks and its mode has the directory bit.
            if e.get("Mode", 0) & 0o20000000000:
                todo.append(path)
            else:
                found.append(path)
    return found


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def api(method: str, path: str, key: str = API_KEY, **kw) -> httpx.Response:
    return httpx.request(method, API_URL + path, headers={"X-API-Key": key}, timeout=120, **kw)


@pytest.fixture
def vol():
    v = Volume.create(unique("vol"))
    yield v
    Volume.destroy(v.volume_id)


def test_create_get_list_destroy():
    name = unique("py-vol")
    v = Volume.create(name)
    assert v.volume_id.startswith("vol-")
    assert v.name == name
    assert v.token
    info = Volume.get_info(v.volume_id)
    assert (info.volume_id, info.name, info.token) == (v.volume_id, name, v.token)
    assert Volume.get_info(name).volume_id == v.volume_id, "by name too"
    assert v.volume_id in [x.volume_id for x in Volume.list()]
    assert bucket_objects(v.volume_id), "its filesystem is made in the bucket"
    assert Volume.destroy(v.volume_id) is True
    assert bucket_objects(v.volume_id) == [], "its objects go with it"
    assert Volume.destroy(v.volume_id) is False, "404 the second time"
    assert v.volume_id not in [x.volume_id for x in Volume.list()]


def test_files_outlive_the_sandbox_that_wrote_them(vol):
    sbx = Sandbox.create(template=TEMPLATE, timeout=120, volume_mounts={"/mnt/vol": vol})
    try:
        info = sbx.get_info()
        assert [(m["name"], m["path"]) for m in info.volume_mounts] == [(vol.name, "/mnt/vol")]
        # 64 MiB of random bytes, a tree of small files, written and fsynced; and by the
        # SDK's default user, not only root.
        r = sbx.commands.run(
            "set -e; head -c 67108864 /dev/urandom > /mnt/vol/blob; "
            "mkdir -p /mnt/vol/tree; for i in $(seq 200); do echo $i > /mnt/vol/tree/f$i; done; "
            "sync; sha256sum /mnt/vol/blob | cut -d' ' -f1; "
            "cat /mnt/vol/tree/* | sha256sum | cut -d' ' -f1",
            user="root",
            timeout=300,
        )
        blob_sum, tree_sum = r.stdout.split()
        sbx.files.write("/mnt/vol/by-user.txt", "written by user")
        assert sbx.commands.run("stat -c %U /mnt/vol/by-user.txt").stdout.strip() == "user"
    finally:
        sbx.kill()

    again = Sandbox.create(template=TEMPLATE, timeout=120, volume_mounts={"/data": vol.name})
    try:
        r = again.commands.run(
            "sha256sum /data/blob | cut -d' ' -f1; cat /data/tree/* | sha256sum | cut -d' ' -f1",
            timeout=300,
        )
        assert r.stdout.split() == [blob_sum, tree_sum]
        assert again.files.read("/data/by-user.txt") == "written by user"
        # The volume's top is its data only: JuiceFS's own files (.config holds the
        # bucket's settings) are not reachable.
        listing = again.commands.run("ls -a /data").stdout.split()
        assert sorted(listing) == [".", "..", "blob", "by-user.txt", "tree"]
    finally:
        again.kill()


def test_a_mounted_volume_is_not_deleted_and_its_sandbox_not_snapshotted(vol):
    sbx = Sandbox.create(template=TEMPLATE, timeout=120, volume_mounts={"/mnt/vol": vol})
    try:
        r = api("DELETE", f"/volumes/{vol.volume_id}")
        assert r.status_code == 409, r.text
        assert sbx.sandbox_id in r.json()["message"]
        for path in ("pause", "snapshots", "fork"):
            r = api("POST", f"/sandboxes/{sbx.sandbox_id}/{path}", json={})
            assert r.status_code == 409, (path, r.text)
            assert "volume" in r.json()["message"]
        assert sbx.commands.run("echo ok > /mnt/vol/still && cat /mnt/vol/still").stdout == "ok\n"
    finally:
        sbx.kill()
    # Once its sandbox is gone, it goes (the fixture's destroy then finds nothing).
    assert api("DELETE", f"/volumes/{vol.volume_id}").status_code == 204


def test_another_key_neither_sees_nor_mounts_it(vol):
    assert api("GET", f"/volumes/{vol.volume_id}", key=OTHER_KEY).status_code == 404
    assert api("GET", f"/volumes/{vol.name}", key=OTHER_KEY).status_code == 404
    assert api("DELETE", f"/volumes/{vol.volume_id}", key=OTHER_KEY).status_code == 404
    listed = api("GET", "/volumes", key=OTHER_KEY).json()
    assert vol.volume_id not in [v["volumeID"] for v in listed]
    for name in (vol.name, vol.volume_id):
        r = api(
            "POST",
            "/sandboxes",
            key=OTHER_KEY,
            json={"templateID": TEMPLATE, "volumeMounts": [{"name": name, "path": "/mnt/x"}]},
        )
        assert r.status_code == 404, r.text
    # Still there for its own key.
    assert Volume.get_info(vol.volume_id).name == vol.name


def test_the_sdks_volume_content_calls_round_trip(vol):
    """`Volume.write_file/read_file/list/make_dir/get_info/update_metadata/remove` without a
    sandbox, and a sandbox sees what they wrote (and the other way round)."""
    blob = os.urandom(3 * 1024 * 1024 + 17)
    vol.make_dir("/docs/deep", force=True)
    entry = vol.write_file("/docs/deep/blob.bin", blob)
    assert (entry.name, entry.size) == ("blob.bin", len(blob))
    vol.write_file("/docs/note.txt", "hello volume")
    assert vol.read_file("/docs/note.txt") == "hello volume"
    assert vol.read_file("/docs/deep/blob.bin", format="bytes") == blob
    assert b"".join(vol.read_file("/docs/deep/blob.bin", format="stream")) == blob
    names = sorted(e.path for e in vol.list("/docs", depth=2))
    assert names == ["/docs/deep", "/docs/deep/blob.bin", "/docs/note.txt"]
    assert [e.name for e in vol.list("/docs")] == ["deep", "note.txt"]
    info = vol.get_info("/docs/note.txt")
    assert info.size == len("hello volume")
    changed = vol.update_metadata("/docs/note.txt", mode=0o600, uid=1000, gid=1000)
    assert (changed.mode & 0o777, changed.uid, changed.gid) == (0o600, 1000, 1000)
    assert vol.exists("/docs/deep") and not vol.exists("/nope")

    sbx = Sandbox.create(template=TEMPLATE, timeout=120, volume_mounts={"/v": vol})
    try:
        r = sbx.commands.run("sha256sum /v/docs/deep/blob.bin | cut -d' ' -f1; cat /v/docs/note.txt")
        import hashlib

        assert r.stdout.split("\n")[0] == hashlib.sha256(blob).hexdigest()
        assert r.stdout.split("\n")[1] == "hello volume"
        # A guest's links into the host: the content API never follows them.
        sbx.commands.run(
            "echo from-guest > /v/guest.txt; ln -s /etc /v/etc-link; ln -s /etc/hostname /v/h-link",
            user="root",
        )
    finally:
        sbx.kill()
    assert vol.read_file("/guest.txt") == "from-guest\n"
    assert vol.get_info("/h-link").type.value == "symlink"
    headers = {"Authorization": f"Bearer {vol.token}"}
    base = f"{API_URL}/volumecontent/{vol.volume_id}"
    for method, route, path in (
        ("GET", "file", "/h-link"),
        ("GET", "file", "/etc-link/hostname"),
        ("GET", "dir", "/etc-link"),
        ("PUT", "file", "/etc-link/planted"),
        ("PUT", "file", "/h-link"),
        ("POST", "dir", "/etc-link/x"),
        ("GET", "file", "/../../etc/hostname"),
    ):
        r = httpx.request(method, f"{base}/{route}", params={"path": path}, headers=headers, content=b"x")
        assert r.status_code == 400, (method, route, path, r.status_code, r.text)
    vol.remove("/etc-link")
    assert os.path.exists("/etc/hostname"), "the link went, not its target"
    vol.remove("/docs")
    assert not vol.exists("/docs")
    # The token is the volume's own.
    bad = httpx.get(f"{base}/dir", params={"path": "/"}, headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401
    assert httpx.get(f"{base}/dir", params={"path": "/"}).status_code == 401


def test_misuse_is_refused_with_the_right_status(vol):
    for bad in ("", "a/b", "x" * 65, "spa ce"):
        r = api("POST", "/volumes", json={"name": bad})
        assert r.status_code == 400, (bad, r.text)
    assert api("POST", "/volumes", json={}).status_code == 400
    r = api("POST", "/volumes", json={"name": vol.name})
    assert r.status_code == 409, r.text
    assert api("GET", "/volumes/vol-0000000000000000").status_code == 404
    assert api("DELETE", "/volumes/no-such-volume").status_code == 404

    def create(mounts, **extra):
        return api("POST", "/sandboxes", json={"templateID": TEMPLATE, "volumeMounts": mounts, **extra})

    for path in ("relative", "/", "/proc", "/dev/x", "/mnt/../etc", "/mnt//x", "/run/sandcell-host"):
        r = create([{"name": vol.name, "path": path}])
        assert r.status_code == 400, (path, r.text)
    r = create([{"name": vol.name, "path": "/a"}, {"name": vol.name, "path": "/b"}])
    assert r.status_code == 400, r.text
    r = create([{"name": "no-such-volume", "path": "/a"}])
    assert r.status_code == 404, r.text
    r = create([{"name": vol.name, "path": "/a"}], autoPause=True)
    assert r.status_code == 400, r.text
    # None of those left a sandbox holding the volume.
    assert api("DELETE", f"/volumes/{vol.volume_id}").status_code == 204


def test_own_storage_on_loopback_is_refused_without_the_operator_flag():
    """A key may not point the daemon at the host's loopback (or private) services: this
    daemon runs without --volume-storage-allow-private (tests/e2b/volumes_own_bucket.sh
    runs one with it)."""
    for endpoint in ("http://127.0.0.1:8333", "http://localhost:8333", "http://[::1]:8333", "http://169.254.169.254"):
        r = api("POST", "/volumes", json={"name": unique("own"), "storage": {
            "endpoint": endpoint, "bucket": "sandcell", "accessKeyId": "a",
            "secretAccessKey": "never-logged-1", "pathStyle": True}})
        assert r.status_code == 400, (endpoint, r.text)
        assert "--volume-storage-allow-private" in r.json()["message"], r.text
        assert "never-logged-1" not in r.text
