"""bench/volume's measuring (run by bench/volume/run.sh, which sets the E2B_* variables)."""

import argparse
import json
import os
import statistics

from e2b import Sandbox, Volume

MIB = 64
FILES = 500


def pct(xs, p):
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))], 1)


def summary(xs):
    return {"runs": len(xs), "p50": pct(xs, 50), "p90": pct(xs, 90), "p99": pct(xs, 99),
            "min": round(min(xs), 1), "max": round(max(xs), 1), "mean": round(statistics.mean(xs), 1)}


# One shell line per workload, timed inside the sandbox (its /proc/uptime, 10 ms steps) so
# that the SDK's round trip is not counted.
TIMED = "s=$(cut -d' ' -f1 /proc/uptime); {cmd}; e=$(cut -d' ' -f1 /proc/uptime); echo $s $e"
WORK = {
    "seq_write_mib_s": "dd if=/dev/zero of={dir}/seq bs=1M count={mib} conv=fsync 2>/dev/null",
    "seq_read_mib_s": "cat {dir}/seq > /dev/null",
    "small_files_per_s": "mkdir -p {dir}/small && i=0; while [ $i -lt {files} ]; do "
    "head -c 4096 /dev/zero > {dir}/small/f$i; i=$((i+1)); done; sync",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--template", default="minimal-bash")
    a = ap.parse_args()
    vol = Volume.create("bench-volume")
    sbx = Sandbox.create(template=a.template, timeout=1800, volume_mounts={"/v": vol})
    places = {"volume": "/v", "sandbox_disk": "/root/bench"}
    got = {p: {w: [] for w in WORK} for p in places}
    try:
        sbx.commands.run("mkdir -p /root/bench", user="root")
        for _ in range(a.runs):
            for place, d in places.items():
                sbx.commands.run(f"rm -rf {d}/seq {d}/small", user="root", timeout=600)
                for w, cmd in WORK.items():
                    line = TIMED.format(cmd=cmd.format(dir=d, mib=MIB, files=FILES))
                    start, end = sbx.commands.run(line, user="root", timeout=900).stdout.split()[-2:]
                    secs = max(float(end) - float(start), 0.01)
                    got[place][w].append((FILES if w == "small_files_per_s" else MIB) / secs)
    finally:
        sbx.kill()
        Volume.destroy(vol.volume_id)
    out = {
        "suite": "volume-gvisor",
        "backend": "JuiceFS 1.4.2 over SeaweedFS 4.48 (loopback), no writeback",
        "seq_mib": MIB,
        "small_files": FILES,
        "cpus": os.cpu_count(),
        "load1": float(open("/proc/loadavg").read().split()[0]),
        "results": {p: {w: summary(xs) for w, xs in ws.items()} for p, ws in got.items()},
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
