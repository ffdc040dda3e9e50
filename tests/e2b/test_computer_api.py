"""Sandcell's own Computer API (`/sandboxes/{id}/computer/...`, docs/computer-api.md) and
`sandcell computer` against a real daemon and the installed `desktop` template (run by
tests/e2b/run.sh: E2B_API_URL, E2B_API_KEY, SANDCELL_OTHER_KEY, SANDCELL_BIN set).

The sandbox is created through REST, not E2B's desktop SDK; its display is stopped once so
that the API's next call starts it again; every assertion reads back what the desktop did: the
screen's pixels, the pointer, the window list, a file an application saved after the API
typed into it. Bad input gets a 400 that says what was wrong.
"""

import json
import os
import subprocess
import time

import httpx
import pytest
from e2b import Sandbox

from test_desktop import png_size_and_colours, wait_for

API = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]
OTHER = os.environ["SANDCELL_OTHER_KEY"]
BIN = os.environ["SANDCELL_BIN"]


def api(method, path, key=KEY, headers=None, **kw):
    headers = {"X-API-Key": key, **(headers or {})}
    return httpx.request(method, API + path, headers=headers, timeout=120, **kw)


def computer(sid, method, route, **kw):
    return api(method, f"/sandboxes/{sid}/computer/{route}", **kw)


def done(r):
    assert r.status_code == 204, (r.status_code, r.text)


def refused(r, status, *words):
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == status and body["message"], body
    for w in words:
        assert w in body["message"], body["message"]
    return body["message"]


def create(template):
    r = api("POST", "/sandboxes", json={"templateID": template, "timeout": 600})
    assert r.status_code == 201, r.text
    return r.json()["sandboxID"]


@pytest.fixture(scope="module")
def desk():
    sid = create("desktop")
    yield sid
    api("DELETE", f"/sandboxes/{sid}")


def screenshot(sid, **params):
    r = computer(sid, "GET", "screenshot", params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "image/png"
    return r.content


def test_a_call_without_a_display_starts_it_and_the_screenshot_is_painted(desk):
    # The template's start command started the desktop; stopped, the next call of the API
    # finds no display, starts Xvfb and the session, then answers.
    sbx = Sandbox.connect(desk)
    sbx.commands.run("pkill -x xfce4-session; pkill -f '^/usr/bin/Xvfb :0'; true")
    wait_for(
        "the display gone",
        lambda: sbx.commands.run("DISPLAY=:0 xdpyinfo >/dev/null 2>&1 || echo gone").stdout.strip() == "gone",
        15,
    )
    size = computer(desk, "GET", "screen")
    assert size.status_code == 200, size.text
    assert size.json() == {"width": 1024, "height": 768}

    def painted():
        w, h, colours = png_size_and_colours(screenshot(desk))
        assert (w, h) == (1024, 768)
        return colours > 50
    wait_for("the desktop's first paint", painted, 60)
    w, h, _ = png_size_and_colours(screenshot(desk, x=0, y=0, width=200, height=100))
    assert (w, h) == (200, 100)
    w, h, _ = png_size_and_colours(screenshot(desk, scale=0.5, pointer="false"))
    assert (w, h) == (512, 384)


def test_the_pointer_goes_where_it_is_sent(desk):
    done(computer(desk, "POST", "mouse/move", json={"x": 321, "y": 234}))
    assert computer(desk, "GET", "cursor").json() == {"x": 321, "y": 234}
    done(computer(desk, "POST", "mouse/click", json={"x": 600, "y": 500, "button": "left"}))
    assert computer(desk, "GET", "cursor").json() == {"x": 600, "y": 500}
    # On the bare desktop (a rubber band): the panel's menu at the top left would open and
    # take the keyboard.
    done(computer(desk, "POST", "mouse/drag", json={"from": {"x": 700, "y": 300}, "to": {"x": 800, "y": 400}}))
    assert computer(desk, "GET", "cursor").json() == {"x": 800, "y": 400}
    done(computer(desk, "POST", "mouse/scroll", json={"direction": "down", "amount": 2}))
    # Punctuation goes by its keysym (xdotool refuses "." in a key sequence, takes "+" as a
    # separator): pressed on the bare desktop, where it does nothing.
    done(computer(desk, "POST", "keyboard/press", json={"keys": ["."]}))
    done(computer(desk, "POST", "keyboard/press", json={"keys": ["shift", "+"]}))


def windows(sid):
    r = computer(sid, "GET", "windows")
    assert r.status_code == 200, r.text
    return r.json()["windows"]


def test_typed_text_shows_on_screen_and_is_saved_by_the_editor(desk):
    sbx = Sandbox.connect(desk)
    sbx.files.write("/home/user/api-note.txt", "")
    done(computer(desk, "POST", "launch", json={"path": "/home/user/api-note.txt"}))
    win = wait_for(
        "the editor's window",
        lambda: [w for w in windows(desk) if "api-note.txt" in w["title"]],
    )[0]
    assert win["class"].lower() == "mousepad", win
    assert win["width"] > 100 and win["height"] > 100, win
    done(computer(desk, "POST", f"windows/{win['id']}/focus"))
    wait_for("the editor focused", lambda: any(w["focused"] and w["id"] == win["id"] for w in windows(desk)), 10)
    region = {
        "x": max(win["x"], 0), "y": max(win["y"], 0),
        "width": min(win["width"], 1024 - max(win["x"], 0)),
        "height": min(win["height"], 768 - max(win["y"], 0)),
        "pointer": "false",
    }
    before = screenshot(desk, **region)
    done(computer(desk, "POST", "keyboard/type", json={"text": "typed by the computer API"}))
    wait_for("the text on screen", lambda: screenshot(desk, **region) != before, 10)
    done(computer(desk, "POST", "keyboard/press", json={"keys": ["ctrl", "s"]}))
    wait_for(
        "the saved file",
        lambda: sbx.files.read("/home/user/api-note.txt") == "typed by the computer API",
        15,
    )
    done(api("DELETE", f"/sandboxes/{desk}/computer/windows/{win['id']}"))
    wait_for("the window closed", lambda: all(w["id"] != win["id"] for w in windows(desk)), 10)


def test_launch_starts_an_app_by_its_desktop_entry(desk):
    done(computer(desk, "POST", "launch", json={"app": "xfce4-terminal"}))
    wait_for("the terminal's window", lambda: [w for w in windows(desk) if "terminal" in w["class"].lower()])
    refused(computer(desk, "POST", "launch", json={"app": "no-such-app"}), 400, "no application", "no-such-app")


def test_a_url_opens_in_the_browser(desk):
    # A page served in the sandbox itself (the test's fake internet is not needed): xdg-open
    # of an http URL starts Debian's Chromium, whose window takes the page's title.
    sbx = Sandbox.connect(desk)
    sbx.files.write("/tmp/www/index.html", "<title>Sandcell page</title><h1>Hello from a sandbox</h1>")
    sbx.commands.run("cd /tmp/www && python3 -m http.server 8765", background=True)
    wait_for("the page server", lambda: sbx.commands.run("curl -sf http://127.0.0.1:8765/ || true").stdout, 15)
    done(computer(desk, "POST", "launch", json={"url": "http://127.0.0.1:8765/"}))
    win = wait_for(
        "the browser's window with the page",
        lambda: [w for w in windows(desk) if w["class"].lower() == "chromium" and "Sandcell page" in w["title"]],
        60,
    )[0]
    assert win["width"] > 300 and win["height"] > 200, win
    done(api("DELETE", f"/sandboxes/{desk}/computer/windows/{win['id']}"))


def test_the_cli_takes_screenshots_and_lists_windows(desk, tmp_path):
    env = dict(os.environ, SANDCELL_URL=API, SANDCELL_API_KEY=KEY)
    out = tmp_path / "shot.png"
    subprocess.run([BIN, "computer", "screenshot", desk, "-o", str(out)], env=env, check=True, timeout=120)
    assert png_size_and_colours(out.read_bytes())[:2] == (1024, 768)
    listed = subprocess.run(
        [BIN, "computer", "windows", desk, "--json"], env=env, check=True, timeout=120,
        capture_output=True, text=True,
    ).stdout
    assert any("terminal" in w["class"].lower() for w in json.loads(listed))
    bad = subprocess.run(
        [BIN, "computer", "key", desk, "ctrl+hyperdrive"], env=env, timeout=120,
        capture_output=True, text=True,
    )
    assert bad.returncode == 1 and "unknown key name" in bad.stderr, bad.stderr


def test_bad_input_is_refused_with_what_to_fix(desk):
    refused(computer(desk, "POST", "keyboard/press", json={"keys": ["ctrl", "hyperdrive"]}), 400, "unknown key name", "hyperdrive")
    refused(computer(desk, "POST", "keyboard/press", json={"keys": []}), 400)
    refused(computer(desk, "POST", "mouse/click", json={"x": 5000, "y": 10}), 400, "off the screen", "1024x768")
    refused(computer(desk, "POST", "mouse/click", json={"x": 5}), 400, "both x and y")
    refused(computer(desk, "POST", "mouse/move", json={"x": -1, "y": 10}), 400)
    refused(computer(desk, "POST", "mouse/click", json={"x": 1, "y": 1, "button": "fourth"}), 400)
    refused(computer(desk, "POST", "mouse/scroll", json={"amount": 0}), 400, "amount")
    refused(computer(desk, "POST", "keyboard/type", json={"text": ""}), 400)
    refused(computer(desk, "POST", "keyboard/type", json={"text": "a" * 2000, "delayMs": 10}), 400, "over the 15 s")
    refused(computer(desk, "POST", "keyboard/type", json={"text": "a\x1b[2J"}), 400, "control characters")
    refused(computer(desk, "POST", "keyboard/type", content=b"{not json", headers={"content-type": "application/json"}), 400)
    refused(computer(desk, "GET", "screenshot", params={"x": 1000, "y": 0, "width": 100, "height": 10}), 400, "not inside")
    refused(computer(desk, "GET", "screenshot", params={"scale": "3"}), 400, "scale")
    refused(computer(desk, "POST", "launch", json={"url": "javascript:alert(1)"}), 400, "http")
    refused(computer(desk, "POST", "launch", json={"app": "a", "path": "/b"}), 400, "exactly one")
    refused(computer(desk, "POST", "windows/123456789/focus"), 404, "no window 123456789")
    refused(computer(desk, "POST", "windows/not-a-window/focus"), 400, "window id")
    # Another key's sandbox does not exist for it.
    refused(api("GET", f"/sandboxes/{desk}/computer/screen", key=OTHER), 404)
    refused(api("POST", f"/sandboxes/{desk}/computer/keyboard/type", key=OTHER, json={"text": "x"}), 404)


def test_a_sandbox_without_a_desktop_says_so():
    sid = create("base")
    try:
        msg = refused(computer(sid, "GET", "screenshot"), 400, "has no desktop", "`desktop` template")
        assert sid in msg
    finally:
        api("DELETE", f"/sandboxes/{sid}")
