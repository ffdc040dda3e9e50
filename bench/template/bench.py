"""Template benchmark driver (run by bench/template/run.sh, which builds the binary).

Measures, on the gvisor runtime with the installed `base` image:
  - `sandcell template build` of a five-step Dockerfile (COPY of 4 MiB, RUN, ENV, WORKDIR,
    RUN): cold (a new data dir each run: no layer cache) and fully cached rebuilds;
  - the same steps through the daemon's E2B template API (upload, POST /v3/templates,
    POST /v2/templates/{t}/builds/{b}, status polled every 50 ms): forced (`force: true`,
    the archive uploaded again) and cached; and one build with a startCmd/readyCmd;
  - create latency through the daemon (POST /sandboxes until its 201, sequential,
    interleaved kind by kind, each sandbox deleted after): the installed `base`, the CLI
    template, the API template, the API template with a start command, and a named snapshot
    of a `base` sandbox (the restore path).
Prints the JSON on stdout; progress on stderr.
"""

import argparse
import datetime
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request

DOCKERFILE = """FROM base
COPY app/ /opt/app/
RUN cd /opt/app && sha256sum blob-* > /opt/app/SUMS
ENV APP_HOME=/opt/app GREETING=bench
WORKDIR /opt/app
RUN echo "$GREETING" > greeting && ls blob-* | wc -l > count
"""
# The same steps as E2B template steps (template_plan.rs maps them back to a Dockerfile);
# the RUN steps as root, as the Dockerfile's (E2B's steps run as `user` unless told).
API_STEPS = [
    ("COPY", ["app", "/opt/app/"]),
    ("RUN", ["cd /opt/app && sha256sum blob-* > /opt/app/SUMS", "root"]),
    ("ENV", ["APP_HOME", "/opt/app", "GREETING", "bench"]),
    ("WORKDIR", ["/opt/app"]),
    ("RUN", ['echo "$GREETING" > greeting && ls blob-* | wc -l > count', "root"]),
]
# E2B's own documented pattern: a server started in each sandbox, ready when it answers.
# The id it writes tells whether it ran in each sandbox or once, before a snapshot.
START_CMD = "od -An -N8 -tx8 /dev/urandom > /tmp/start-id; python3 -m http.server 8000"
READY_CMD = "curl -sf http://127.0.0.1:8000/ >/dev/null"
FILES, FILE_BYTES = 8, 512 * 1024


def log(msg):
    print(f"bench/template: {msg}", file=sys.stderr, flush=True)


def summary(values, what):
    """p50/p90/p99 by nearest rank (as bench/net), min, max."""
    v = sorted(values)
    q = lambda p: v[round((len(v) - 1) * p)]
    return {"runs": len(v), "min": v[0], "p50": q(0.5), "p90": q(0.9), "p99": q(0.99),
            "max": v[-1], "what": what}


def loadavg():
    return [float(x) for x in open("/proc/loadavg").read().split()[:3]]


def make_context(ctx):
    os.makedirs(f"{ctx}/app")
    for i in range(FILES):
        with open(f"{ctx}/app/blob-{i}", "wb") as f:
            f.write(os.urandom(FILE_BYTES))
    with open(f"{ctx}/Dockerfile", "w") as f:
        f.write(DOCKERFILE)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as t:
        t.add(f"{ctx}/app", arcname="app")
    archive = raw.getvalue()
    return archive, hashlib.sha256(archive).hexdigest()


def new_data_dir(path, installed):
    """A data dir with the installed images (and kernels) linked in, nothing else."""
    os.makedirs(f"{path}/images")
    for name in ("minimal", "base"):
        os.symlink(f"{installed}/images/{name}", f"{path}/images/{name}")
    if os.path.isdir(f"{installed}/kernels"):
        os.symlink(f"{installed}/kernels", f"{path}/kernels")


def remove_tree(path):
    with open("/proc/mounts") as f:
        if any(f" {path}/" in line for line in f):
            sys.exit(f"bench/template: mounts left under {path}; not removing it")
    shutil.rmtree(path, ignore_errors=True)


def cli_build(sandcell, data, ctx, run_dir, extra=()):
    env = dict(os.environ, SANDCELL_RUN_DIR=run_dir)
    t = time.monotonic()
    p = subprocess.run([sandcell, "template", "build", "--data-dir", data, "-t", "bench-tpl",
                        "--network", "none", "--json", *extra, ctx],
                       env=env, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t
    if p.returncode != 0:
        sys.exit(f"bench/template: template build failed ({p.returncode}):\n{p.stderr[-3000:]}")
    log(f"  {wall:.2f} s")
    return wall, json.loads(p.stdout)


class Daemon:
    def __init__(self, sandcell, data, run_dir, out_dir):
        self.out, self.err = f"{out_dir}/serve.out", f"{out_dir}/serve.err"
        self.proc = subprocess.Popen(
            [sandcell, "serve", "--data-dir", data, "--listen", "127.0.0.1:0",
             "--runtime", "gvisor", "--kill-on-exit", "--no-network"],
            env=dict(os.environ, SANDCELL_RUN_DIR=run_dir), stdin=subprocess.DEVNULL,
            stdout=open(self.out, "w"), stderr=open(self.err, "w"))
        self.url = None
        for _ in range(300):
            m = re.search(r"listening on (\S+)", open(self.out).read())
            if m:
                self.url = m.group(1)
                break
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        if not self.url:
            sys.exit(f"bench/template: the daemon did not start:\n{open(self.err).read()}")
        self.key = open(f"{data}/admin.key").read().strip()

    def call(self, method, path, body=None, raw=None, expect=(200, 201, 202, 204)):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {} if path.startswith("http") else {"X-API-Key": self.key}
        headers["Content-Type"] = "application/octet-stream" if raw is not None else "application/json"
        req = urllib.request.Request(path if path.startswith("http") else self.url + path,
                                     method=method, data=data, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                status, text = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, text = e.code, e.read()
        if status not in expect:
            sys.exit(f"bench/template: {method} {path} -> {status}: {text[:2000]!r}")
        return status, (json.loads(text) if text else None)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def api_build(d, name, archive, files_hash, force, start=False):
    """One E2B template build as the SDK does it; seconds from the upload check to `ready`."""
    t = time.monotonic()
    _, link = d.call("GET", f"/templates/{name}/files/{files_hash}", expect=(201,))
    uploaded = force or not link["present"]
    if uploaded:
        d.call("PUT", link["url"], raw=archive, expect=(200,))
    _, req = d.call("POST", "/v3/templates", {"name": name}, expect=(202,))
    steps = [dict({"type": k, "args": a}, **({"filesHash": files_hash} if k == "COPY" else {}))
             for k, a in API_STEPS]
    body = {"fromTemplate": "base", "steps": steps, "force": force}
    if start:
        body.update(startCmd=START_CMD, readyCmd=READY_CMD)
    d.call("POST", f"/v2/templates/{name}/builds/{req['buildID']}", body, expect=(202,))
    offset, messages = 0, []
    while True:
        _, s = d.call("GET", f"/templates/{name}/builds/{req['buildID']}/status?logsOffset={offset}")
        entries = s.get("logEntries") or []
        offset += len(entries)
        messages += [f'{e.get("timestamp")} {e.get("message", "")}' for e in entries]
        if s["status"] in ("ready", "error") and not entries:
            break
        time.sleep(0.05)
    secs = time.monotonic() - t
    log(f"  {secs:.2f} s")
    if s["status"] != "ready":
        sys.exit(f"bench/template: API build of {name} failed: {json.dumps(s)[:3000]}")
    return secs, {"uploaded": uploaded, "cached_steps": sum(m.endswith(" CACHED") for m in messages), "log": messages}


def create_ms(d, template):
    t = time.monotonic()
    _, s = d.call("POST", "/sandboxes", {"templateID": template, "timeout": 120}, expect=(201,))
    ms = (time.monotonic() - t) * 1000
    return ms, s["sandboxID"]


def delete(d, sandbox_id):
    d.call("DELETE", f"/sandboxes/{sandbox_id}", expect=(204, 200))
    time.sleep(0.3)  # its teardown ends before the next timed create starts


def exec_out(sandcell, d, sandbox_id, *cmd):
    env = dict(os.environ, SANDCELL_URL=d.url, SANDCELL_API_KEY=d.key)
    return subprocess.run([sandcell, "exec", "-u", "root", sandbox_id, "--", *cmd], env=env,
                          capture_output=True, text=True, timeout=120).stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sandcell", required=True)
    ap.add_argument("--installed", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--profile", default="release")
    ap.add_argument("--commit", required=True)
    a = ap.parse_args()
    sandcell, tmp, runs = a.sandcell, a.tmp, a.runs
    # Builds take tens of seconds each: at most 10 of each kind (creates take all N runs).
    build_runs = min(runs, 10)
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": a.commit, "profile": a.profile, "runs": runs, "cpus": os.cpu_count(),
           "runtime": "gvisor", "load_avg_start": loadavg(),
           "runsc": subprocess.run(["runsc", "--version"], capture_output=True,
                                   text=True).stdout.splitlines()[0],
           "network": "none: builds with --network none, the daemon with --no-network",
           "dockerfile": DOCKERFILE, "context_mib": FILES * FILE_BYTES / 2**20}
    ctx = f"{tmp}/context"
    archive, files_hash = make_context(ctx)

    # a. CLI builds: cold in a new data dir each run, then cached rebuilds in the kept one.
    cold, cold_inner = [], []
    for i in range(build_runs):
        log(f"cold CLI build {i + 1}/{build_runs}")
        remove_tree(f"{tmp}/cold")
        new_data_dir(f"{tmp}/cold", a.installed)
        wall, rec = cli_build(sandcell, f"{tmp}/cold", ctx, f"{tmp}/run-cli")
        assert rec["cachedSteps"] == 0, rec
        cold.append(wall)
        cold_inner.append(rec["seconds"])
    remove_tree(f"{tmp}/cold")
    data = f"{tmp}/data"
    new_data_dir(data, a.installed)
    _, first = cli_build(sandcell, data, ctx, f"{tmp}/run-cli")
    cached, cached_inner = [], []
    for i in range(build_runs):
        log(f"cached CLI build {i + 1}/{build_runs}")
        wall, rec = cli_build(sandcell, data, ctx, f"{tmp}/run-cli")
        assert rec["builtSteps"] == 0, rec
        cached.append(wall)
        cached_inner.append(rec["seconds"])
    out["cli_build_cold_s"] = summary(cold, "sandcell template build, new data dir (no layer cache), process start to exit")
    out["cli_build_cold_reported_s"] = summary(cold_inner, "the same builds' own `seconds` (--json)")
    out["cli_build_cached_s"] = summary(cached, "sandcell template build of the unchanged Dockerfile, every step cached, process start to exit")
    out["cli_build_cached_reported_s"] = summary(cached_inner, "the same builds' own `seconds` (--json)")
    out["cli_build"] = {"steps_with_layers": first["builtSteps"], "ext4_mib": round(first["ext4Bytes"] / 2**20, 1),
                        "cached_rebuild_export_skipped": rec.get("exportSkipped")}

    # b. and c. through the daemon.
    d = Daemon(sandcell, data, f"{tmp}/run", tmp)
    try:
        forced, hits = [], []
        for i in range(build_runs):
            log(f"API build, forced {i + 1}/{build_runs}")
            secs, info = api_build(d, "bench-api", archive, files_hash, force=True)
            forced.append(secs)
        for i in range(build_runs):
            log(f"API build, cached {i + 1}/{build_runs}")
            secs, info = api_build(d, "bench-api", archive, files_hash, force=False)
            assert not info["uploaded"], info
            hits.append(secs)
        out["api_build_cached_log"] = info["log"]
        log("API build with startCmd/readyCmd")
        start_secs, _ = api_build(d, "bench-api-start", archive, files_hash, force=True, start=True)
        out["api_build_forced_s"] = summary(forced, "E2B API: upload (PUT again), POST /v3/templates, POST /v2/.../builds/{b} with force, status until ready")
        out["api_build_cached_s"] = summary(hits, "E2B API: upload check (present), requests, every step cached, status until ready")
        out["api_build_with_start_s"] = summary([start_secs], f"E2B API, forced, with startCmd {START_CMD!r} and readyCmd {READY_CMD!r}")

        # The named snapshot: of a `base` sandbox, the source then deleted.
        _, src = create_ms(d, "base")
        _, snap = d.call("POST", f"/sandboxes/{src}/snapshots", {"name": "bench-snap"}, expect=(201,))
        delete(d, src)
        kinds = {"base": "base", "cli_template": "bench-tpl", "api_template": "bench-api",
                 "api_template_with_start": "bench-api-start", "named_snapshot": snap["snapshotID"]}
        # Untimed warm-up of each kind, with a check that each is what it says.
        checks = {}
        for kind, tpl in kinds.items():
            _, sid = create_ms(d, tpl)
            if kind in ("cli_template", "api_template", "api_template_with_start"):
                got = exec_out(sandcell, d, sid, "cat", "/opt/app/greeting", "/opt/app/count")
                if got != f"bench\n{FILES}\n":
                    sys.exit(f"bench/template: a sandbox of {tpl} is not the built template: {got!r}")
            if kind == "api_template_with_start":
                got = exec_out(sandcell, d, sid, "sh", "-c", READY_CMD + " && echo serving")
                if got != "serving\n":
                    sys.exit(f"bench/template: the start command of {tpl} is not serving: {got!r}")
                # A second sandbox: the same start id = one start command, before a snapshot.
                _, other = create_ms(d, tpl)
                ids = [exec_out(sandcell, d, x, "cat", "/tmp/start-id").strip() for x in (sid, other)]
                delete(d, other)
                out["start_cmd_ran_in_each_sandbox"] = ids[0] != ids[1]
            checks[kind] = "ok"
            delete(d, sid)
        times = {k: [] for k in kinds}
        for i in range(runs):
            log(f"creates {i + 1}/{runs}")
            for kind, tpl in kinds.items():
                ms, sid = create_ms(d, tpl)
                times[kind].append(ms)
                delete(d, sid)
        what = {"base": "the installed base image (boot: runsc start, agent)",
                "cli_template": "the template built by sandcell template build",
                "api_template": "the template built through the E2B API (no start command)",
                "api_template_with_start": "the E2B-API template with startCmd/readyCmd: what the daemon does for it",
                "named_snapshot": "a named snapshot of a base sandbox (restore)"}
        out["create_ms"] = {k: summary(v, "POST /sandboxes until 201, sequential: " + what[k]) for k, v in times.items()}
        out["create_checks"] = checks
        base_p50 = out["create_ms"]["base"]["p50"]
        out["create_p50_ratio_to_base"] = {k: round(v["p50"] / base_p50, 3) for k, v in out["create_ms"].items()}
        d.call("DELETE", f"/snapshots/{snap['snapshotID']}", expect=(200, 204))
        out["template_snapshot_ids"] = {
            t: json.load(open(f"{data}/images/{t}/e2b.json")).get("snapshotID")
            for t in ("bench-api", "bench-api-start")}
    finally:
        d.stop()
    # What the daemon said of templates and snapshots (does a create restore or boot?).
    notes = [l.strip() for l in open(d.err) if re.search(r"snapshot|restor|template", l, re.I)]
    out["daemon_log_template_lines"] = list(dict.fromkeys(notes))[:10]
    out["load_avg_end"] = loadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
