"""The registry `e2b` Python SDK's `Secret` class, unmodified, against a real `sandcell serve`
(run through tests/e2b/run.sh: E2B_API_URL, E2B_API_KEY and SANDCELL_OTHER_KEY are set).

Values are write-only: no answer the SDK reads carries one.
"""

import os
import uuid

import httpx
import pytest

from e2b import InvalidArgumentException, Secret, SecretException, SecretNotFoundException

API_URL = os.environ["E2B_API_URL"]
API_KEY = os.environ["E2B_API_KEY"]
OTHER_KEY = os.environ["SANDCELL_OTHER_KEY"]
VALUE = "sk-py-" + uuid.uuid4().hex


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_create_get_update_list_destroy():
    name = unique("Py-Key")
    info = Secret.create(name, VALUE, metadata={"owner": "py"})
    assert info.secret_id.startswith("sec_")
    assert info.name == name.lower()
    assert info.version == 1
    assert info.metadata == {"owner": "py"}
    assert info.created_at == info.updated_at

    assert Secret.get_info(info.secret_id).name == name.lower()
    assert Secret.get_info(name.upper()).secret_id == info.secret_id
    assert Secret.exists(name)

    updated = Secret.update(name, VALUE + "-2")
    assert updated.version == 2
    assert updated.metadata == {"owner": "py"}
    updated = Secret.update(info.secret_id, VALUE + "-3", metadata={"owner": "py", "v": "3"})
    assert (updated.version, updated.metadata) == (3, {"owner": "py", "v": "3"})
    assert updated.updated_at >= info.updated_at

    seen = []
    paginator = Secret.list(limit=1)
    while paginator.has_next:
        page = paginator.next_items()
        assert len(page) <= 1
        seen.extend(s.secret_id for s in page)
    assert info.secret_id in seen

    assert Secret.destroy(name) is True
    assert Secret.destroy(name) is False
    assert not Secret.exists(info.secret_id)
    with pytest.raises(SecretNotFoundException):
        Secret.get_info(name)
    with pytest.raises(SecretNotFoundException):
        Secret.update(name, "x")


def test_no_answer_carries_the_value():
    name = unique("raw")
    info = Secret.create(name, VALUE)
    headers = {"X-API-KEY": API_KEY}
    try:
        for method, path in [
            ("GET", "/secrets"),
            ("GET", f"/secrets/{info.secret_id}"),
            ("GET", f"/secrets/{name}"),
            ("GET", "/openapi.json"),
            ("GET", "/metrics"),
        ]:
            r = httpx.request(method, API_URL + path, headers=headers)
            assert r.status_code == 200, (path, r.text)
            assert VALUE not in r.text, path
    finally:
        Secret.destroy(info.secret_id)


def test_another_key_neither_sees_nor_changes_them():
    name = unique("mine")
    info = Secret.create(name, VALUE)
    try:
        other = {"api_key": OTHER_KEY}
        assert not Secret.exists(name, **other)
        assert not Secret.exists(info.secret_id, **other)
        with pytest.raises(SecretNotFoundException):
            Secret.update(info.secret_id, "stolen", **other)
        assert Secret.destroy(name, **other) is False
        ids = []
        paginator = Secret.list(**other)
        while paginator.has_next:
            ids.extend(s.secret_id for s in paginator.next_items())
        assert info.secret_id not in ids
        # Same name, its own secret.
        theirs = Secret.create(name, "theirs", **other)
        assert theirs.secret_id != info.secret_id
        Secret.destroy(theirs.secret_id, **other)
        assert Secret.get_info(name).version == 1
    finally:
        Secret.destroy(info.secret_id)


def test_e2b_bounds_and_conflicts():
    name = unique("dup")
    Secret.create(name, VALUE)
    try:
        with pytest.raises(SecretException) as e:
            Secret.create(name.upper(), VALUE)
        assert "already exists" in str(e.value)
        for bad_name in ["has space", "sec_reserved", "a" * 129, "dot.name"]:
            with pytest.raises(SecretException) as e:
                Secret.create(bad_name, VALUE)
            assert "invalid secret name" in str(e.value)
        with pytest.raises(SecretException) as e:
            Secret.create(unique("meta"), VALUE, metadata={f"k{i}": "v" for i in range(33)})
        assert "at most 32" in str(e.value)
        with pytest.raises(SecretException):
            Secret.create(unique("meta"), VALUE, metadata={"k": "v" * 1025})
    finally:
        Secret.destroy(name)


def test_fill_makes_the_placeholder_and_refuses_braces():
    assert Secret.fill("openai-api-key") == "${e2b.secrets.openai-api-key}"
    with pytest.raises(InvalidArgumentException):
        Secret.fill("a}b")
