"""E2B `Template.build` with the registry `e2b` Python SDK, unmodified, against a real
`sandcell serve` (run through tests/e2b/run.sh, which sets E2B_API_URL, E2B_SANDBOX_URL,
E2B_API_KEY and SANDCELL_TEMPLATE, a template with /bin/bash).

Two builds (they take a while). The first, from the test template, a RUN step, a COPY of a local file
(uploaded through the daemon's files URL), ENV, WORKDIR and a start + ready command; then a
sandbox from the result sees the file, the variables, the working directory and what the
start command wrote. The second is tagged (the SDK's tag functions; needs
SANDCELL_OTHER_KEY, which run.sh sets).
"""

import os

import pytest
from e2b import Sandbox, Template
from e2b.exceptions import TemplateException

TEMPLATE = os.environ["SANDCELL_TEMPLATE"]


def test_template_build_round_trip(tmp_path):
    (tmp_path / "hello.txt").write_text("hello from the build context\n")
    # Symlinks are copied as symlinks, dangling ones too (as Docker's COPY does).
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "real.txt").write_text("real\n")
    os.symlink("real.txt", tmp_path / "links" / "link.txt")
    os.symlink("missing.txt", tmp_path / "links" / "dangling")
    name = f"e2b-built-{os.getpid()}"
    template = (
        Template(file_context_path=str(tmp_path))
        .from_template(TEMPLATE)
        # E2B's steps run as `user` in /home/user unless told otherwise.
        .run_cmd("whoami > who.txt; pwd >> who.txt")
        .run_cmd("mkdir -p /srv/app && echo built-by-run > /srv/app/run.txt", user="root")
        .copy("hello.txt", "/srv/app/")
        .copy("links", "/srv/links/")
        .set_envs({"GREETING": "hi there", "ORIGIN": "e2b"})
        .set_workdir("/srv/app")
        .set_start_cmd("echo started-by-start-cmd > /tmp/started; sleep 3600", "test -s /tmp/started")
    )
    logs = []
    info = Template.build(template, name, on_build_logs=logs.append, cpu_count=1, memory_mb=512)
    assert info.template_id == name
    messages = [entry.message for entry in logs]
    assert any("Uploaded 'hello.txt'" in m for m in messages), messages
    assert any("RUN" in m for m in messages), messages
    assert Template.exists(name)

    sandbox = Sandbox.create(template=name, timeout=120)
    try:
        r = sandbox.commands.run("cat hello.txt run.txt; echo $GREETING/$ORIGIN; pwd; whoami")
        assert r.stdout == "hello from the build context\nbuilt-by-run\nhi there/e2b\n/srv/app\nuser\n"
        assert sandbox.commands.run("cat /home/user/who.txt").stdout == "user\n/home/user\n"
        links = sandbox.commands.run(
            "readlink /srv/links/link.txt /srv/links/dangling; cat /srv/links/link.txt"
        )
        assert links.stdout == "real.txt\nmissing.txt\nreal\n"
        # The start command ran (once, at build time: the template is its memory snapshot).
        assert sandbox.commands.run("cat /tmp/started").stdout == "started-by-start-cmd\n"
        # The build's cpuCount/memoryMB are the template's default size.
        info = sandbox.get_info()
        assert (info.cpu_count, info.memory_mb) == (1, 512)
    finally:
        sandbox.kill()


def test_template_tags_with_the_sdk_functions():
    """`Template.build(tags=...)`, `assign_tags`, `get_tags`, `remove_tags` and creates from
    `name:tag` (crates/server/src/template_tags.rs)."""
    name = f"e2b-tags-{os.getpid()}"
    template = Template().from_template(TEMPLATE).run_cmd("echo tagged > /tagged", user="root")
    info = Template.build(template, f"{name}:v1", tags=["stable"], cpu_count=1, memory_mb=512)
    build = info.build_id.replace("-", "")

    def tags():
        return {t.tag: t.build_id.replace("-", "") for t in Template.get_tags(name)}

    assert tags() == {"v1": build, "stable": build, "default": build}

    assigned = Template.assign_tags(f"{name}:v1", ["prod", "canary"])
    assert assigned.build_id.replace("-", "") == build
    assert assigned.tags == ["prod", "canary"]
    assert tags()["prod"] == build

    sandbox = Sandbox.create(template=f"{name}:prod", timeout=60)
    try:
        assert sandbox.commands.run("cat /tagged").stdout == "tagged\n"
    finally:
        sandbox.kill()

    Template.remove_tags(name, "prod")
    assert "prod" not in tags()
    with pytest.raises(Exception, match="404"):
        Sandbox.create(template=f"{name}:prod", timeout=60)
    with pytest.raises(TemplateException, match="404"):
        Template.remove_tags(name, "prod")
    with pytest.raises(TemplateException, match="400"):
        Template.assign_tags(f"{name}:v1", "Not A Tag")
    # Another key's template: not found.
    with pytest.raises(TemplateException, match="404"):
        Template.get_tags(name, api_key=os.environ["SANDCELL_OTHER_KEY"])
