"""Code interpreter latency with the stock SDKs, beside the plain sandbox as the floor, in
the same run (interleaved run by run, so that load hits all alike):
  - ci_first_create_ms: the first `e2b_code_interpreter.Sandbox.create()` of the daemon
    (code-interpreter-v1 boots and its start command starts the kernel; the daemon then
    takes the template's memory snapshot in the background, templates/installed_snapshot.rs,
    and the bench waits for it, untimed);
  - ci_create_ms: later creates until they return (restored from that snapshot, the
    default kernel running; `restored_creates` says how many were);
  - ci_first_cell_ms: the first `run_code("1 + 1")` after that create;
  - ci_cell_ms: later `run_code("1 + 1")` cells in the same sandbox (--cells of them per run);
  - ci_pandas_cell_ms: the first `import pandas` cell of a sandbox;
  - base_create_ms / base_command_ms: `e2b.Sandbox.create(template="base")` and one
    `commands.run("echo hi")` on it (the floor: a sandbox without a kernel).
Each sandbox is killed before the next run (not timed). Prints JSON.
"""

import argparse
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from latency import ms, stats  # noqa: E402
from e2b import Sandbox as PlainSandbox
from e2b_code_interpreter import Sandbox


def metric(series):
    url = os.environ["E2B_API_URL"] + "/metrics"
    with urllib.request.urlopen(url, timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
    raise SystemExit(f"/metrics has no {series}")


def wait_for_snapshot(deadline_s=300):
    taken = 'sandcell_installed_template_snapshots_total{outcome="taken"}'
    failed = 'sandcell_installed_template_snapshots_total{outcome="failed"}'
    end = time.monotonic() + deadline_s
    while metric(taken) + metric(failed) == 0:
        if time.monotonic() > end:
            raise SystemExit("the template's snapshot was neither taken nor failed in 300 s")
        time.sleep(0.5)
    return metric(taken) >= 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--cells", type=int, default=10)
    args = ap.parse_args()
    t = time.monotonic()
    Sandbox.create(timeout=60).kill()
    first_create = ms(t)
    snapshot_taken = wait_for_snapshot()
    restored_before = metric('sandcell_template_creates_total{path="restored"}')
    rows = {k: [] for k in ("ci_create_ms", "ci_first_cell_ms", "ci_cell_ms", "ci_pandas_cell_ms",
                            "base_create_ms", "base_command_ms")}
    for _ in range(args.runs):
        t = time.monotonic()
        sbx = Sandbox.create(timeout=300)
        rows["ci_create_ms"].append(ms(t))
        try:
            t = time.monotonic()
            assert sbx.run_code("1 + 1").text == "2"
            rows["ci_first_cell_ms"].append(ms(t))
            for _ in range(args.cells):
                t = time.monotonic()
                sbx.run_code("1 + 1")
                rows["ci_cell_ms"].append(ms(t))
            t = time.monotonic()
            ex = sbx.run_code("import pandas as pd\npd.__version__")
            assert ex.error is None, ex.error
            rows["ci_pandas_cell_ms"].append(ms(t))
        finally:
            sbx.kill()
        t = time.monotonic()
        plain = PlainSandbox.create(template="base", timeout=120)
        rows["base_create_ms"].append(ms(t))
        try:
            t = time.monotonic()
            plain.commands.run("echo hi")
            rows["base_command_ms"].append(ms(t))
        finally:
            plain.kill()
    print(json.dumps({
        "what": "code interpreter (code-interpreter-v1) vs a base sandbox, stock SDKs, gvisor, loopback",
        "load_after": os.getloadavg(),
        "ci_first_create_ms": round(first_create, 1),
        "snapshot_taken": snapshot_taken,
        "restored_creates": metric('sandcell_template_creates_total{path="restored"}') - restored_before,
        **{k: stats(v) for k, v in rows.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
