#!/usr/bin/env bash
# The nested-KVM harness: proves that sandcell-vmm boots real Linux guests, on a host without
# hardware virtualization. QEMU (pure TCG) emulates an AMD CPU with SVM and NPT; an L1 Debian
# cloud kernel loads kvm-amd with nested=1 and runs the test batch (tests/nested/l1/tests.sh)
# against L2 guests: our kernel and the minimal image, booted by sandcell-vmm.
#
#   tests/nested/run.sh [--only name,name] [--timeout SECS] [--memory MIB] [--boots N]
#                       [--bench-json FILE]
#
# --boots N: vmm_smoke boots L2 N times (N samples of boot-to-agent-ready for the bench).
#
# Builds what it needs, each step cached: the static host binaries (cargo), the guest kernel
# (scripts/build-kernel.sh), the minimal image (scripts/build-image.sh), virtiofsd
# (scripts/build-virtiofsd.sh), the L1 kernel (l1-kernel.sh), the probe (rustc), the
# initramfs (build-initramfs.sh). Then one L1 boot
# under a hard timeout. Exit 0 only when every planned test printed PASS; otherwise 1, with
# the tail of the L1 console. The console log is kept in target/nested/console.log. A console
# silent for SANDCELL_NESTED_SILENT seconds (240; every L1 test reports within 180) means L1
# froze: QEMU's monitor view (registers, code at RIP) goes to target/nested/freeze.txt and
# QEMU is stopped.
#
# Inputs can be pinned instead of built: SANDCELL_NESTED_{AGENT,VMM,CLI,KERNEL,VIRTIOFSD}=PATH;
# VMM, CLI and VIRTIOFSD also take `none` (left out of L1: the tests that need them fail,
# saying so).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${SANDCELL_CACHE:-$HOME/.cache/sandcell}
outdir=$root/target/nested
only=
timeout=900
memory=2048
bench_json=
boots=1

usage() { echo "usage: $0 [--only name,name] [--timeout SECS] [--memory MIB] [--boots N] [--bench-json FILE]" >&2; exit 2; }
log() { echo "nested: $*" >&2; }
die() { echo "nested: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case "$1" in
    --only) only=$2 ;; --timeout) timeout=$2 ;; --memory) memory=$2 ;; --bench-json) bench_json=$2 ;;
    --boots) boots=$2 ;;
    *) usage ;;
  esac
  shift 2
done
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 is missing (Debian: qemu-system-x86)"
command -v cpio >/dev/null || die "cpio is missing"
mkdir -p "$outdir"

# --- host binaries: static, so L1 needs no libraries (the same flags as the agent's build,
# so the three share one build of their dependencies) ---
triple=x86_64-unknown-linux-gnu
bin_dir=$root/target/$triple/release
build_static() { # PACKAGE BIN ENV_OVERRIDE -> prints the binary's path, or nothing
  local override=$3
  if [ "$override" = none ]; then return; fi
  if [ -n "$override" ]; then echo "$override"; return; fi
  log "cargo build --release --target $triple -p $1 (static)"
  if (cd "$root" && RUSTFLAGS="-C target-feature=+crt-static" nice cargo build --quiet --release \
        --target "$triple" -p "$1" --bin "$2" 2>"$outdir/build-$1.err"); then
    echo "$bin_dir/$2"
  else
    log "WARNING: $1 does not build; the tests that need $2 will fail. First errors:"
    grep -A8 -m3 '^error' "$outdir/build-$1.err" >&2 || tail -n 20 "$outdir/build-$1.err" >&2
  fi
}
agent=$(build_static sandcell-agent sandcell-agent "${SANDCELL_NESTED_AGENT:-}")
vmm=$(build_static sandcell-vmm sandcell-vmm "${SANDCELL_NESTED_VMM:-}")
cli=$(build_static sandcell-cli sandcell "${SANDCELL_NESTED_CLI:-}")
[ -n "$agent" ] || die "without the agent there is no image to boot"

# --- guest kernel, image, L1 kernel, probe, initramfs ---
kernel=${SANDCELL_NESTED_KERNEL:-$(nice "$root/scripts/build-kernel.sh" | tail -n 1)}
image_dir=$(nice "$root/scripts/build-image.sh" minimal --agent "$agent" | tail -n 1)
l1=$("$here/l1-kernel.sh" | tail -n 1)
# virtiofsd (the vhost-user daemon behind sandcell-vmm's virtio-fs device): Debian 12 has no
# package of it, so it is built from crates.io. A failed build leaves it out of L1.
virtiofsd=${SANDCELL_NESTED_VIRTIOFSD:-}
if [ -z "$virtiofsd" ]; then
  virtiofsd=$(nice "$root/scripts/build-virtiofsd.sh" 2>"$outdir/build-virtiofsd.err" | tail -n 1) || {
    virtiofsd=
    log "WARNING: virtiofsd does not build; the tests that need it will fail. Last lines:"
    tail -n 20 "$outdir/build-virtiofsd.err" >&2
  }
fi
[ "$virtiofsd" != none ] || virtiofsd=

probe_key=$(cat "$here"/probe/*.rs | sha256sum | cut -c1-16)
probe=$cache/nested/nested-probe-$probe_key
if [ ! -x "$probe" ]; then
  log "compiling nested-probe"
  mkdir -p "$cache/nested"
  nice rustc --edition 2024 -O -C strip=symbols -C target-feature=+crt-static --target "$triple" \
    "$here/probe/nested_probe.rs" -o "$probe.tmp"
  mv "$probe.tmp" "$probe"
fi

initramfs=$("$here/build-initramfs.sh" --l1 "$l1" --kernel "$kernel" --image-dir "$image_dir" \
  --probe "$probe" ${vmm:+--vmm "$vmm"} ${cli:+--cli "$cli"} ${virtiofsd:+--virtiofsd "$virtiofsd"} \
  | tail -n 1)

# The desktop image for desktop_microvm, when that test is planned and the image is installed
# (test-e2b builds it before test-nested): L1's initramfs cannot hold 2.4 GB, so it goes to L1
# as a read-only virtio-blk disk, an ext4 holding the image's rootfs.ext4 (the VMM takes a
# regular file as its base), cached by the image's identity.
desktop_image=${SANDCELL_NESTED_DESKTOP:-/var/lib/sandcell/images/desktop/rootfs.ext4}
disk_args=()
if { [ -z "$only" ] || echo ",$only," | grep -q ',desktop_microvm,'; } && [ -f "$desktop_image" ]; then
  dkey=$(stat -L -c '%s %Y %i' "$desktop_image" | sha256sum | cut -c1-16)
  disk=$cache/nested/desktop-disk-$dkey.ext4
  if [ ! -f "$disk" ]; then
    log "making the desktop disk $disk from $desktop_image"
    rm -f "$cache"/nested/desktop-disk-*.ext4
    stage=$(mktemp -d "$cache/nested/desktop-stage.XXXXXX")
    ln "$desktop_image" "$stage/rootfs.ext4" 2>/dev/null || cp --sparse=always "$desktop_image" "$stage/rootfs.ext4"
    size=$(( $(stat -L -c %s "$desktop_image") / 1048576 + 512 ))
    nice mke2fs -q -F -t ext4 -d "$stage" "$disk.tmp" "${size}M" >&2
    rm -rf "$stage"
    mv "$disk.tmp" "$disk"
  fi
  disk_args=(-drive "file=$disk,if=virtio,format=raw,readonly=on")
  # The desktop guest gets 1 GiB of L1's memory.
  [ "$memory" -ge 3072 ] || memory=3072
elif [ -z "$only" ] || echo ",$only," | grep -q ',desktop_microvm,'; then
  log "WARNING: no desktop image at $desktop_image (make images install); desktop_microvm will fail"
fi

# --- one L1 boot ---
console=$outdir/console.log
# nohz=off highres=off: L1 ticks periodically. Under TCG an L1 running L2 guests has been
# seen (QEMU 7.2 and 10.0, about half of the boots) halted for good with its one-shot LAPIC
# timer's vector pending in the IRR and nothing waking the CPU to take it; a periodic timer
# raises its interrupt again on every tick, so one lost wake-up costs a tick, not the boot.
append="console=ttyS0 panic=-1 quiet nohz=off highres=off"
[ -z "$only" ] || append="$append nested.only=$only"
[ "$boots" = 1 ] || append="$append nested.boots=$boots"
log "booting L1 ($(cat "$l1/package"), -m $memory, hard timeout ${timeout}s); results as they come:"
start=$(date +%s)
monitor=$outdir/monitor.sock
rm -f "$monitor" "$outdir/qemu.pid" "$outdir/qemu.status" "$outdir/freeze.txt"
(
  set +e
  timeout -s KILL "$timeout" nice qemu-system-x86_64 -accel tcg -M q35 -cpu EPYC,+svm,+npt -smp 1 \
    -m "$memory" -nodefaults -no-user-config -nographic -no-reboot -serial stdio \
    -monitor "unix:$monitor,server,nowait" -pidfile "$outdir/qemu.pid" \
    -kernel "$l1/vmlinuz" -initrd "$initramfs" -append "$append" "${disk_args[@]}" </dev/null 2>"$outdir/qemu.err" \
    | sed -u 's/\r$//' | tee "$console" | grep --line-buffered -E '^NESTED-(PLAN|RESULT|BENCH|SECCOMP|DONE)' >&2
  echo "${PIPESTATUS[0]}" > "$outdir/qemu.status"
) &
runner=$!

# The QEMU monitor's view of a stopped L1 (registers, where it executes), for the record.
capture_qemu_state() {
  command -v python3 >/dev/null || { echo "no python3 to query the QEMU monitor"; return; }
  python3 - "$monitor" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.settimeout(3)
for cmd in ("info status", "info cpus", "info lapic", "info pic", "info registers", "x/8i $pc", "info registers", "x/8i $pc"):
    s.sendall((cmd + "\n").encode())
    time.sleep(1)
out = b""
try:
    while len(out) < 1 << 20:
        d = s.recv(65536)
        if not d:
            break
        out += d
except socket.timeout:
    pass
sys.stdout.write(out.decode(errors="replace"))
PY
}
# The monitor echoes what it is sent with line-editing escapes: keep the text.
strip_escapes() { sed -e 's/\x1b\[[0-9;]*[A-Za-z]//g' -e 's/\r//g'; }

# Every test in L1 prints its result within its watchdog (180 s); a console silent for
# longer means L1 itself stopped (seen under TCG: QEMU at 0% CPU, watchdogs silent). Then
# the QEMU state is captured and QEMU stopped, rather than waiting for the hard timeout.
silent_limit=${SANDCELL_NESTED_SILENT:-240}
last_size=-1
last_change=$(date +%s)
nmi_sent=0
while kill -0 "$runner" 2>/dev/null; do
  sleep 5
  size=$(stat -c %s "$console" 2>/dev/null || echo 0)
  now=$(date +%s)
  if [ "$size" != "$last_size" ]; then last_size=$size; last_change=$now; fi
  # Halfway to the limit, once per boot, an NMI (a diagnostic: an L1 that takes it prints "NMI received
  # for unknown reason" and goes on; a frozen one that cannot take it stays silent).
  if [ "$nmi_sent" = 0 ] && [ $((now - last_change)) -ge $((silent_limit / 2)) ] && [ -S "$monitor" ]; then
    nmi_sent=1
    log "L1 console silent for $((now - last_change))s: sending L1 an NMI (diagnostic)"
    python3 -c 'import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"nmi\n"); time.sleep(1)' \
      "$monitor" 2>/dev/null || true
  fi
  if [ $((now - last_change)) -ge "$silent_limit" ] && [ -f "$outdir/qemu.pid" ]; then
    log "L1 console silent for ${silent_limit}s: QEMU state into $outdir/freeze.txt, then stopping QEMU"
    { date -u; ps -o pid,stat,pcpu,time,rss,args -p "$(cat "$outdir/qemu.pid")" 2>&1; capture_qemu_state | strip_escapes; } \
      > "$outdir/freeze.txt" 2>&1 || true
    kill -KILL "$(cat "$outdir/qemu.pid")" 2>/dev/null || true
    break
  fi
done
wait "$runner" || true
qemu_status=$(cat "$outdir/qemu.status" 2>/dev/null || echo unknown)
elapsed=$(( $(date +%s) - start ))

# --- verdict: every planned test must have a PASS line, and the batch must have finished ---
plan=$(sed -n 's/^NESTED-PLAN//p' "$console" | head -n 1)
failures=0
[ -n "$plan" ] || { log "FAIL: L1 never printed its plan (QEMU status $qemu_status)"; failures=1; }
for t in $plan; do
  # Not anchored: an L1 kernel message (KVM's "Unhandled WRMSR", say) can land on the
  # console in the middle of the line before.
  line=$(grep -o -m1 "NESTED-RESULT $t .*" "$console" || true)
  case "$line" in
    "NESTED-RESULT $t PASS"*) ;;
    "NESTED-RESULT $t FAIL"*) failures=$((failures + 1)) ;;
    *) log "FAIL: $t printed no result"; failures=$((failures + 1)) ;;
  esac
done
grep -q '^NESTED-DONE' "$console" || { log "FAIL: the batch did not finish (QEMU status $qemu_status after ${elapsed}s)"; failures=$((failures + 1)); }

if [ -n "$bench_json" ]; then
  short_sha() { [ -n "$1" ] && [ -f "$1" ] && sha256sum "$1" | cut -c1-16 || echo none; }
  {
    printf '{\n  "harness": "tests/nested/run.sh",\n  "note": "nested KVM under QEMU TCG on a shared 2-core host: ~100x slower than hardware; behaviour, not speed",\n'
    printf '  "date": "%s",\n  "git": "%s",\n  "l1_kernel": "%s",\n  "qemu": "%s",\n' \
      "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)" \
      "$(cat "$l1/package")" "$(qemu-system-x86_64 --version | head -n 1 | awk '{ print $4 }')"
    printf '  "guest_kernel_sha256": "%s",\n  "vmm_sha256": "%s",\n  "agent_sha256": "%s",\n  "l1_wall_s": %d,\n  "all_passed": %s,\n  "results": {' \
      "$(short_sha "$kernel")" "$(short_sha "$vmm")" "$(short_sha "$agent")" "$elapsed" \
      "$([ "$failures" = 0 ] && echo true || echo false)"
    sep=
    for name in $(sed -n 's/^NESTED-BENCH \([^ ]*\) .*/\1/p' "$console" | sort -u); do
      unit=$(sed -n "s/^NESTED-BENCH $name [^ ]* //p" "$console" | head -n 1)
      samples=$(sed -n "s/^NESTED-BENCH $name \([^ ]*\) .*/\1/p" "$console" | sort -n)
      n=$(echo "$samples" | wc -l)
      p50=$(echo "$samples" | sed -n "$(( (n + 1) / 2 ))p")
      printf '%s\n    "%s": {"unit": "%s", "n": %d, "p50": %s, "min": %s, "max": %s, "samples": [%s]}' \
        "$sep" "$name" "$unit" "$n" "$p50" "$(echo "$samples" | head -n 1)" "$(echo "$samples" | tail -n 1)" \
        "$(sed -n "s/^NESTED-BENCH $name \([^ ]*\) .*/\1/p" "$console" | paste -sd, -)"
      sep=,
    done
    printf '\n  }\n}\n'
  } > "$bench_json"
  log "bench results in $bench_json"
fi

if [ "$failures" != 0 ]; then
  log "$failures failure(s) in ${elapsed}s; L1 console tail ($console):"
  tail -n 60 "$console" >&2
  [ ! -s "$outdir/freeze.txt" ] || { log "L1 froze; QEMU's state ($outdir/freeze.txt):"; head -n 80 "$outdir/freeze.txt" >&2; }
  # QEMU warns once per CPUID feature TCG lacks: expected, and noise here.
  qemu_err=$(grep -v "TCG doesn't support requested feature" "$outdir/qemu.err" | tail -n 10 || true)
  [ -z "$qemu_err" ] || { log "QEMU stderr:"; echo "$qemu_err" >&2; }
  exit 1
fi
log "all $(echo $plan | wc -w) tests passed in ${elapsed}s"
