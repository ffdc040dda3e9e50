"""A volume in the key's own bucket ("bring your own bucket", docs/volumes.md): `POST /volumes`
with `storage`, against a real `sandcell serve --volume-storage-allow-private` whose bucket
and the key's are on one real SeaweedFS on loopback (run by tests/e2b/volumes_own_bucket.sh:
E2B_API_URL, E2B_API_KEY, S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY, SERVE_ERR and
SANDCELL_TEMPLATE set).

What a sandbox writes lands in the key's bucket under its prefix (listed with the S3 API);
wrong credentials are 400 naming the S3 error; the credentials are never in an answer or
the daemon's log.
"""

import datetime
import hashlib
import hmac
import os
import re
import urllib.parse
import uuid

import httpx

from e2b import Sandbox, Volume

API_URL = os.environ["E2B_API_URL"]
API_KEY = os.environ["E2B_API_KEY"]
TEMPLATE = os.environ["SANDCELL_TEMPLATE"]
S3 = os.environ["S3_ENDPOINT"]
AK = os.environ["S3_ACCESS_KEY"]
SK = os.environ["S3_SECRET_KEY"]
SERVE_ERR = os.environ["SERVE_ERR"]


def s3(method: str, path: str, query: dict | None = None) -> httpx.Response:
    """One SigV4-signed path-style call to the SeaweedFS under test (no body)."""
    query = query or {}
    now = datetime.datetime.now(datetime.timezone.utc)
    amz, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    host = urllib.parse.urlparse(S3).netloc
    payload = hashlib.sha256(b"").hexdigest()
    q = "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(str(v), safe='-_.~')}"
        for k, v in sorted(query.items())
    )
    headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz}
    signed = ";".join(sorted(headers))
    canonical = "\n".join(
        [method, urllib.parse.quote(path), q]
        + [f"{k}:{headers[k]}" for k in sorted(headers)]
        + ["", signed, payload]
    )
    scope = f"{day}/us-east-1/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    k = ("AWS4" + SK).encode()
    for part in (day, "us-east-1", "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={AK}/{scope}, SignedHeaders={signed}, Signature={sig}"
    )
    del headers["host"]
    return httpx.request(method, f"{S3}{path}" + (f"?{q}" if q else ""), headers=headers, timeout=30)


def list_keys(bucket: str, prefix: str) -> list:
    """The keys under `prefix/` in `bucket`, by ListObjectsV2 (one page of 1000 is enough)."""
    r = s3("GET", f"/{bucket}/", {"list-type": "2", "prefix": prefix + "/", "max-keys": "1000"})
    assert r.status_code == 200, r.text
    return re.findall(r"<Key>([^<]+)</Key>", r.text)


def api(method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, API_URL + path, headers={"X-API-Key": API_KEY}, timeout=120, **kw)


def own_bucket() -> str:
    name = f"own-{uuid.uuid4().hex[:10]}"
    r = s3("PUT", f"/{name}")
    assert r.status_code == 200, r.text
    return name


def storage(bucket: str, prefix: str, **over) -> dict:
    s = {
        "endpoint": S3,
        "bucket": bucket,
        "prefix": prefix,
        "accessKeyId": AK,
        "secretAccessKey": SK,
        "pathStyle": True,
    }
    s.update(over)
    return s


def test_a_volume_in_the_keys_own_bucket_keeps_what_a_sandbox_writes_there():
    bucket, prefix = own_bucket(), f"team-{uuid.uuid4().hex[:8]}"
    name = f"own-{uuid.uuid4().hex[:8]}"
    r = api("POST", "/volumes", json={"name": name, "storage": storage(bucket, prefix)})
    assert r.status_code == 201, r.text
    body = r.json()
    vid = body["volumeID"]
    assert body["storage"] == {
        "endpoint": S3,
        "bucket": bucket,
        "region": "us-east-1",
        "prefix": prefix,
        "pathStyle": True,
    }
    try:
        formatted = list_keys(bucket, prefix)
        assert f"{prefix}/juicefs_uuid" in formatted, formatted
        assert f"{prefix}/sandcell-meta/volume.json" in formatted, formatted
        assert not list_keys("sandcell", vid), "nothing in the operator's bucket"
        before = set(formatted)
        vol = Volume.get_info(vid)
        sbx = Sandbox.create(template=TEMPLATE, timeout=120, volume_mounts={"/mnt/own": vid})
        try:
            r = sbx.commands.run(
                "head -c 3145728 /dev/urandom > /mnt/own/blob && sync /mnt/own/blob && "
                "sha256sum /mnt/own/blob | cut -d' ' -f1",
                user="root",
            )
            digest = r.stdout.strip()
        finally:
            sbx.kill()
        chunks = [k for k in list_keys(bucket, prefix) if k not in before]
        assert any(k.startswith(f"{prefix}/chunks/") for k in chunks), chunks
        # Read back in a new sandbox.
        sbx = Sandbox.create(template=TEMPLATE, timeout=120, volume_mounts={"/data": vol.name})
        try:
            r = sbx.commands.run("sha256sum /data/blob | cut -d' ' -f1", user="root")
            assert r.stdout.strip() == digest
        finally:
            sbx.kill()
        # Never the credentials: not in GET, not in the list, not in the log.
        for path in ("/volumes", f"/volumes/{vid}", f"/volumes/{name}"):
            text = api("GET", path).text
            assert SK not in text and AK not in text, path
        assert vid in api("GET", "/volumes").text
    finally:
        r = api("DELETE", f"/volumes/{vid}")
        assert r.status_code == 204, r.text
    assert list_keys(bucket, prefix) == [], "its objects go with it"
    with open(SERVE_ERR, encoding="utf-8", errors="replace") as f:
        log = f.read()
    assert SK not in log, "the secret key is in the daemon's log"
    assert AK not in log, "the access key is in the daemon's log"


def test_wrong_credentials_and_a_missing_bucket_are_400_naming_the_s3_error():
    bucket = own_bucket()
    r = api("POST", "/volumes", json={"name": "bad-key", "storage": storage(bucket, "p-bad", secretAccessKey="wrong")})
    assert r.status_code == 400, r.text
    msg = r.json()["message"]
    assert "the bucket answered 403" in msg and "SignatureDoesNotMatch" in msg, msg
    assert r.json()["code"] == 400
    r = api("POST", "/volumes", json={"name": "bad-id", "storage": storage(bucket, "p-bad", accessKeyId="nobody")})
    assert r.status_code == 400 and "the bucket answered 403" in r.json()["message"], r.text
    r = api("POST", "/volumes", json={"name": "no-bucket", "storage": storage("no-such-bucket-x", "p-bad")})
    assert r.status_code == 400 and "the bucket answered 404 NoSuchBucket" in r.json()["message"], r.text
    r = api("POST", "/volumes", json={"name": "down", "storage": storage(bucket, "p-bad", endpoint="http://127.0.0.1:1")})
    assert r.status_code == 400 and "unreachable" in r.json()["message"], r.text
    r = api("POST", "/volumes", json={"name": "bad-prefix", "storage": storage(bucket, "a/b")})
    assert r.status_code == 400 and "prefix" in r.json()["message"], r.text
    names = [v["name"] for v in api("GET", "/volumes").json()]
    assert not {"bad-key", "bad-id", "no-bucket", "down", "bad-prefix"} & set(names), names
    assert list_keys(bucket, "p-bad") == []
