"""Desktop latency: the stock e2b-desktop SDK beside Sandcell's Computer API, in the same
run (interleaved run by run, so that load hits both alike):
  - sdk_first_create_ms: the daemon's first `e2b_desktop.Sandbox.create()` (the template
    boots and its start command starts Xvfb and xfce4; the daemon then takes the template's
    memory snapshot in the background, and the bench waits for it, untimed);
  - sdk_create_ms: later creates until they return (restored from that snapshot, the
    desktop running; the SDK's own start commands find it so; `restored_creates` says how
    many were);
  - sdk_first_screenshot_ms: the SDK's first `screenshot()` after that;
  - api_create_to_screenshot_ms: `POST /sandboxes` of `desktop` and the first
    `GET .../computer/screenshot` (the API starts the display at that call);
  - sdk_screenshot_ms / api_screenshot_ms: later screenshots (--shots per run), the SDK's
    (`scrot` by a command, then a file download) and the API's (one request);
  - sdk_click_ms / api_click_ms: `left_click(x, y)` (two SDK commands) and
    `POST .../computer/mouse/click` (one request);
  - base_create_ms: a REST create of `base` (the floor: a sandbox without a desktop).
Each sandbox is killed before the next run (not timed). Prints JSON.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from latency import ms, stats  # noqa: E402
import httpx
from e2b_desktop import Sandbox

TAKEN = 'sandcell_installed_template_snapshots_total{outcome="taken"}'
FAILED = 'sandcell_installed_template_snapshots_total{outcome="failed"}'
RESTORED = 'sandcell_template_creates_total{path="restored"}'

API = os.environ["E2B_API_URL"]
KEY = os.environ["E2B_API_KEY"]


def metric(http, series):
    for line in http.get("/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise SystemExit(f"/metrics has no {series}")


def wait_for_snapshot(http, deadline_s=300):
    end = time.monotonic() + deadline_s
    while metric(http, TAKEN) + metric(http, FAILED) == 0:
        if time.monotonic() > end:
            raise SystemExit("the template's snapshot was neither taken nor failed in 300 s")
        time.sleep(0.5)
    return metric(http, TAKEN) >= 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--shots", type=int, default=5)
    args = ap.parse_args()
    http = httpx.Client(base_url=API, headers={"X-API-Key": KEY}, timeout=300)
    names = ("sdk_create_ms", "sdk_first_screenshot_ms", "api_create_to_screenshot_ms",
             "sdk_screenshot_ms", "api_screenshot_ms", "sdk_click_ms", "api_click_ms",
             "base_create_ms")
    rows = {k: [] for k in names}
    t = time.monotonic()
    Sandbox.create(timeout=60).kill()
    first_create = ms(t)
    snapshot_taken = wait_for_snapshot(http)
    restored_before = metric(http, RESTORED)
    for _ in range(args.runs):
        t = time.monotonic()
        desk = Sandbox.create(timeout=300)
        rows["sdk_create_ms"].append(ms(t))
        try:
            t = time.monotonic()
            desk.screenshot()
            rows["sdk_first_screenshot_ms"].append(ms(t))
            for i in range(args.shots):
                t = time.monotonic()
                desk.screenshot()
                rows["sdk_screenshot_ms"].append(ms(t))
                t = time.monotonic()
                desk.left_click(300 + i, 300)
                rows["sdk_click_ms"].append(ms(t))
        finally:
            desk.kill()

        t = time.monotonic()
        r = http.post("/sandboxes", json={"templateID": "desktop", "timeout": 300})
        r.raise_for_status()
        sid = r.json()["sandboxID"]
        try:
            r = http.get(f"/sandboxes/{sid}/computer/screenshot")
            r.raise_for_status()
            rows["api_create_to_screenshot_ms"].append(ms(t))
            for i in range(args.shots):
                t = time.monotonic()
                http.get(f"/sandboxes/{sid}/computer/screenshot").raise_for_status()
                rows["api_screenshot_ms"].append(ms(t))
                t = time.monotonic()
                http.post(f"/sandboxes/{sid}/computer/mouse/click",
                          json={"x": 300 + i, "y": 300}).raise_for_status()
                rows["api_click_ms"].append(ms(t))
        finally:
            http.delete(f"/sandboxes/{sid}")

        t = time.monotonic()
        r = http.post("/sandboxes", json={"templateID": "base", "timeout": 60})
        r.raise_for_status()
        rows["base_create_ms"].append(ms(t))
        http.delete(f"/sandboxes/{r.json()['sandboxID']}")
    out = {k: stats(v) for k, v in rows.items()}
    out["sdk_first_create_ms"] = round(first_create, 1)
    out["snapshot_taken"] = snapshot_taken
    # Both the SDK's and the API's creates of each run.
    out["restored_creates"] = f"{int(metric(http, RESTORED) - restored_before)} of {2 * args.runs}"
    out["conditions"] = {
        "runtime": "gvisor",
        "runs": args.runs,
        "shots_per_run": args.shots,
        "load_after": open("/proc/loadavg").read().split()[:3],
        "daemon": os.environ.get("SANDCELL_BIN", "sandcell"),
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
