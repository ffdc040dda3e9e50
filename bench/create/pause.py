"""Pause and resume through `sandcell serve` (gvisor, `base`, with a network), beside the
floor in the same run: `runsc checkpoint` and `runsc restore` of a bare container on the same
image tree.

Measured (p50/p90/p99 over --runs, interleaved run by run):
  - pause_ms: POST /sandboxes/{id}/pause until 204, of a sandbox created from the warm pool
    (a network with its egress rules, the agent answering);
  - resume_ms: POST /sandboxes/{id}/resume until 201 (the agent answering again);
  - command_after_resume_ms: then `echo hi` through the envd proxy until its output, when
    the stock E2B Python SDK is importable (Sandbox.connect + commands.run);
  - runsc_checkpoint_ms / runsc_restore_ms: `runsc checkpoint` of a detached `/bin/sleep`
    container (--network none, root overlay in memory) until it returns, and `runsc restore`
    of that image until it returns (the raw gVisor operations, no agent, no network).
Each sandbox is killed after its run (not timed). Prints JSON.

  bench/create/pause.py --serve PATH --data-dir D [--runs 10] [--warm 2]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench import Daemon, load1, runsc_bundle, sdk_version, stats


def runsc_pause_floor(tree, work):
    """A function doing one checkpoint and one restore of a fresh sleep container with
    runsc directly; returns (checkpoint_ms, restore_ms)."""
    bundle, runsc = runsc_bundle(tree, work, "/bin/sleep", "600")
    n = [0]

    def run(*args):
        subprocess.run([*runsc, *args], check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL)

    def once():
        n[0] += 1
        name = f"bench-pause-{os.getpid()}-{n[0]}"
        image = os.path.join(work, f"image-{n[0]}")
        os.makedirs(image)
        run("run", "--detach", "--bundle", bundle, name)
        t = time.perf_counter()
        run("checkpoint", "--image-path", image, name)
        checkpoint = (time.perf_counter() - t) * 1000
        run("delete", "--force", name)
        t = time.perf_counter()
        run("restore", "--detach", "--image-path", image, "--bundle", bundle, name)
        restore = (time.perf_counter() - t) * 1000
        run("kill", name, "KILL")
        run("delete", "--force", name)
        shutil.rmtree(image, ignore_errors=True)
        return checkpoint, restore
    return once


def pause_resume(daemon, sdk):
    """One sandbox from the pool: paused, resumed, a command run; returns the times."""
    daemon.wait_full()
    status, out = daemon.req("POST", "/sandboxes", {"templateID": "base", "timeout": 120})
    if status != 201:
        raise SystemExit(f"create: {status} {out[:300]!r}")
    sid = json.loads(out)["sandboxID"]
    try:
        t = time.perf_counter()
        status, out = daemon.req("POST", f"/sandboxes/{sid}/pause")
        pause = (time.perf_counter() - t) * 1000
        if status != 204:
            raise SystemExit(f"pause: {status} {out[:300]!r}")
        t = time.perf_counter()
        status, out = daemon.req("POST", f"/sandboxes/{sid}/resume", {"timeout": 120})
        resume = (time.perf_counter() - t) * 1000
        if status != 201:
            raise SystemExit(f"resume: {status} {out[:300]!r}")
        command = None
        if sdk:
            t = time.perf_counter()
            said = sdk.Sandbox.connect(sid).commands.run("echo hi").stdout
            command = (time.perf_counter() - t) * 1000
            if said.strip() != "hi":
                raise SystemExit(f"echo hi after the resume gave {said!r}")
        return pause, resume, command
    finally:
        daemon.req("DELETE", f"/sandboxes/{sid}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--port", type=int, default=31113)
    ap.add_argument("--build", default="release")
    args = ap.parse_args()
    try:
        import e2b as sdk
    except ImportError:
        sdk = None
    tree = os.path.join(args.data_dir, "images", "base", "rootfs")
    work = tempfile.mkdtemp(prefix="sc-bpause")
    floor = runsc_pause_floor(tree, work)
    daemon = Daemon(args.serve, args.data_dir, args.port, "10.225.0.0/17", args.warm)
    os.environ.update(E2B_API_URL=f"http://127.0.0.1:{daemon.port}",
                      E2B_SANDBOX_URL=f"http://127.0.0.1:{daemon.port}", E2B_API_KEY=daemon.key)
    res = {k: [] for k in ("pause_ms", "resume_ms", "command_after_resume_ms",
                           "runsc_checkpoint_ms", "runsc_restore_ms")}
    loads = [load1()]
    try:
        floor()  # the first run warms the page cache
        for _ in range(args.runs):
            pause, resume, command = pause_resume(daemon, sdk)
            res["pause_ms"].append(pause)
            res["resume_ms"].append(resume)
            if command is not None:
                res["command_after_resume_ms"].append(command)
            checkpoint, restore = floor()
            res["runsc_checkpoint_ms"].append(checkpoint)
            res["runsc_restore_ms"].append(restore)
            loads.append(load1())
    finally:
        daemon.stop()
        shutil.rmtree(work, ignore_errors=True)
    version = subprocess.run(["runsc", "--version"], capture_output=True, text=True).stdout
    out = {
        "suite": "pause-gvisor",
        "runsc": version.splitlines()[0] if version else "",
        "cpus": os.cpu_count(),
        "warm": args.warm,
        "build": args.build,
        "e2b_sdk": sdk_version() if sdk else None,
        "load1": {"min": min(loads), "max": max(loads), "samples": loads},
        "results": {k: stats(v) for k, v in res.items() if v},
        "notes": "POST pause until 204 and POST resume until 201 on loopback (client-timed), "
                 "`base` at the default size (2 vCPUs, 512 MiB) created from the warm pool, "
                 "networks on; command_after_resume: Sandbox.connect + commands.run('echo hi'); "
                 "runsc: checkpoint and restore of a detached /bin/sleep container on the same "
                 "tree, --network none, root overlay in memory. Interleaved run by run; load1 "
                 "sampled before and after each run.",
    }
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
