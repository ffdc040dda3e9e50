"""Create latency through `sandcell serve` (gvisor, `base`), from the warm pool and without
it, beside the floor: `runsc run` of /bin/true on the same image tree, in the same run.

Measured (p50/p90/p99 over --runs each, interleaved run by run so that load hits all alike):
  - pool_create_ms: POST /sandboxes until 201, the pool full before each create (steady
    state: `serve --warm N` with N idle), plain body;
  - pool_create_env_egress_ms: the same with env vars and egress rules (allowOut/denyOut);
  - pool_create_nft_program_ms, pool_create_env_egress_nft_program_ms: both again against a
    daemon with SANDCELL_NFT=process (every nftables change an `nft` process, as before
    libnftables in-process): the reference for that change;
  - boot_create_ms: the same plain create against a daemon with `--warm 0` (every create
    boots a runsc sandbox);
  - runsc_true_ms: `runsc run` of /bin/true on the image tree (the raw start and stop of a
    gVisor sandbox, no agent, no network);
  - tti_pool_ms / tti_boot_ms: time to interactive with the stock E2B Python SDK
    (`Sandbox.create()` + `commands.run("echo hi")`), when the SDK is importable.
Each create's sandbox is killed before the next (not timed). Prints JSON.
"""

import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import latency  # noqa: E402


def stats(xs):
    """bench/lib/latency.py's p50/p90/p99, with the extremes (none for no runs)."""
    if not xs:
        return {"runs": 0}
    return {**latency.stats(xs), "min": round(min(xs), 1), "max": round(max(xs), 1)}


def load1():
    return float(open("/proc/loadavg").read().split()[0])


class Daemon:
    def __init__(self, binary, data, port, pool, warm, extra_env=None, extra_args=()):
        # A data dir of its own (the installed images linked in): daemons sharing one would
        # share its network prefix, and each one's start-up sweep would remove the others'
        # pooled networks.
        self.port, self.data = port, tempfile.mkdtemp(prefix="sc-bcreate-data")
        os.makedirs(os.path.join(self.data, "images"))
        for name in os.listdir(os.path.join(data, "images")):
            os.symlink(os.path.join(data, "images", name), os.path.join(self.data, "images", name))
        self.run_dir = tempfile.mkdtemp(prefix="sc-bcreate-run")
        env = dict(os.environ, SANDCELL_RUN_DIR=self.run_dir, **(extra_env or {}))
        args = [binary, "--data-dir", self.data, "--listen", f"127.0.0.1:{port}",
                "--runtime", "gvisor", "--net-pool", pool, "--kill-on-exit", "--warm", str(warm),
                *extra_args]
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE,
                                     stderr=open(f"/tmp/bench-create-{port}.log", "w"))
        line = self.proc.stdout.readline().decode()
        if "listening on" not in line:
            raise SystemExit(f"daemon did not start: {line!r}")
        self.key = open(os.path.join(self.data, "admin.key")).read().strip()
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.warm = warm

    def req(self, method, path, body=None):
        headers = {"X-API-KEY": self.key, "content-type": "application/json"}
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, path, body=data, headers=headers)
        r = self.conn.getresponse()
        return r.status, r.read()

    def metric(self, name):
        _, text = self.req("GET", "/metrics")
        m = re.search(rf"^{name} (\d+)", text.decode(), re.M)
        return int(m.group(1)) if m else 0

    def wait_full(self):
        deadline = time.time() + 180
        while self.metric("sandcell_warm_pool_idle") < self.warm:
            if time.time() > deadline:
                raise SystemExit("the warm pool did not fill in 180 s")
            time.sleep(0.05)

    def create(self, body):
        if self.warm:
            self.wait_full()
        t = time.perf_counter()
        status, out = self.req("POST", "/sandboxes", body)
        took = (time.perf_counter() - t) * 1000
        if status != 201:
            raise SystemExit(f"create: {status} {out[:300]!r}")
        self.req("DELETE", f"/sandboxes/{json.loads(out)['sandboxID']}")
        return took

    def tti(self, sdk):
        if self.warm:
            self.wait_full()
        os.environ.update(E2B_API_URL=f"http://127.0.0.1:{self.port}",
                          E2B_SANDBOX_URL=f"http://127.0.0.1:{self.port}", E2B_API_KEY=self.key)
        t = time.perf_counter()
        sbx = sdk.Sandbox.create()
        out = sbx.commands.run("echo hi").stdout
        took = (time.perf_counter() - t) * 1000
        sbx.kill()
        if out.strip() != "hi":
            raise SystemExit(f"echo hi gave {out!r}")
        return took

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        shutil.rmtree(self.data, ignore_errors=True)


def runsc_bundle(tree, work, *argv):
    """An OCI bundle in WORK running ARGV over the image tree TREE (read-only, no terminal),
    and the runsc flags of the floors: (bundle, [runsc, --root, ..., flags])."""
    bundle = os.path.join(work, "bundle")
    os.makedirs(bundle, exist_ok=True)
    subprocess.run(["runsc", "spec", "--bundle", bundle, "--", *argv], check=True)
    spec = json.load(open(os.path.join(bundle, "config.json")))
    spec["root"] = {"path": tree, "readonly": True}
    spec["process"]["terminal"] = False
    json.dump(spec, open(os.path.join(bundle, "config.json"), "w"))
    runsc = ["runsc", "--root", os.path.join(work, "root"), "--network", "none",
             "--overlay2", "root:memory"]
    return bundle, runsc


def runsc_true(tree, work):
    bundle, runsc = runsc_bundle(tree, work, "/bin/true")
    n = [0]

    def once():
        n[0] += 1
        t = time.perf_counter()
        subprocess.run([*runsc, "run", "--bundle", bundle, f"bench-true-{os.getpid()}-{n[0]}"],
                       check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        return (time.perf_counter() - t) * 1000
    return once


def sdk_version():
    from importlib.metadata import version
    return version("e2b")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warm", type=int, default=2)
    ap.add_argument("--port", type=int, default=31103)
    ap.add_argument("--build", default="release")
    args = ap.parse_args()
    try:
        import e2b as sdk
    except ImportError:
        sdk = None
    tree = os.path.join(args.data_dir, "images", "base", "rootfs")
    work = tempfile.mkdtemp(prefix="sc-bcreate")
    floor = runsc_true(tree, work)
    plain = {"templateID": "base", "timeout": 120}
    rich = {"templateID": "base", "timeout": 120,
            "envVars": {"A": "1", "B": "two", "PATH_EXTRA": "/opt/x"},
            "metadata": {"who": "bench"},
            "network": {"allowOut": ["198.51.100.7", "*.example.com"], "denyOut": ["0.0.0.0/0"]}}
    pool = Daemon(args.serve, args.data_dir, args.port, "10.223.0.0/17", args.warm)
    boot = Daemon(args.serve, args.data_dir, args.port + 1, "10.223.128.0/17", 0)
    # The same pooled creates with every nftables change run as an `nft` process, as before
    # libnftables in-process (crates/net/src/nftlib.rs): the reference for that change.
    nft_program = Daemon(args.serve, args.data_dir, args.port + 2, "10.224.0.0/17", args.warm,
                         {"SANDCELL_NFT": "process"})
    res = {k: [] for k in ("pool_create_ms", "pool_create_env_egress_ms",
                           "pool_create_nft_program_ms", "pool_create_env_egress_nft_program_ms",
                           "boot_create_ms", "runsc_true_ms", "tti_pool_ms", "tti_boot_ms")}
    loads = [load1()]
    try:
        floor()  # first run warms the page cache
        for _ in range(args.runs):
            res["pool_create_ms"].append(pool.create(plain))
            res["pool_create_env_egress_ms"].append(pool.create(rich))
            res["pool_create_nft_program_ms"].append(nft_program.create(plain))
            res["pool_create_env_egress_nft_program_ms"].append(nft_program.create(rich))
            res["boot_create_ms"].append(boot.create(plain))
            res["runsc_true_ms"].append(floor())
            if sdk:
                res["tti_pool_ms"].append(pool.tti(sdk))
                res["tti_boot_ms"].append(boot.tti(sdk))
            loads.append(load1())
        hits = pool.metric("sandcell_warm_pool_hits_total")
        misses = pool.metric("sandcell_warm_pool_misses_total")
    finally:
        pool.stop()
        boot.stop()
        nft_program.stop()
        shutil.rmtree(work, ignore_errors=True)
    version = subprocess.run(["runsc", "--version"], capture_output=True, text=True).stdout
    out = {
        "suite": "create-gvisor",
        "runsc": version.splitlines()[0] if version else "",
        "cpus": os.cpu_count(),
        "warm": args.warm,
        "build": args.build,
        "pool_hits": hits,
        "pool_misses": misses,
        "e2b_sdk": sdk_version() if sdk else None,
        "load1": {"min": min(loads), "max": max(loads), "samples": loads},
        "results": {k: stats(v) for k, v in res.items() if v},
        "notes": "POST /sandboxes until 201 on loopback (client-timed, one keep-alive "
                 "connection), `base` at the default size (2 vCPUs, 512 MiB), networks on; "
                 "pool: the pool full before each create; nft_program: the same with "
                 "SANDCELL_NFT=process (every nftables change an nft process, as before "
                 "libnftables in-process); boot: --warm 0; runsc_true: runsc "
                 "run of /bin/true on the same tree, --network none, root overlay in memory. "
                 "Interleaved run by run; load1 sampled before and after each run.",
    }
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
