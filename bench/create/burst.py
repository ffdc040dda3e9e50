"""A burst of creates through `sandcell serve` (gvisor, `base`): N sandboxes from C concurrent
clients, each a time to interactive with the stock E2B Python SDK (`Sandbox.create()` +
`commands.run("echo hi")`, its kill after, not timed), beside the floor in the same run:
N `runsc run /bin/true` on the same tree from C concurrent threads.

Measured, for a daemon with its warm pool (`serve --warm W`) and one without (`--warm 0`):
  - tti_ms: p50/p90/p99 of the N times to interactive, the errors (any exception or an
    answer other than "hi"), the burst's wall time;
  - the pool's hits and misses during the burst, and how long after the burst's last create
    the pool is full again (refill_s);
  - runsc_true_ms: the floor, N runs from C threads.
The pool daemon gets `--warm-memory` for W sandboxes of `base`'s 512 MiB (the default cap,
2 GiB, holds 4).
The daemons run one after the other (never both bursting at once). Prints JSON.

  bench/create/burst.py --serve PATH --data-dir D [--creates 50] [--clients 10] [--warm 10]
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from bench import Daemon, load1, runsc_true, sdk_version, stats


def burst(daemon, sdk, creates, clients):
    os.environ.update(E2B_API_URL=f"http://127.0.0.1:{daemon.port}",
                      E2B_SANDBOX_URL=f"http://127.0.0.1:{daemon.port}", E2B_API_KEY=daemon.key)

    def one(_):
        t = time.perf_counter()
        try:
            sbx = sdk.Sandbox.create(timeout=120)
        except Exception as e:  # noqa: BLE001 - every failure is counted and shown
            return None, f"create: {e!r}"[:300]
        try:
            out = sbx.commands.run("echo hi").stdout
            took = (time.perf_counter() - t) * 1000
            return (took, None) if out.strip() == "hi" else (None, f"echo hi gave {out!r}")
        except Exception as e:  # noqa: BLE001
            return None, f"command: {e!r}"[:300]
        finally:
            try:
                sbx.kill()
            except Exception:  # noqa: BLE001 - a failed kill is not the create's
                pass

    hits0 = daemon.metric("sandcell_warm_pool_hits_total")
    misses0 = daemon.metric("sandcell_warm_pool_misses_total")
    begun = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        results = list(ex.map(one, range(creates)))
    wall = time.perf_counter() - begun
    out = {
        "tti_ms": stats([t for t, _ in results if t is not None]),
        "errors": [e for _, e in results if e is not None],
        "wall_s": round(wall, 2),
        "pool_hits": daemon.metric("sandcell_warm_pool_hits_total") - hits0,
        "pool_misses": daemon.metric("sandcell_warm_pool_misses_total") - misses0,
    }
    if daemon.warm:
        t = time.perf_counter()
        daemon.wait_full()
        out["refill_s"] = round(time.perf_counter() - t, 2)
    return out


def floor_burst(floor, creates, clients):
    floor()  # the first run warms the page cache
    with concurrent.futures.ThreadPoolExecutor(clients) as ex:
        took = list(ex.map(lambda _: floor(), range(creates)))
    return {"runsc_true_ms": stats(took)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", required=True)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--creates", type=int, default=50)
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--warm", type=int, default=10)
    ap.add_argument("--port", type=int, default=31113)
    ap.add_argument("--build", default="release")
    args = ap.parse_args()
    import e2b as sdk

    tree = os.path.join(args.data_dir, "images", "base", "rootfs")
    work = tempfile.mkdtemp(prefix="sc-bburst")
    loads = [load1()]
    out = {"suite": "create-burst-gvisor", "creates": args.creates, "clients": args.clients,
           "warm": args.warm, "build": args.build, "cpus": os.cpu_count(),
           "e2b_sdk": sdk_version()}
    try:
        out["floor"] = floor_burst(runsc_true(tree, work), args.creates, args.clients)
        loads.append(load1())
        for name, warm, pool in (("pool", args.warm, "10.225.0.0/17"), ("boot", 0, "10.225.128.0/17")):
            # the pool's memory cap fits W idle `base` sandboxes (512 MiB each)
            daemon = Daemon(args.serve, args.data_dir, args.port, pool, warm,
                            extra_args=("--warm-memory", str(max(warm, 1) * 512)))
            try:
                if warm:
                    daemon.wait_full()
                out[name] = burst(daemon, sdk, args.creates, args.clients)
            finally:
                daemon.stop()
            loads.append(load1())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    version = subprocess.run(["runsc", "--version"], capture_output=True, text=True).stdout
    out["runsc"] = version.splitlines()[0] if version else ""
    out["load1"] = {"min": min(loads), "max": max(loads), "samples": loads}
    out["notes"] = ("Time to interactive per sandbox: the stock E2B Python SDK's "
                    "Sandbox.create() + commands.run('echo hi'), C threads sharing N creates, "
                    "each sandbox killed after (not timed); `base` at its default size, "
                    "networks on; pool: `serve --warm W`, full before the burst, refill_s "
                    "from the burst's end until it is full again; boot: --warm 0; floor: runsc "
                    "run of /bin/true on the same tree from C threads (--network none, root "
                    "overlay in memory). The three run one after the other.")
    json.dump(out, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
