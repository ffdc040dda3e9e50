#!/usr/bin/env bash
# sandcell-vmm on tiny payloads, p50/p90/p99 over N runs (default 20):
#  - start_to_first_output_ms: process spawn to the first console byte (1 vCPU, 128 MiB);
#    start_to_first_output_jailed_ms: the same under --jail (needs root), interleaved;
#    start_to_first_output_no_seccomp_ms: the same with --no-seccomp, interleaved
#  - idle_rss_mib / idle_pss_mib: smaps_rollup of an idle 128 MiB VM
#  - snapshots (bench_snapshot): pause, full and fork snapshots of 128/512 MiB guests to
#    tmpfs (/dev/shm), restore by process spawn and by a pre-started --wait-restore
#    process to the guest's first console byte, RSS/PSS of 50 restored clones
# Needs /dev/kvm and binutils (the payloads are assembled here). Writes
# bench/vmm/results.json and bench/vmm/snapshot-results.json and prints them. Firecracker
# on the project's build machines: 8.8 ms, 4.3 MiB RSS, 3.0 MiB PSS; snapshot figures in
# snapshot-results.json (`firecracker_same_host`, from crates/vmm/examples/bench_snapshot.rs).
#
#   bench/vmm/run.sh [--runs N]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
runs=20
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    *) echo "usage: $0 [--runs N]" >&2; exit 2 ;;
  esac
done
cd "$root"
cargo build --release -q -p sandcell-vmm --bin sandcell-vmm --example bench_vmm \
  --example bench_snapshot
payloads=crates/vmm/tests/payloads
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for p in hello idle counter chatter; do
  as -I "$payloads" -o "$work/$p.o" "$payloads/$p.S"
  ld -n --build-id=none -z noexecstack -T "$payloads/payload.ld" -o "$work/$p.elf" "$work/$p.o"
done
out=bench/vmm/results.json
target/release/examples/bench_vmm --vmm target/release/sandcell-vmm \
  --hello "$work/hello.elf" --idle "$work/idle.elf" --runs "$runs" > "$out.tmp"
mv "$out.tmp" "$out"
cat "$out"
snap=bench/vmm/snapshot-results.json
target/release/examples/bench_snapshot --vmm target/release/sandcell-vmm \
  --counter "$work/counter.elf" --chatter "$work/chatter.elf" --runs "$runs" > "$snap.tmp"
mv "$snap.tmp" "$snap"
cat "$snap"
