"""A real browser for the tests: Debian's headless Chromium, driven over the DevTools protocol
through `--remote-debugging-pipe` (fd 3 carries commands in, fd 4 answers and events out,
each message JSON ending in a NUL byte), so nothing but the standard library is needed and no
debugging port is open on the host.

The browser trusts the CA it is given the way a user's Chromium on Linux does, through an NSS
database in its own $HOME (certutil, Debian's libnss3-tools), and resolves the names it is
given to one address (`--host-resolver-rules`), so a test neither edits /etc/hosts for it nor
turns certificate checks off.
"""

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time


class BrowserError(Exception):
    pass


class Browser:
    def __init__(self, *, ca=None, resolve=None, size=(1280, 800), binary="chromium"):
        exe = shutil.which(binary)
        if exe is None:
            raise BrowserError(f"{binary} is not installed (apt-get install chromium libnss3-tools)")
        self.home = tempfile.mkdtemp(prefix="sc-browser-")
        env = dict(os.environ, HOME=self.home)
        if ca is not None:
            nssdb = os.path.join(self.home, ".pki", "nssdb")
            os.makedirs(nssdb)
            subprocess.run(["certutil", "-N", "-d", f"sql:{nssdb}", "--empty-password"], check=True)
            subprocess.run(
                ["certutil", "-A", "-d", f"sql:{nssdb}", "-n", "sandcell-test-ca", "-t", "C,,", "-i", ca],
                check=True,
            )
        args = [
            exe,
            "--headless",
            # as root (the tests run as root) Chromium refuses its own sandbox; the page is ours
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            f"--user-data-dir={os.path.join(self.home, 'profile')}",
            f"--window-size={size[0]},{size[1]}",
            "--remote-debugging-pipe",
        ]
        if resolve is not None:
            pattern, ip = resolve
            args.append(f"--host-resolver-rules=MAP {pattern} {ip}")
        # fd 3: the browser reads commands; fd 4: it writes answers
        cmd_r, self._cmd_w = os.pipe()
        self._out_r, out_w = os.pipe()

        def fds():
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)

        self.log = open(os.path.join(self.home, "chromium.log"), "wb")
        self.proc = subprocess.Popen(
            args + ["about:blank"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=self.log,
            # kept open past the fork: the two that preexec_fn makes of the pipes
            pass_fds=(3, 4),
            preexec_fn=fds,
        )
        os.close(cmd_r)
        os.close(out_w)
        self._buf = b""
        self._next = 0
        self.session = None
        # what the page said: console messages, uncaught exceptions, failed loads (for the
        # failure messages of the tests)
        self.events = []

    def close(self):
        try:
            self.call("Browser.close", timeout=5, session=False)
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._out_r)
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)

    def stderr_tail(self, n=20):
        with open(os.path.join(self.home, "chromium.log"), "rb") as f:
            return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")

    def _read(self, deadline):
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("the browser did not answer in time")
            ready, _, _ = select.select([self._out_r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise BrowserError(f"the browser exited:\n{self.stderr_tail()}")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, *, timeout=30, session=True):
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params or {}}
        if session and self.session is not None:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            answer = self._read(deadline)
            if answer.get("id") != self._next:
                self._keep(answer)  # an event, or an answer nobody waits for
                continue
            if "error" in answer:
                raise BrowserError(f"{method}: {answer['error']}")
            return answer.get("result", {})

    def _keep(self, event):
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.events.append(f"console.{params.get('type')}: {text}")
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.events.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
        elif method == "Network.loadingFailed":
            self.events.append(f"load failed: {params.get('errorText')} {params.get('blockedReason') or ''}")
        elif method == "Network.responseReceived":
            response = params.get("response", {})
            if response.get("status", 200) >= 400:
                self.events.append(f"HTTP {response.get('status')}: {response.get('url')}")
        elif method == "Network.webSocketClosed":
            self.events.append("websocket closed")
        elif method == "Network.webSocketFrameError":
            self.events.append(f"websocket error: {params.get('errorMessage')}")
        del self.events[:-40]

    def page_said(self):
        """The page's last console messages, exceptions and failed requests."""
        return "\n".join(self.events) or "(nothing)"

    def reload_if_network_changed(self):
        """Reloads the page when a load of it failed with ERR_NETWORK_CHANGED, and says so.

        Chromium aborts the loads under way whenever an address appears or goes in its network
        namespace, and on a Sandcell host the host ends of sandboxes' networks come and go all
        the time (the network pool refills after a create). A user reloads; so does the test."""
        if not any("ERR_NETWORK_CHANGED" in e for e in self.events):
            return False
        self.events.append("(reloaded after ERR_NETWORK_CHANGED)")
        self.events = [e for e in self.events if "ERR_NETWORK_CHANGED" not in e]
        self.call("Page.reload", {"ignoreCache": True})
        return True

    def open(self, url):
        """A new page at `url`, the session later calls go to."""
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}, session=False
        )["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Network.enable")
        for _ in range(5):
            answer = self.call("Page.navigate", {"url": url})
            # aborted because an address came or went on the host (reload_if_network_changed)
            if answer.get("errorText") != "net::ERR_NETWORK_CHANGED":
                break
            self.events.append("(navigated again after ERR_NETWORK_CHANGED)")
            time.sleep(0.5)
        if answer.get("errorText"):
            raise BrowserError(f"{url}: {answer['errorText']}")

    def evaluate(self, expression):
        answer = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression[:60]}...: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def screenshot(self):
        return base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"])
