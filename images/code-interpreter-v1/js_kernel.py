#!/usr/bin/env python3
"""Sandcell's JavaScript kernel: a Jupyter kernel (ipykernel's Kernel, as bash_kernel is) over
one persistent node process, js_driver.js, so a context's cells share their state.

ijavascript and tslab need zeromq's native module (prebuilt downloads the image build cannot
make); this needs only the node the base image has and the ipykernel the Python kernels use.
Each cell goes to node as a JSON line; its stdout and stderr are streamed while it runs; its
reply (the last expression's util.inspect text, or the error) ends it. An interrupt
(server.py's, when the client went) is SIGINT to node; a cell that does not stop within
INTERRUPT_GRACE has its node killed and started again (its state is gone, said in the error).

  python3 js_kernel.py -f CONNECTION_FILE     (the kernel spec's argv, install.sh)
"""

import codecs
import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import time

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "js_driver.js")
# The base image's node (/usr/local/bin); SANDCELL_NODE: another one.
NODE = os.environ.get("SANDCELL_NODE") or shutil.which("node") or "/usr/local/bin/node"
INTERRUPT_GRACE = 3.0
# The most of a cell's output one stream message carries.
STREAM_BATCH = 1 << 20
# Looked up before any fork: the child calls only these between fork and exec.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl
PR_SET_PDEATHSIG = 1


def _in_child():
    # The kernel app ignores SIGINT, and an ignored signal stays ignored across exec: node
    # must take it. And node dies with this kernel: it is in a session of its own (so that
    # jupyter_client's SIGINT to the kernel's process group reaches it once, from here), where
    # the SIGKILL of a kernel restart would not reach it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)


class Node:
    """The node process, its command pipe and the pipes it answers on."""

    def __init__(self):
        cmd_r, self.cmd_w = os.pipe()
        self.reply_r, reply_w = os.pipe()
        env = dict(os.environ, SANDCELL_JS_CMD_FD=str(cmd_r), SANDCELL_JS_REPLY_FD=str(reply_w))
        self.proc = subprocess.Popen(
            # (the vm module's loader for import() in cells is "experimental": said once per
            # context on the cell's stderr otherwise)
            [NODE, "--expose-internals", "--disable-warning=ExperimentalWarning", DRIVER],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(cmd_r, reply_w),
            env=env,
            start_new_session=True,
            preexec_fn=_in_child,
        )
        os.close(cmd_r)
        os.close(reply_w)
        # node's stdout and stderr pipes, while open
        self.names = {self.proc.stdout.fileno(): "stdout", self.proc.stderr.fileno(): "stderr"}
        self.decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in self.names}
        self.interrupted_at = None

    def interrupt(self):
        if self.interrupted_at is None:
            self.interrupted_at = time.monotonic()
        try:
            os.kill(self.proc.pid, signal.SIGINT)
        except OSError:
            pass

    def kill(self):
        self.proc.kill()
        self.proc.wait()
        for fd in (self.cmd_w, self.reply_r):
            os.close(fd)
        self.proc.stdout.close()
        self.proc.stderr.close()

    def run(self, code, stream):
        """Runs one cell: `stream(name, text)` gets its output as it comes; returns node's
        reply, or None when node did not answer (it exited, or ignored an interrupt)."""
        self.interrupted_at = None
        line = memoryview((json.dumps({"code": code}) + "\n").encode())
        try:
            # (a signal can cut a write to a pipe short: the rest goes after it)
            while line:
                line = line[os.write(self.cmd_w, line) :]
        except OSError:
            return None
        reply = b""
        while True:
            if self.interrupted_at is not None and time.monotonic() - self.interrupted_at > INTERRUPT_GRACE:
                return None
            ready, _, _ = select.select([*self.names, self.reply_r], [], [], 0.25)
            for fd in ready:
                if fd != self.reply_r:
                    self._forward(fd, stream)
                    continue
                data = os.read(fd, 65536)
                if not data:
                    return None
                reply += data
            if reply.endswith(b"\n"):
                # node replies once its writes to stdout and stderr are done: what the cell
                # printed is in the pipes. Read what is left there, then end the cell.
                while self.names:
                    ready, _, _ = select.select(list(self.names), [], [], 0)
                    if not ready:
                        break
                    for fd in ready:
                        self._forward(fd, stream)
                return json.loads(reply)

    def _forward(self, fd, stream):
        """Passes on what the pipe `fd` has: as one message as long as more is there at once
        (up to STREAM_BATCH), so that a cell printing fast does not become a flood of them."""
        name, data = self.names[fd], b""
        while len(data) < STREAM_BATCH:
            chunk = os.read(fd, 65536)
            if not chunk:
                del self.names[fd]
                break
            data += chunk
            if not select.select([fd], [], [], 0)[0]:
                break
        if text := self.decoders[fd].decode(data):
            stream(name, text)


class JavaScriptKernel(Kernel):
    implementation = "sandcell_js_kernel"
    implementation_version = "1"
    language = "javascript"
    banner = "JavaScript (Node.js), Sandcell"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.node = Node()
        version = subprocess.run([NODE, "--version"], capture_output=True, text=True).stdout.strip()
        self.language_info = {
            "name": "javascript",
            "version": version.lstrip("v"),
            "mimetype": "application/javascript",
            "file_extension": ".js",
        }

    def do_execute(
        self, code, silent, store_history=True, user_expressions=None, allow_stdin=False, *, cell_meta=None, cell_id=None
    ):
        def stream(name, text):
            if not silent:
                self.send_response(self.iopub_socket, "stream", {"name": name, "text": text})

        # While a cell runs, SIGINT (jupyter_client's interrupt) goes on to node.
        previous = signal.signal(signal.SIGINT, lambda *_: self.node.interrupt())
        try:
            reply = self.node.run(code, stream)
        finally:
            signal.signal(signal.SIGINT, previous)
        if reply is None:
            self.node.kill()
            if self.node.interrupted_at is not None:
                name, why = "Interrupted", "did not stop when interrupted"
            else:
                name, why = "NodeExited", f"exited (status {self.node.proc.returncode})"
            self.node = Node()
            reply = {
                "status": "error",
                "ename": name,
                "evalue": f"node {why}: this context's node was started again (its state is gone)",
                "traceback": [],
            }
        if reply["status"] == "ok":
            if reply.get("result") is not None and not silent:
                self.send_response(
                    self.iopub_socket,
                    "execute_result",
                    {"execution_count": self.execution_count, "data": {"text/plain": reply["result"]}, "metadata": {}},
                )
            return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}
        error = {"ename": reply["ename"], "evalue": reply["evalue"], "traceback": reply["traceback"]}
        if not silent:
            self.send_response(self.iopub_socket, "error", error)
        return {"status": "error", "execution_count": self.execution_count, **error}

    def do_shutdown(self, restart):
        self.node.kill()
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=JavaScriptKernel)
