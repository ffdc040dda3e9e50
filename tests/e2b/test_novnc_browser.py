"""The desktop's VNC stream in a real browser: the stock `e2b-desktop` SDK starts the stream,
its URL (https://6080-<id>.<domain>/vnc.html) opens in Debian's headless Chromium through the
daemon's HTTPS port URLs (the daemon's CA trusted as a user would trust it, no certificate
check turned off), noVNC connects over its WebSocket, and the canvas it draws the remote
screen on is the painted desktop.

Run through tests/e2b/port_urls.sh, like test_port_urls.py (the same environment). With
SANDCELL_SCREENSHOTS set, the browser's screenshot of the page is written there
(docs/images/novnc-chromium.png comes from it).
"""

import os
import time

import e2b
import e2b_desktop
import pytest

from browser import Browser
from hosts import hosts_add, hosts_clear

DOMAIN = os.environ["E2B_DOMAIN"]
IP = os.environ["SANDCELL_HTTPS_IP"]
CA = os.environ["SANDCELL_CA"]

# noVNC's canvas: its size and how many colours a sample of its pixels has, and the status
# line noVNC shows (for the failure message).
CANVAS = r"""(() => {
  const status = (document.getElementById('noVNC_status') || {}).textContent || '';
  const c = document.querySelector('canvas');
  if (!c || !c.width || !c.height) return {w: 0, h: 0, colours: 0, status};
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  const seen = new Set();
  for (let i = 0; i < d.length; i += 4 * 97) seen.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
  return {w: c.width, h: c.height, colours: seen.size, status};
})()"""


class _Named(e2b.Sandbox):
    """Names the new sandbox's ports in /etc/hosts as soon as the create answers, before the
    desktop SDK's create goes on to run its first command (the SDK's resolver reads the file
    at its first request)."""

    @classmethod
    def create(cls, *args, **kwargs):
        sbx = super().create(*args, **kwargs)
        hosts_add([f"{port}-{sbx.sandbox_id}.{DOMAIN}" for port in (49983, 6080)])
        return sbx


class Desktop(e2b_desktop.Sandbox, _Named):
    pass


def _create_desktop():
    # The desktop SDK kills its sandbox when its own setup fails; the names go too.
    try:
        return Desktop.create(timeout=180)
    except Exception:
        hosts_clear()
        raise


@pytest.fixture
def desktop():
    sbx = _create_desktop()
    try:
        yield sbx
    finally:
        hosts_clear()
        sbx.kill()


def test_the_stream_url_opens_in_a_real_browser_and_shows_the_desktop(desktop):
    desktop.stream.start()
    url = desktop.stream.get_url(auto_connect=True)
    assert url.startswith(f"https://6080-{desktop.sandbox_id}.{DOMAIN}/vnc.html")
    browser = Browser(ca=CA, resolve=(f"*.{DOMAIN}", IP), size=(1100, 860))
    try:
        browser.open(url)
        seen = None
        reloads = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            seen = browser.evaluate(CANVAS)
            if reloads < 5 and browser.reload_if_network_changed():
                reloads += 1
                continue
            # the remote screen's size, and more than a blank or single-colour frame
            if seen and (seen["w"], seen["h"]) == (1024, 768) and seen["colours"] > 50:
                break
            time.sleep(0.5)
        else:
            page = browser.evaluate(
                "location.href + ' | ' + document.title + ' | '"
                " + (document.body ? document.body.innerText.slice(0, 300) : '')"
            )
            raise AssertionError(
                f"noVNC never showed the desktop: {seen}\npage: {page}\n"
                f"the page said:\n{browser.page_said()}\nchromium:\n{browser.stderr_tail()}"
            )
        shot = browser.screenshot()
        assert shot.startswith(b"\x89PNG\r\n\x1a\n")
        out = os.environ.get("SANDCELL_SCREENSHOTS")
        if out:
            os.makedirs(out, exist_ok=True)
            with open(os.path.join(out, "novnc-chromium.png"), "wb") as f:
                f.write(shot)
    finally:
        browser.close()
        desktop.stream.stop()
