#!/usr/bin/env bash
# OCI image benchmark: `sandcell image pull` (download + verify + unpack + agent + mkfs.ext4)
# of a realistic image from a local registry on loopback, cold (empty cache, new data dir)
# and cached (layers already in the blob cache: unpack + mkfs only), against `skopeo copy`
# of the same image to an OCI layout (download only, the peer's lower bound for the pull).
#
# The image: the installed `base` image's tree (Debian bookworm and E2B's packages) as three
# gzip layers in an OCI layout written here, pushed to Debian's docker-registry with skopeo.
# Writes bench/image/results.json and prints it.
# Needs root (owners), docker-registry, skopeo, the installed base and minimal images (agent).
#   bench/image/run.sh [--runs N]     (N capped at 5: each cold run moves the whole image)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
data=${SANDCELL_DATA_DIR:-/var/lib/sandcell}
runs=3
case "${1:-}" in
  --runs) runs=$2 ;;
  "") ;;
  *) runs=$1 ;;
esac
[ "$runs" -le 5 ] || runs=5
die() { echo "bench/image: $*" >&2; exit 1; }
for tool in docker-registry skopeo python3 mkfs.ext4; do
  command -v "$tool" >/dev/null || die "$tool is missing (.ci/install-deps installs it)"
done
src=$data/images/base/rootfs
agent=$data/images/minimal/rootfs/sbin/sandcell-agent
[ -d "$src/usr" ] || die "the base image is needed at $src (make images install)"
[ -f "$agent" ] || die "the agent is needed at $agent (make install)"
cd "$root"
nice cargo build -q --release -p sandcell-cli
sandcell=$root/target/release/sandcell

tmp=$(mktemp -d /tmp/sc-bench-image.XXXXXX)
registry_pid=
cleanup() {
  [ -z "$registry_pid" ] || kill "$registry_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
host=127.0.0.1:$port
cat > "$tmp/registry.yml" <<EOF
version: 0.1
log:
  level: error
storage:
  filesystem:
    rootdirectory: $tmp/registry
http:
  addr: $host
EOF
docker-registry serve "$tmp/registry.yml" >"$tmp/registry.log" 2>&1 &
registry_pid=$!
python3 - "$host" <<'PY' || die "docker-registry did not start: $(cat "$tmp/registry.log")"
import sys, time, urllib.request
for _ in range(300):
    try:
        urllib.request.urlopen(f"http://{sys.argv[1]}/v2/", timeout=1); sys.exit(0)
    except Exception:
        time.sleep(0.1)
sys.exit(1)
PY

echo "bench/image: writing the OCI layout from $src" >&2
python3 - "$src" "$tmp/layout" <<'PY'
import gzip, hashlib, io, json, os, sys, tarfile
src, out = sys.argv[1], sys.argv[2]
os.makedirs(f"{out}/blobs/sha256")
def blob(data, media):
    d = hashlib.sha256(data).hexdigest()
    with open(f"{out}/blobs/sha256/{d}", "wb") as f:
        f.write(data)
    return {"mediaType": media, "digest": f"sha256:{d}", "size": len(data)}
# Three layers: usr/lib, the rest of usr, everything else.
groups = [["usr/lib"], [f"usr/{n}" for n in sorted(os.listdir(f"{src}/usr")) if n != "lib"],
          [n for n in sorted(os.listdir(src)) if n != "usr"]]
layers, diff_ids, total = [], [], 0
for i, names in enumerate(groups):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        if i == 1:
            t.add(f"{src}/usr", arcname="usr", recursive=False)
        for n in names:
            t.add(f"{src}/{n}", arcname=n)
    raw = raw.getvalue()
    total += len(raw)
    diff_ids.append("sha256:" + hashlib.sha256(raw).hexdigest())
    layers.append(blob(gzip.compress(raw, 6, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip"))
config = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": diff_ids},
          "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], "Cmd": ["/bin/bash"]}}
cdesc = blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": cdesc, "layers": layers}
mdesc = blob(json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")
mdesc["annotations"] = {"org.opencontainers.image.ref.name": "v1"}
json.dump({"schemaVersion": 2, "manifests": [mdesc]}, open(f"{out}/index.json", "w"))
open(f"{out}/oci-layout", "w").write('{"imageLayoutVersion":"1.0.0"}')
json.dump({"compressed_bytes": sum(l["size"] for l in layers), "uncompressed_bytes": total, "layers": len(layers)},
          open(f"{out}/../image-size.json", "w"))
PY
skopeo --insecure-policy copy -q --dest-tls-verify=false "oci:$tmp/layout:v1" "docker://$host/bench/base:v1" >&2
ref=$host/bench/base:v1

pull() { # pull DATA_DIR OUT.json [--force]
  SANDCELL_DATA_DIR=$1 "$sandcell" image pull "$ref" --name bench --insecure-registry "$host" \
    --agent "$agent" --json ${3:-} > "$2"
}
for i in $(seq "$runs"); do
  echo "bench/image: cold pull $i/$runs" >&2
  rm -rf "$tmp/data"
  pull "$tmp/data" "$tmp/cold-$i.json"
done
for i in $(seq "$runs"); do
  echo "bench/image: cached rebuild $i/$runs" >&2
  pull "$tmp/data" "$tmp/cached-$i.json" --force
done
for i in $(seq "$runs"); do
  echo "bench/image: skopeo copy $i/$runs" >&2
  rm -rf "$tmp/peer"
  start=$(date +%s%N)
  skopeo --insecure-policy copy -q --src-tls-verify=false "docker://$ref" "oci:$tmp/peer:v1" >&2
  end=$(date +%s%N)
  echo "{\"seconds\": $(( (end - start) / 1000000 ))e-3}" > "$tmp/skopeo-$i.json"
done

out=bench/image/results.json
python3 - "$tmp" "$runs" "$(nproc)" > "$out.tmp" <<'PY'
import json, statistics, sys
tmp, runs, cpus = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
load = lambda kind, key: [json.load(open(f"{tmp}/{kind}-{i}.json"))[key] for i in range(1, runs + 1)]
summary = lambda xs, what: {"runs": len(xs), "min": min(xs), "p50": statistics.median(xs), "max": max(xs), "what": what}
size = json.load(open(f"{tmp}/image-size.json"))
report = json.load(open(f"{tmp}/cold-1.json"))
print(json.dumps({
    "cpus": cpus,
    "image": {"source": "the installed base image's tree as an OCI image, local docker-registry on loopback",
              "layers": size["layers"], "compressed_mib": round(size["compressed_bytes"] / 2**20, 1),
              "uncompressed_mib": round(size["uncompressed_bytes"] / 2**20, 1),
              "entries": report["entries"], "ext4_mib": round(report["ext4Bytes"] / 2**20, 1)},
    "cold_pull_and_convert_s": summary(load("cold", "seconds"),
        "sandcell image pull, empty cache: download+verify, unpack, agent, mkfs.ext4 -d"),
    "cold_download_s": summary(load("cold", "pullSeconds"), "the download+verify part of the cold pull"),
    "cold_unpack_s": summary(load("cold", "unpackSeconds"), "the unpack part (layers in order, agent)"),
    "cold_mkfs_s": summary(load("cold", "mkfsSeconds"), "the mkfs.ext4 -d part"),
    "cached_convert_s": summary(load("cached", "seconds"),
        "sandcell image pull --force with every layer cached: manifest check, unpack, mkfs.ext4 -d"),
    "peer_skopeo_copy_s": summary(load("skopeo", "seconds"),
        "skopeo copy docker://... oci:DIR (download only, no unpack, no ext4)"),
}, indent=2, sort_keys=True))
PY
mv "$out.tmp" "$out"
cat "$out"
