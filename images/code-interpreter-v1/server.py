#!/usr/bin/env python3
"""Sandcell's code interpreter: E2B's Code Interpreter API on port 49999, over Jupyter kernels.

The stock `e2b-code-interpreter` SDKs talk to this (through the daemon's port proxy):

  GET  /health                       200 "OK" once the default context's kernel is ready
  POST /execute {code, context_id?, language?, env_vars?}
                                     a stream of JSON lines: stdout/stderr {text, timestamp},
                                     result {text, html, png, ..., is_main_result, extra},
                                     error {name, value, traceback},
                                     number_of_executions {execution_count}, end_of_execution
  GET  /contexts                     [{id, language, cwd}]
  POST /contexts {language?, cwd?}   a new context: a kernel of its own
  DELETE /contexts/{id}              shuts its kernel down
  POST /contexts/{id}/restart        restarts its kernel (its state is gone)

Executions in one context run one at a time, as in a notebook; a client that goes away
(the SDK's timeout closes the stream) interrupts the kernel. Python (ipykernel), bash
(bash_kernel) and JavaScript (js_kernel.py: node) are installed; another language is a 400
that says so. Each language has a default context, the Python one started with the server,
the others at their first use.

Runs as the template's start command (e2b.json), as `user`, in /home/user.
"""

import json
import os
import queue
import re
import shlex
import select
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jupyter_client import KernelManager

PORT = int(os.environ.get("SANDCELL_INTERPRETER_PORT", "49999"))
DEFAULT_CWD = os.environ.get("SANDCELL_INTERPRETER_CWD", "/home/user")
# Largest request body read (code and variables).
MAX_BODY = 16 << 20
# At most this many contexts (kernels) at once: each is a process with its own memory.
MAX_CONTEXTS = 32
# How long an interrupted execution gets to go idle before the kernel is restarted.
INTERRUPT_GRACE = 10.0
KERNEL_READY_TIMEOUT = 120
# language (as the SDKs name it, lowercased) -> (its canonical name, the kernel spec)
KERNELS = {
    "python": ("python", "python3"),
    "python3": ("python", "python3"),
    "bash": ("bash", "bash"),
    "javascript": ("javascript", "javascript"),
    "js": ("javascript", "javascript"),
}
AVAILABLE = "python, bash, javascript"
# The sandbox's default environment, rewritten by the agent at each /init
# (sandcell_proto::agent::ENV_FILE_PATH): a server restored from the template's memory
# snapshot serves creates whose env vars it was not started with.
ENV_FILE = os.environ.get("SANDCELL_ENV_FILE", "/run/sandcell/env.json")
MAX_ENV_FILE = 1 << 20

MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    # a matplotlib figure's chart data (sandcell_charts.py, the kernels' extension)
    "application/vnd.sandcell.chart+json": "chart",
}
# Every Python kernel loads it: figures a cell displays carry their chart data.
KERNEL_ARGS = {"python": ["--ext=sandcell_charts"], "bash": [], "javascript": []}
# What a bash kernel takes as a variable's name (anything else cannot be exported).
BASH_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# What bash_kernel's prompt marker depends on: set, the kernel would wait for a prompt that
# never comes (the context hangs).
BASH_RESERVED = {"PS1", "PS2", "PROMPT_COMMAND"}
# Control characters reach bash through a terminal's line editing (^C, ^U, CR cut or
# rewrite the line): only tab and newline go through as themselves.
BASH_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def bash_settable(name, value):
    """Why bash_kernel's shell cannot take `name`=`value`, or None."""
    if not BASH_NAME.match(name):
        return f"env var name {name!r} is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)"
    if name in BASH_RESERVED:
        return f"env var {name} is the bash kernel's own (its prompt)"
    if BASH_CONTROL.search(value):
        return f"env var {name}'s value has control characters the bash kernel's terminal would act on"
    return None


def log(msg):
    print(f"code-interpreter: {msg}", file=sys.stderr, flush=True)


class SandboxEnv:
    """The env vars of the create this sandbox serves, read again when the file changes."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.stamp = None
        self.env = {}

    def current(self):
        try:
            st = os.stat(self.path)
        except OSError:
            return {}
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        with self.lock:
            if stamp != self.stamp:
                self.stamp = stamp
                self.env = self._read()
            return self.env

    def _read(self):
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_ENV_FILE + 1)
            if len(raw) > MAX_ENV_FILE:
                raise ValueError(f"larger than {MAX_ENV_FILE} bytes")
            env = json.loads(raw)
            if not isinstance(env, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()
            ):
                raise ValueError("not an object of strings")
            return env
        except (OSError, ValueError) as e:
            log(f"ignoring {self.path}: {e}")
            return {}


SANDBOX_ENV = SandboxEnv(ENV_FILE)


class BadRequest(Exception):
    """A request the caller must change (400)."""


class NotFound(Exception):
    """A context that does not exist (404)."""


class PythonEnv:
    """Env var changes as Python code for an ipykernel (its os.environ)."""

    @staticmethod
    def set_saving(env_vars):
        return (
            "import os as _sc_os\n"
            f"_sc_env_saved = {{k: _sc_os.environ.get(k) for k in {list(env_vars)!r}}}\n"
            f"_sc_os.environ.update({dict(env_vars)!r})\n"
        )

    @staticmethod
    def put_back(env_vars):
        return (
            "for _sc_k, _sc_v in _sc_env_saved.items():\n"
            "    if _sc_v is None: _sc_os.environ.pop(_sc_k, None)\n"
            "    else: _sc_os.environ[_sc_k] = _sc_v\n"
        )

    @staticmethod
    def replace(env, gone):
        return (
            "import os as _sc_os\n"
            f"_sc_os.environ.update({dict(env)!r})\n"
            f"for _sc_k in {gone!r}: _sc_os.environ.pop(_sc_k, None)\n"
        )


class BashEnv:
    """Env var changes as shell code for bash_kernel's bash (exported variables). What
    bash_settable refuses is skipped here (the sandbox's) or refused with a 400 (an
    execution's: bash_names). Every snippet ends with `true`: a silent cell that fails still
    sends an error."""

    @staticmethod
    def set_saving(env_vars):
        lines = []
        for k, v in env_vars.items():
            lines.append(
                f'if [ -n "${{{k}+x}}" ]; then _sc_had_{k}=1; _sc_old_{k}="${k}"; '
                f"else _sc_had_{k}=0; fi; export {k}={shlex.quote(v)}"
            )
        return "\n".join(lines + ["true"])

    @staticmethod
    def put_back(env_vars):
        lines = []
        for k in env_vars:
            lines.append(
                f'if [ "$_sc_had_{k}" = 1 ]; then export {k}="$_sc_old_{k}"; else unset {k}; fi; '
                f"unset _sc_had_{k} _sc_old_{k}"
            )
        return "\n".join(lines + ["true"])

    @staticmethod
    def replace(env, gone):
        lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items() if bash_settable(k, v) is None]
        lines += [f"unset {k}" for k in gone if bash_settable(k, "") is None]
        return "\n".join(lines + ["true"])


class JsEnv:
    """Env var changes as JavaScript for the JavaScript kernel's node (its process.env). What
    an execution's change saves is kept under a symbol, apart from the cells' names."""

    SAVED = "globalThis[Symbol.for('sandcell.env')]"

    @staticmethod
    def set_saving(env_vars):
        return (
            f"{JsEnv.SAVED} = Object.fromEntries({json.dumps(list(env_vars))}.map((k) => [k, process.env[k]]));\n"
            f"Object.assign(process.env, {json.dumps(dict(env_vars))});\n"
        )

    @staticmethod
    def put_back(env_vars):
        return (
            f"for (const [k, v] of Object.entries({JsEnv.SAVED})) "
            "if (v === undefined) delete process.env[k]; else process.env[k] = v;\n"
            f"delete {JsEnv.SAVED};\n"
        )

    @staticmethod
    def replace(env, gone):
        return (
            f"Object.assign(process.env, {json.dumps(dict(env))});\n"
            f"for (const k of {json.dumps(list(gone))}) delete process.env[k];\n"
        )


ENV_CODE = {"python": PythonEnv, "bash": BashEnv, "javascript": JsEnv}


def canonical(language):
    """The language's canonical name and kernel spec; a 400 for one not installed."""
    if not isinstance(language, str):
        raise BadRequest("language must be a string")
    spec = KERNELS.get(language.strip().lower())
    if spec is None:
        raise BadRequest(f"language {language!r} is not installed in this template (available: {AVAILABLE})")
    return spec


def bash_names(env_vars):
    """Refuses an execution's env var that bash_kernel's shell cannot take (400)."""
    for k, v in (env_vars or {}).items():
        why = bash_settable(k, v)
        if why is not None:
            raise BadRequest(why)


class Context:
    """One kernel, and the lock that runs its executions one at a time."""

    def __init__(self, language, cwd):
        language, kernel = canonical(language)
        if not os.path.isdir(cwd):
            raise BadRequest(f"cwd {cwd!r} is not a directory")
        self.id = str(uuid.uuid4())
        self.language = language
        self.env_code = ENV_CODE[language]
        self.cwd = cwd
        self.lock = threading.Lock()
        self.km = KernelManager(kernel_name=kernel)
        self.km.start_kernel(cwd=cwd, extra_arguments=KERNEL_ARGS[language])
        # The sandbox env vars put into this kernel's os.environ so far.
        self.applied_env = {}
        self.kc = self._client()

    def _client(self):
        kc = self.km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=KERNEL_READY_TIMEOUT)
        return kc

    def info(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def restart(self):
        with self.lock:
            self.kc.stop_channels()
            self.km.restart_kernel(now=True)
            self.kc = self._client()
            self.applied_env = {}

    def shutdown(self):
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=True)

    def execute(self, code, env_vars, emit, gone):
        """Runs `code`, passing each output to `emit` as E2B's JSON objects; `gone()` says the
        client left (then the kernel is interrupted)."""
        with self.lock:
            self._drain_shell()
            self._apply_sandbox_env()
            if env_vars:
                # For this execution only: set, then put back what was there.
                self.kc.execute(self.env_code.set_saving(env_vars), silent=True, store_history=False)
            msg_id = self.kc.execute(code, store_history=True, allow_stdin=False)
            interrupted_at = None
            while True:
                try:
                    msg = self.kc.get_iopub_msg(timeout=0.25)
                except queue.Empty:
                    if interrupted_at is None and gone():
                        log(f"context {self.id}: client gone, interrupting the kernel")
                        self.km.interrupt_kernel()
                        interrupted_at = time.monotonic()
                    elif interrupted_at is not None and time.monotonic() - interrupted_at > INTERRUPT_GRACE:
                        log(f"context {self.id}: still busy after an interrupt, restarting it")
                        self.kc.stop_channels()
                        self.km.restart_kernel(now=True)
                        self.kc = self._client()
                        self.applied_env = {}
                        return
                    continue
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "status" and content.get("execution_state") == "idle":
                    break
                out = to_e2b(kind, content)
                if out is not None and interrupted_at is None and not emit(out):
                    log(f"context {self.id}: client gone, interrupting the kernel")
                    self.km.interrupt_kernel()
                    interrupted_at = time.monotonic()
            if env_vars:
                self.kc.execute(self.env_code.put_back(env_vars), silent=True, store_history=False)
            emit({"type": "end_of_execution"})

    def _apply_sandbox_env(self):
        # The create's env vars (a restored kernel started with the template build's): set
        # what changed, drop what this kernel was given before and is no longer there.
        env = SANDBOX_ENV.current()
        if env == self.applied_env:
            return
        gone = [k for k in self.applied_env if k not in env]
        code = self.env_code.replace(env, gone)
        if self.language == "python" and env.get("E2B_SANDBOX_ID") != self.applied_env.get("E2B_SANDBOX_ID"):
            # Another sandbox (restored from the snapshot every create of the template
            # restores): the kernel's pseudo-random generators were seeded in the snapshot and
            # would repeat in every sandbox; seeded again from the entropy /init gave this one.
            code += (
                "import random as _sc_random, sys as _sc_sys\n"
                "_sc_random.seed()\n"
                "if 'numpy' in _sc_sys.modules: _sc_sys.modules['numpy'].random.seed()\n"
            )
        self.kc.execute(code, silent=True, store_history=False)
        self.applied_env = dict(env)

    def _drain_shell(self):
        # execute_reply messages nobody reads would pile up in the client's queue.
        while True:
            try:
                self.kc.get_shell_msg(timeout=0)
            except queue.Empty:
                return


def now_ns():
    return time.time_ns()


def to_e2b(kind, content):
    """A kernel's iopub message as E2B's output object, or None for the ones E2B drops."""
    if kind == "stream":
        return {"type": content.get("name", "stdout"), "text": content.get("text", ""), "timestamp": now_ns()}
    if kind in ("execute_result", "display_data"):
        out = {"type": "result", "is_main_result": kind == "execute_result"}
        extra = {}
        for mime, value in content.get("data", {}).items():
            field = MIME_FIELDS.get(mime)
            if field is None:
                extra[mime] = value
            else:
                out[field] = value
        if extra:
            out["extra"] = extra
        return out
    if kind == "error":
        return {
            "type": "error",
            "name": content.get("ename", ""),
            "value": content.get("evalue", ""),
            "traceback": "\n".join(content.get("traceback", [])),
        }
    if kind == "execute_input":
        return {"type": "number_of_executions", "execution_count": content.get("execution_count", 0)}
    return None


class Contexts:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_id = {}
        self.default = None
        # Contexts whose kernel is starting: they count against MAX_CONTEXTS already, so that
        # concurrent creates cannot pass the cap together.
        self.starting = 0
        self.default_removed = False
        # The default contexts of the other languages (language_default).
        self.defaults = {}
        self.defaults_starting = threading.Lock()

    def start_default(self):
        try:
            ctx = Context("python", DEFAULT_CWD)
        except Exception as e:  # noqa: BLE001 - said once, then /health stays 503
            log(f"the default kernel did not start: {e!r}")
            return
        with self.lock:
            self.by_id[ctx.id] = ctx
            self.default = ctx
        log(f"default context {ctx.id} ready")

    def create(self, language, cwd):
        with self.lock:
            if len(self.by_id) + self.starting >= MAX_CONTEXTS:
                raise BadRequest(f"at most {MAX_CONTEXTS} contexts at once: delete one first")
            self.starting += 1
        try:
            ctx = Context(language, cwd)
        finally:
            with self.lock:
                self.starting -= 1
        with self.lock:
            self.by_id[ctx.id] = ctx
        return ctx

    def get(self, context_id):
        with self.lock:
            ctx = self.by_id.get(context_id)
        if ctx is None:
            raise NotFound(f"context {context_id!r} not found")
        return ctx

    def for_execute(self, context_id, language):
        if context_id:
            if language:
                raise BadRequest("give context_id or language, not both")
            return self.get(context_id)
        if language and canonical(language)[0] != "python":
            return self.language_default(canonical(language)[0])
        if self.default is None:
            if self.default_removed:
                raise NotFound(
                    "the default context was removed: pass a context made with "
                    "create_code_context"
                )
            raise NotFound("the default context is not ready yet")
        return self.default

    def language_default(self, language):
        """The default context of a language other than Python, started at its first use
        (one at a time: a second caller waits for the first's kernel)."""
        with self.defaults_starting:
            with self.lock:
                ctx = self.defaults.get(language)
            if ctx is None:
                ctx = self.create(language, DEFAULT_CWD)
                with self.lock:
                    self.defaults[language] = ctx
            return ctx

    def remove(self, context_id):
        with self.lock:
            ctx = self.by_id.pop(context_id, None)
            if ctx is not None and ctx is self.default:
                self.default = None
                self.default_removed = True
            for language, default in list(self.defaults.items()):
                if default is ctx:
                    del self.defaults[language]
        if ctx is None:
            raise NotFound(f"context {context_id!r} not found")
        ctx.shutdown()

    def list(self):
        with self.lock:
            return [c.info() for c in self.by_id.values()]


CONTEXTS = Contexts()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sandcell-code-interpreter"

    def log_message(self, fmt, *args):
        pass

    def _send(self, status, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status, message):
        self._send(status, message.encode(), "text/plain; charset=utf-8")

    def _body(self):
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise BadRequest("Content-Length is not a number")
        if length > MAX_BODY:
            raise BadRequest(f"the body is larger than {MAX_BODY} bytes")
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError as e:
            raise BadRequest(f"the body is not JSON: {e}")
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    def _route(self, method):
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        try:
            if method == "GET" and path == "/health":
                if CONTEXTS.default is None:
                    return self._error(503, "the default kernel is starting")
                return self._send(200, b"OK", "text/plain")
            if method == "POST" and path == "/execute":
                return self._execute(self._body())
            if path == "/contexts":
                if method == "GET":
                    return self._send(200, CONTEXTS.list())
                if method == "POST":
                    body = self._body()
                    ctx = CONTEXTS.create(body.get("language") or "python", body.get("cwd") or DEFAULT_CWD)
                    return self._send(200, ctx.info())
            parts = path.split("/")
            if len(parts) >= 3 and parts[1] == "contexts":
                if method == "DELETE" and len(parts) == 3:
                    CONTEXTS.remove(parts[2])
                    self.send_response(204)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                if method == "POST" and len(parts) == 4 and parts[3] == "restart":
                    CONTEXTS.get(parts[2]).restart()
                    return self._send(200, {})
            return self._error(404, f"no route {method} {path}")
        except BadRequest as e:
            return self._error(400, str(e))
        except NotFound as e:
            return self._error(404, str(e))

    def _execute(self, body):
        code = body.get("code")
        if not isinstance(code, str):
            raise BadRequest("code (a string) is required")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()
        ):
            raise BadRequest("env_vars must be an object of strings")
        ctx = CONTEXTS.for_execute(body.get("context_id"), body.get("language"))
        if ctx.language == "bash":
            bash_names(env_vars)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        conn = self.connection

        def emit(obj):
            line = json.dumps(obj).encode() + b"\n"
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
                return True
            except OSError:
                return False

        def gone():
            # Readable with nothing to read: the client closed its side.
            try:
                readable, _, _ = select.select([conn], [], [], 0)
                return bool(readable) and conn.recv(1, 2) == b""  # 2 = MSG_PEEK
            except OSError:
                return True

        ctx.execute(code, env_vars, emit, gone)
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass
        return None

    def do_GET(self):
        self._route("GET")

    def do_POST(self):
        self._route("POST")

    def do_DELETE(self):
        self._route("DELETE")


def main():
    server = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    server.daemon_threads = True
    threading.Thread(target=CONTEXTS.start_default, name="default-kernel", daemon=True).start()
    log(f"listening on :{PORT}")
    server.serve_forever()


if __name__ == "__main__":
    main()
