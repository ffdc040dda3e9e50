"""JuiceFS against s3backer over one SeaweedFS, on the host (run by bench/volume/compare.sh,
which starts SeaweedFS and sets TMP, S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY, JUICEFS).

Each run, for each backend in turn (interleaved run by run), on a fresh mount:

- seq_write_mib_s: `dd` of --mib MiB of random bytes (a file on the host's disk, read
  from its page cache), 1 MiB blocks, `conv=fsync`: until fsync returns.
- rand_write_iops: fio, 4 KiB random writes into that file for 5 s (psync, queue depth 1),
  then one fsync; I/Os divided by the wall time including that fsync.
- small_files_write_per_s: untar of --files small files (1 to 16 KiB of random bytes, in
  100 directories) and `sync -f`.
- then the mount is dropped (JuiceFS: unmounted, its cache directory emptied; s3backer:
  ext4 and the loop device released, s3backer unmounted, so nothing is cached in memory
  either) and remounted: cold reads. rand_read_iops_cold: fio 4 KiB random reads of the big
  file for 5 s; remount again; seq_read_mib_s_cold (`dd` to /dev/null),
  small_files_read_per_s_cold (`tar -c` of the tree to /dev/null); then the same again,
  warm (everything just read): seq_read_mib_s_warm, rand_read_iops_warm,
  small_files_read_per_s_warm.
- *_in_bucket: the same writes counted until they are in the bucket. JuiceFS (no
  write-back) has uploaded a file's blocks when its fsync or close returns, so these equal
  the figures above; s3backer's block cache writes back in the background (and its FUSE
  fsync does not wait for that: dirty_blocks_after_fsync, from its stats file, is the
  number of dirty blocks when the seq write's fsync returned), so its timer runs on until
  its stats file shows no dirty block.

JuiceFS: `juicefs format --storage s3 --trash-days 0 --capacity 10` with SQLite metadata and
`juicefs mount --background --no-usage-report --hide-internal --io-retries 3
--put-timeout 10s --get-timeout 10s --cache-dir ... --log ...` (what the daemon does,
crates/server/src/volumes/juicefs.rs; no --writeback). s3backer: 1 MiB blocks (see
S3B_BLOCK), its default in-memory block cache (1000 blocks), ext4 made with mkfs.ext4's
defaults (lazy init, no discard), mounted with defaults (data=ordered).
"""

import argparse
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from latency import stats  # noqa: E402

TMP = os.environ["TMP"]
JUICEFS = os.environ["JUICEFS"]
ENDPOINT = os.environ["S3_ENDPOINT"]
ACCESS = os.environ["S3_ACCESS_KEY"]
SECRET = os.environ["S3_SECRET_KEY"]
BUCKET = "sandcell"
S3B_BLOCK = "1M"
S3B_SIZE = "4G"
RAND_SECONDS = 5


def say(msg):
    print(f"==> {msg}", file=sys.stderr, flush=True)


def sh(*cmd, env=None, timeout=900):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: rc {r.returncode}: {r.stderr.strip()[-800:]}")
    return r.stdout


def summary(xs):
    return {**stats(xs), "min": round(min(xs), 1), "max": round(max(xs), 1),
            "mean": round(statistics.mean(xs), 1)}


def timed(*cmd):
    t = time.monotonic()
    sh(*cmd)
    return time.monotonic() - t


class Juicefs:
    name = "juicefs"

    def __init__(self):
        self.dir = os.path.join(TMP, "jfs")
        self.mnt = os.path.join(self.dir, "mnt")
        self.meta = f"sqlite3://{self.dir}/meta.db"
        self.env = dict(os.environ, ACCESS_KEY=ACCESS, SECRET_KEY=SECRET,
                        AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1")
        os.makedirs(self.mnt)
        sh(JUICEFS, "format", "--storage", "s3", "--bucket", f"{ENDPOINT}/{BUCKET}",
           "--trash-days", "0", "--no-update", "--capacity", "10", self.meta, "bench-jfs",
           env=self.env)

    def mount(self):
        shutil.rmtree(os.path.join(self.dir, "cache"), ignore_errors=True)
        sh(JUICEFS, "mount", "--background", "--no-usage-report", "--hide-internal",
           "--io-retries", "3", "--put-timeout", "10s", "--get-timeout", "10s",
           "--cache-dir", os.path.join(self.dir, "cache"),
           "--log", os.path.join(self.dir, "mount.log"), self.meta, self.mnt, env=self.env)
        return self.mnt

    def unmount(self):
        sh(JUICEFS, "umount", self.mnt)

    def dirty(self):
        return None

    def cleanup(self):
        subprocess.run([JUICEFS, "umount", "--force", self.mnt], capture_output=True)

    def settle(self):
        """Seconds until what was written is in the bucket: none, JuiceFS (no write-back)
        has uploaded it when fsync or close returns."""
        return 0.0

    def version(self):
        return sh(JUICEFS, "version").strip()


class S3backer:
    name = "s3backer"

    def __init__(self):
        self.dir = os.path.join(TMP, "s3b")
        self.fuse = os.path.join(self.dir, "fuse")
        self.mnt = os.path.join(self.dir, "mnt")
        self.loop = None
        os.makedirs(self.fuse)
        os.makedirs(self.mnt)
        self.access = os.path.join(self.dir, "access")
        fd = os.open(self.access, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, f"{ACCESS}:{SECRET}\n".encode())
        os.close(fd)
        self.fuse_mount()
        self.attach()
        sh("mkfs.ext4", "-q", "-E", "nodiscard", self.loop)
        self.detach()
        self.fuse_unmount()

    def fuse_mount(self):
        sh("s3backer", f"--accessFile={self.access}", f"--baseURL={ENDPOINT}/",
           f"--blockSize={S3B_BLOCK}", f"--size={S3B_SIZE}", "--prefix=s3backer/",
           "--listBlocks", "--quiet", BUCKET, self.fuse)

    def fuse_unmount(self):
        # A loop device detached releases its file a moment later.
        for i in range(300):
            try:
                sh("umount", self.fuse)
                break
            except RuntimeError:
                if i == 299:
                    users = subprocess.run(["fuser", "-vm", self.fuse], capture_output=True,
                                           text=True)
                    raise RuntimeError(f"{self.fuse} busy for 30 s: {users.stderr}")
                time.sleep(0.1)
        # s3backer writes its dirty blocks back and exits after the unmount.
        for _ in range(600):
            if not any(f" {self.fuse} " in line for line in open("/proc/mounts")):
                if not pids_of("s3backer", self.fuse):
                    return
            time.sleep(0.1)
        raise RuntimeError("s3backer did not exit after its unmount")

    def attach(self):
        self.loop = sh("losetup", "--find", "--show", os.path.join(self.fuse, "file")).strip()

    def detach(self):
        if shutil.which("udevadm"):
            # udev's probes of the device after the unmount keep it open a moment.
            subprocess.run(["udevadm", "settle", "--timeout=30"], check=False)
        sh("losetup", "-d", self.loop)
        # Detached once nothing holds it: then the backing file is released.
        backing = f"/sys/block/{os.path.basename(self.loop)}/loop/backing_file"
        for _ in range(600):
            if not os.path.exists(backing):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"{self.loop} still holds its file 60 s after losetup -d")
        self.loop = None

    def mount(self):
        self.fuse_mount()
        self.attach()
        sh("mount", "-t", "ext4", self.loop, self.mnt)
        return self.mnt

    def unmount(self):
        sh("umount", self.mnt)
        self.detach()
        self.fuse_unmount()

    def cleanup(self):
        """After a failure: whatever is still mounted or attached, released."""
        subprocess.run(["umount", self.mnt], capture_output=True)
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True)
        subprocess.run(["umount", self.fuse], capture_output=True)

    def dirty(self):
        """s3backer's dirty blocks now (its stats file)."""
        stats = open(os.path.join(self.fuse, "stats")).read()
        size = re.search(r"block_cache_current_size\s+(\d+)", stats)
        ratio = re.search(r"block_cache_dirty_ratio\s+([0-9.]+)", stats)
        if not (size and ratio):
            return None
        return round(int(size.group(1)) * float(ratio.group(1)))

    def settle(self):
        """Seconds until s3backer's block cache has no dirty block (all in the bucket)."""
        t = time.monotonic()
        while self.dirty():
            if time.monotonic() - t > 300:
                raise RuntimeError("s3backer kept dirty blocks for 300 s")
            time.sleep(0.02)
        return time.monotonic() - t

    def version(self):
        r = subprocess.run(["s3backer", "--version"], capture_output=True, text=True)
        return (r.stdout + r.stderr).strip().splitlines()[0]


def pids_of(name, arg):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = open(f"/proc/{d}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) == name.encode() and arg.encode() in argv:
            out.append(int(d))
    return out


def fio(directory, rw, extra=()):
    t = time.monotonic()
    out = sh("fio", "--name=r", f"--filename={directory}/seq", f"--rw={rw}", "--bs=4k",
             "--ioengine=psync", "--iodepth=1", "--time_based", f"--runtime={RAND_SECONDS}",
             "--output-format=json", *extra, timeout=300)
    wall = time.monotonic() - t
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = "read" if "read" in rw else "write"
    return job[side]["total_ios"], wall


def make_tree(path, files):
    """A tarball of `files` files of 1 to 16 KiB of random bytes in 100 directories."""
    rnd = open("/dev/urandom", "rb")
    with tarfile.open(path, "w") as tar:
        for i in range(files):
            size = 1024 + int.from_bytes(rnd.read(2), "little") % (15 * 1024)
            data = rnd.read(size)
            info = tarfile.TarInfo(f"d{i % 100}/f{i}")
            info.size = size
            info.mtime = int(time.time())
            tar.addfile(info, fileobj=io.BytesIO(data))


def one_run(fs, src, mib, tree, files, got):
    d = fs.mount()
    try:
        for p in ("seq", "small"):
            if os.path.lexists(os.path.join(d, p)):
                sh("rm", "-rf", os.path.join(d, p))
        sh("sync", "-f", d)
        s = timed("dd", f"if={src}", f"of={d}/seq", "bs=1M", "conv=fsync", "status=none")
        got["seq_write_mib_s"].append(mib / s)
        dirty = fs.dirty()
        if dirty is not None:
            got["dirty_blocks_after_fsync"].append(dirty)
        got["seq_write_mib_s_in_bucket"].append(mib / (s + fs.settle()))
        ios, wall = fio(d, "randwrite", ["--end_fsync=1"])
        got["rand_write_iops"].append(ios / wall)
        got["rand_write_iops_in_bucket"].append(ios / (wall + fs.settle()))
        os.makedirs(os.path.join(d, "small"))
        s = timed("sh", "-c", f"tar -xf {tree} -C {d}/small && sync -f {d}/small")
        got["small_files_write_per_s"].append(files / s)
        got["small_files_write_per_s_in_bucket"].append(files / (s + fs.settle()))
    finally:
        fs.unmount()
    d = fs.mount()
    try:
        ios, wall = fio(d, "randread")
        got["rand_read_iops_cold"].append(ios / wall)
    finally:
        fs.unmount()
    d = fs.mount()
    try:
        for temp in ("cold", "warm"):
            s = timed("dd", f"if={d}/seq", "of=/dev/null", "bs=1M", "status=none")
            got[f"seq_read_mib_s_{temp}"].append(mib / s)
            s = timed("sh", "-c", f"tar -cf - -C {d}/small . | cat >/dev/null")
            got[f"small_files_read_per_s_{temp}"].append(files / s)
            if temp == "warm":
                ios, wall = fio(d, "randread")
                got["rand_read_iops_warm"].append(ios / wall)
    finally:
        fs.unmount()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--files", type=int, default=2000)
    a = ap.parse_args()
    src = os.path.join(TMP, "src")
    sh("sh", "-c", f"head -c {a.mib << 20} /dev/urandom > {src}")
    tree = os.path.join(TMP, "small.tar")
    make_tree(tree, a.files)
    backends = [Juicefs(), S3backer()]
    keys = ["seq_write_mib_s", "seq_write_mib_s_in_bucket", "rand_write_iops",
            "rand_write_iops_in_bucket", "small_files_write_per_s",
            "small_files_write_per_s_in_bucket",
            "rand_read_iops_cold", "seq_read_mib_s_cold", "small_files_read_per_s_cold",
            "seq_read_mib_s_warm", "small_files_read_per_s_warm", "rand_read_iops_warm",
            "dirty_blocks_after_fsync"]
    got = {b.name: {k: [] for k in keys} for b in backends}
    load = [float(open("/proc/loadavg").read().split()[0])]
    t0 = time.monotonic()
    try:
        for r in range(a.runs):
            for fs in backends:
                say(f"run {r + 1}/{a.runs}: {fs.name}")
                one_run(fs, src, a.mib, tree, a.files, got[fs.name])
                say("  " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in got[fs.name].items() if v))
                load.append(float(open("/proc/loadavg").read().split()[0]))
    except BaseException:
        for fs in backends:
            fs.cleanup()
        raise
    weed = sh(os.environ["WEED"], "version").strip().splitlines()
    out = {
        "suite": "volume-backends",
        "what": "JuiceFS (the daemon's mount options) vs s3backer + ext4 on a loop device, "
                "on the host, one local SeaweedFS",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "juicefs": backends[0].version(),
        "s3backer": backends[1].version(),
        "seaweedfs": weed[-1] if weed else "",
        "kernel": os.uname().release,
        "s3backer_block_size": S3B_BLOCK,
        "s3backer_size": S3B_SIZE,
        "seq_mib": a.mib,
        "small_files": a.files,
        "small_files_bytes": os.path.getsize(tree),
        "rand_seconds": RAND_SECONDS,
        "cpus": os.cpu_count(),
        "load1_during": [round(x, 2) for x in load],
        "seconds": round(time.monotonic() - t0, 1),
        "results": {b: {k: summary(xs) for k, xs in ks.items() if xs}
                    for b, ks in got.items()},
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
