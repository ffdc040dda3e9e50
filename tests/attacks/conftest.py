"""Fixtures of the attack suite; run through tests/attacks/run.sh, which starts the daemon,
the fake internet and the canary, and exports ATTACK_* (see run.sh).

Each test is one attack. After every attack, `after_each_attack` checks that the daemon still
answers and that a bystander sandbox of tenant B still runs a command: an attack that breaks
either has got through, whatever it asserted itself. The run ends with one line:
`attacks: N tried, 0 got through` (or the attacks that got through).
"""

import os

import httpx
import pytest
from e2b import Sandbox

ENV = {
    "url": os.environ["ATTACK_URL"],
    "data_dir": os.environ["ATTACK_DATA_DIR"],
    "run_dir": os.environ["ATTACK_RUN_DIR"],
    "bin": os.environ["ATTACK_BIN"],
    "admin_key": os.environ["ATTACK_ADMIN_KEY"],
    "key_a": os.environ["ATTACK_KEY_A"],
    "key_b": os.environ["ATTACK_KEY_B"],
    "canary": os.environ["ATTACK_CANARY"],
    "canary_port": int(os.environ["ATTACK_CANARY_PORT"]),
    "template": os.environ["ATTACK_TEMPLATE"],
    "daemon_log": os.environ["ATTACK_DAEMON_LOG"],
    "daemon_pid": int(os.environ["ATTACK_DAEMON_PID"]),
}


@pytest.fixture(scope="session")
def env():
    return ENV


@pytest.fixture(scope="session")
def api():
    """`api(key)`: an httpx client for the daemon's REST API as that key."""
    clients = []

    def make(key, **kw):
        headers = {"X-API-KEY": key} if key is not None else {}
        client = httpx.Client(base_url=ENV["url"], headers=headers, timeout=kw.pop("timeout", 120), **kw)
        clients.append(client)
        return client

    yield make
    for c in clients:
        c.close()


@pytest.fixture
def sandbox():
    """`sandbox(key, **create_kwargs)`: an e2b Sandbox of that key, killed after the test."""
    made = []

    def make(key, **kw):
        kw.setdefault("template", ENV["template"])
        kw.setdefault("timeout", 300)
        sbx = Sandbox.create(api_key=key, **kw)
        made.append(sbx)
        return sbx

    yield make
    for sbx in made:
        try:
            sbx.kill()
        except Exception:  # noqa: BLE001 - already gone is fine at teardown
            pass


@pytest.fixture(scope="session")
def bystander():
    """A sandbox of tenant B that every attack must leave working."""
    sbx = Sandbox.create(template=ENV["template"], api_key=ENV["key_b"], timeout=3600)
    sbx.files.write("/home/user/bystander.txt", "still here")
    yield sbx
    sbx.kill()


@pytest.fixture(autouse=True)
def after_each_attack(request, bystander):
    yield
    if os.environ.get("ATTACK_SKIP_BYSTANDER"):
        return
    assert os.path.exists(f"/proc/{ENV['daemon_pid']}"), "the daemon died"
    r = httpx.get(ENV["url"] + "/health", timeout=30)
    assert r.status_code == 200, f"the daemon's /health answers {r.status_code} after the attack"
    out = bystander.commands.run("cat /home/user/bystander.txt", timeout=60)
    assert out.stdout == "still here", "tenant B's bystander sandbox lost its file"


_results = {"tried": [], "through": []}


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.failed):
        _results["tried"].append(report.nodeid)
        if report.failed:
            _results["through"].append(report.nodeid)
    elif report.when == "teardown" and report.failed and report.nodeid not in _results["through"]:
        _results["through"].append(report.nodeid)


def pytest_terminal_summary(terminalreporter):
    tried = len(set(_results["tried"]))
    through = sorted(set(_results["through"]))
    terminalreporter.write_line(f"attacks: {tried} tried, {len(through)} got through")
    for nodeid in through:
        terminalreporter.write_line(f"  got through (or broke the platform): {nodeid}")
