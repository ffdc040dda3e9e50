#!/bin/sh
# The test batch of the nested-KVM harness, run inside L1 by /init:
#   tests.sh all        run every test_* below in file order (or those listed in the kernel
#                       parameter nested.only=a,b,c), print results, never exit early
#   tests.sh one NAME   run test_NAME (what `all` does for each, in its own session)
#
# Console protocol (parsed by tests/nested/run.sh):
#   NESTED-PLAN name...                    the tests about to run
#   NESTED-RESULT name PASS|FAIL detail    one per planned test
#   NESTED-BENCH name value unit           measurements (behaviour checks, not speed claims:
#                                          L2 runs ~100x slower under TCG than on hardware)
#   NESTED-LOG name | line                 the tail of a failed test's log
#   NESTED-DONE passed=N failed=M          the batch finished
export PATH=/usr/bin:/bin:/usr/sbin:/sbin
DATA=/var/lib/sandcell
KERNEL=$DATA/kernels/default/vmlinux
BASE=$DATA/images/minimal/rootfs.ext4
AGENT_PORT=49983
# L2 boots with `quiet`: serial output costs ~1 ms a character under nested TCG.
L2_CMDLINE="console=ttyS0 quiet panic=-1 root=/dev/vda rw rootfstype=ext4"
TEST_TIMEOUT=${TEST_TIMEOUT:-180}
# desktop_microvm boots the 2.4 GB desktop image and starts a desktop and Chromium in L2.
DESKTOP_TIMEOUT=${DESKTOP_TIMEOUT:-480}
# An L2 boot takes ~25 s under nested TCG on an idle host (more on a loaded one): the agent
# gets 120 s, not the default 30.
export SANDCELL_BOOT_TIMEOUT_SECS=120
# The VMM's seccomp filters enforce here as in the runtime (a syscall outside them kills the
# VMM, and its test fails); the kernel's audit records of any kill are printed at the end.
SELF=$0

# ---- helpers for tests -------------------------------------------------------------------

# fail MSG / pass MSG: the one-line detail of the result, then end the test.
fail() { echo "$*" > "$DETAIL"; echo "FAIL: $*"; exit 1; }
pass() { echo "$*" > "$DETAIL"; exit 0; }
bench() { echo "$1 $2 $3" >> "$BENCH"; }
now_cs() { awk '{ printf "%d", $1 * 100 }' /proc/uptime; }
need() {
  for b in "$@"; do
    command -v "$b" >/dev/null || fail "$b is not in the initramfs (did its cargo build fail?)"
  done
}
need_l2() {
  [ -c /dev/kvm ] || fail "/dev/kvm is missing in L1"
  [ -f "$KERNEL" ] || fail "guest kernel $KERNEL is missing"
  [ -f "$BASE" ] || fail "base image $BASE is missing"
}

# vm_config DIR CMDLINE VCPUS MEM_MIB [vsock]: a sandcell-vmm config with a writable layer
# over the base image, a serial log and a control socket (and vsock if asked), all under DIR.
# Only the tests that talk to the agent ask for vsock, so the others depend on less.
vm_config() {
  vsock=
  [ "${5:-}" != vsock ] || vsock="\"vsock\": {\"guest_cid\": 3, \"uds_path\": \"$1/vsock\"},"
  cat > "$1/vm.json" <<EOF
{"vcpus": $3, "memory_mib": $4, "kernel": "$KERNEL", "cmdline": "$2",
 "disk": {"base": "$BASE", "overlay": "$1/overlay"}, $vsock
 "serial_log": "$1/serial.log", "control_socket": "$1/control"}
EOF
}

# run_vmm DIR: boot DIR/vm.json to its end; prints the VMM's exit status.
run_vmm() {
  set +e
  timeout -s KILL 120 sandcell-vmm --config "$1/vm.json" >"$1/vmm.out" 2>&1
  echo $?
  set -e
}

show_serial() { echo "--- L2 serial log (tail)"; tail -n 20 "$1/serial.log" 2>/dev/null; }

SC_RUN="sandcell run --runtime microvm --data-dir $DATA"

# serve_ready LOG [TENTHS]: waits until the daemon logging to LOG listens (TENTHS of a second,
# default 300), then sets key to the admin key; fails the test otherwise.
serve_ready() {
  n=0
  until grep -q "listening on" "$1" 2>/dev/null; do
    n=$((n + 1)); [ $n -lt "${2:-300}" ] || { tail -n 20 "$1"; fail "sandcell serve never listened ($1)"; }
    sleep 0.1
  done
  key=$(cat $DATA/admin.key 2>/dev/null) || { tail -n 20 "$1"; fail "no admin key in $DATA/admin.key"; }
}

# sc DIR ARGS...: `sandcell run` with stdout/stderr to DIR/out, DIR/err; prints the status.
sc() {
  d=$1; shift
  set +e
  timeout -s KILL 150 $SC_RUN "$@" >"$d/out" 2>"$d/err" </dev/null
  echo $?
  set -e
}

show_run() {
  echo "--- stdout (head)"; head -c 600 "$1/out"; echo
  echo "--- stderr (tail)"; tail -n 15 "$1/err"
  newest=$(ls -1t "$DATA"/sandboxes/*/console.log 2>/dev/null | head -n 1)
  [ -z "$newest" ] || { echo "--- $newest (tail)"; tail -n 15 "$newest"; }
}

expect_status() { # DIR EXPECTED GOT WHAT
  [ "$3" = "$2" ] || { show_run "$1"; fail "$4: exit status $3, expected $2"; }
}

# ---- L1 ----------------------------------------------------------------------------------

test_l1_kvm() {
  [ -c /dev/kvm ] || fail "/dev/kvm missing after loading kvm-amd"
  nested=$(cat /sys/module/kvm_amd/parameters/nested 2>/dev/null)
  npt=$(cat /sys/module/kvm_amd/parameters/npt 2>/dev/null)
  # nested is an int parameter, npt a bool (Y/N).
  case "$nested" in 1|Y) ;; *) fail "kvm_amd nested=$nested" ;; esac
  case "$npt" in 1|Y) ;; *) fail "kvm_amd npt=$npt" ;; esac
  pass "/dev/kvm present, kvm_amd nested=1 npt=1, $(grep -c ^processor /proc/cpuinfo) L1 cpu(s)"
}

# ---- sandcell-vmm directly ------------------------------------------------------------------

# Boot the minimal image to its agent, time it, power it off through the agent; N times
# with the kernel parameter nested.boots=N (the bench asks for several samples).
test_vmm_smoke() {
  need sandcell-vmm nested-probe; need_l2
  boots=$(tr ' ' '\n' < /proc/cmdline | sed -n 's/^nested\.boots=\([0-9]*\)$/\1/p')
  boots=${boots:-1}
  i=1
  while [ "$i" -le "$boots" ]; do
    d=/tmp/vmm_smoke/$i; mkdir -p $d
    vm_config $d "$L2_CMDLINE init=/sbin/sandcell-agent --listen vsock:$AGENT_PORT" 1 256 vsock
    set +e
    nested-probe boot --vmm sandcell-vmm --config $d/vm.json --uds $d/vsock --then poweroff \
      --ready-timeout 120 --exit-timeout 60 > $d/probe.out
    rc=$?
    set -e
    cat $d/probe.out
    ready=$(sed -n 's/^ready_ms=//p' $d/probe.out)
    exit_status=$(sed -n 's/^vmm_exit=//p' $d/probe.out)
    if [ -z "$ready" ]; then
      show_serial $d
      fail "boot $i: the agent never answered /health (probe status $rc, vmm_exit=${exit_status:-none})"
    fi
    bench l2_boot_to_agent_ready_ms "$ready" ms
    if [ "$rc" != 0 ] || [ "$exit_status" != 0 ]; then
      show_serial $d
      fail "boot $i: agent ready after ${ready} ms, but POST /sandcell/poweroff did not end the VMM with 0 (PowerOff): vmm_exit=${exit_status:-none (still running, killed)}"
    fi
    i=$((i + 1))
  done
  pass "agent answered /health ${ready} ms after spawn; poweroff -> VMM exit 0 (boots: $boots)"
}

# An init that exits panics the guest kernel; the VMM must say so (ExitStatus::GuestPanic).
test_vmm_panic() {
  need sandcell-vmm; need_l2
  d=/tmp/vmm_panic; mkdir -p $d
  vm_config $d "$L2_CMDLINE init=/bin/false" 1 128
  status=$(run_vmm $d)
  [ "$status" = 5 ] || { cat $d/vmm.out; show_serial $d; fail "VMM exit $status, expected 5 (GuestPanic)"; }
  grep -q "Kernel panic" $d/serial.log || { show_serial $d; fail "exit 5 but no 'Kernel panic' in the serial log"; }
  pass "init exit -> Kernel panic -> VMM exit 5"
}

# Writes reach the writable layer, never the base image, and survive into the next boot of
# that layer. The guest's init is a shell given on the kernel command line (arguments without
# '=' or '.' go to init).
test_vmm_overlay() {
  need sandcell-vmm; need_l2
  d=/tmp/vmm_overlay; mkdir -p $d
  before=$(md5sum < $BASE)
  vm_config $d "$L2_CMDLINE init=/bin/sh -c \\\"echo SANDCELL_OVERLAY_MARKER >/marker;sync\\\"" 1 128
  status=$(run_vmm $d)
  [ "$status" = 5 ] || { cat $d/vmm.out; show_serial $d; fail "writer boot: VMM exit $status, expected 5 (init exits -> panic)"; }
  [ -s $d/overlay ] || fail "the writable layer $d/overlay is empty after the write"
  grep -q SANDCELL_OVERLAY_MARKER $d/overlay || fail "the marker is not in the writable layer"
  rm -f $d/serial.log
  vm_config $d "$L2_CMDLINE init=/bin/sh -c \\\"cat /marker;sleep 1\\\"" 1 128
  status=$(run_vmm $d)
  grep -q SANDCELL_OVERLAY_MARKER $d/serial.log || { show_serial $d; fail "second boot (VMM exit $status) did not read the marker back"; }
  [ "$(md5sum < $BASE)" = "$before" ] || fail "the base image changed"
  pass "marker in the writable layer ($(du -k $d/overlay | cut -f1) KiB used), base unchanged, read back on reboot"
}

# ---- sandcell run --runtime microvm -----------------------------------------------------------

test_run_exit_codes() {
  need sandcell sandcell-vmm; need_l2
  d=/tmp/run_exit_codes; mkdir -p $d
  s=$(sc $d -- true); expect_status $d 0 "$s" "true"
  s=$(sc $d -- sh -c 'exit 3'); expect_status $d 3 "$s" "exit 3"
  s=$(sc $d -- sh -c 'kill -9 $$'); expect_status $d 137 "$s" "kill -9 \$\$"
  pass "true -> 0, exit 3 -> 3, kill -9 \$\$ -> 137"
}

test_run_stdio() {
  need sandcell sandcell-vmm; need_l2
  d=/tmp/run_stdio; mkdir -p $d
  s=$(sc $d -- sh -c 'echo out1; echo err1 >&2; echo out2; echo err2 >&2; echo out3')
  expect_status $d 0 "$s" "echo"
  printf 'out1\nout2\nout3\n' > $d/want_out
  printf 'err1\nerr2\n' > $d/want_err
  cmp -s $d/out $d/want_out || { show_run $d; fail "stdout is not out1..out3 in order"; }
  cmp -s $d/err $d/want_err || { show_run $d; fail "stderr is not err1, err2 in order"; }
  pass "stdout and stderr apart and in order"
}

test_run_big_output() {
  need sandcell sandcell-vmm; need_l2
  d=/tmp/run_big_output; mkdir -p $d
  s=$(sc $d -- sh -c 'head -c 10485760 /dev/urandom > /tmp/big && md5sum < /tmp/big >&2 && cat /tmp/big')
  expect_status $d 0 "$s" "10 MiB"
  size=$(wc -c < $d/out)
  [ "$size" = 10485760 ] || { show_run $d; fail "got $size bytes of stdout, expected 10485760"; }
  want=$(grep -o '^[0-9a-f]\{32\}' $d/err | head -n 1)
  got=$(md5sum < $d/out | cut -c1-32)
  [ -n "$want" ] || { show_run $d; fail "no md5 on stderr"; }
  [ "$got" = "$want" ] || fail "10 MiB stdout md5 $got, the guest computed $want"
  pass "10 MiB of stdout intact (md5 $got)"
}

test_run_stdin() {
  need sandcell sandcell-vmm; need_l2
  d=/tmp/run_stdin; mkdir -p $d
  head -c 1048576 /dev/urandom > $d/in
  want=$(md5sum < $d/in | cut -c1-32)
  set +e
  timeout -s KILL 150 $SC_RUN -- sh -c 'md5sum; echo done >&2' < $d/in > $d/out 2> $d/err
  s=$?
  set -e
  expect_status $d 0 "$s" "md5sum of stdin"
  got=$(cut -c1-32 $d/out)
  [ "$got" = "$want" ] || { show_run $d; fail "the guest read stdin with md5 '$got', expected $want"; }
  pass "1 MiB piped to stdin arrived intact, EOF seen"
}

test_run_vcpus() {
  need sandcell sandcell-vmm; need_l2
  d=/tmp/run_vcpus; mkdir -p $d
  s=$(sc $d --vcpus 2 -- sh -c 'grep -c ^processor /proc/cpuinfo')
  expect_status $d 0 "$s" "--vcpus 2"
  [ "$(cat $d/out)" = 2 ] || { show_run $d; fail "--vcpus 2: the guest sees $(cat $d/out) cpu(s)"; }
  pass "--vcpus 2 -> 2 processors in /proc/cpuinfo"
}

test_run_memory() {
  need sandcell sandcell-vmm; need_l2
  d=/tmp/run_memory; mkdir -p $d
  s=$(sc $d --memory 512 -- cat /proc/meminfo)
  expect_status $d 0 "$s" "--memory 512"
  kib=$(awk '/^MemTotal:/ { print $2 }' $d/out)
  [ -n "$kib" ] || { show_run $d; fail "no MemTotal in /proc/meminfo"; }
  # 512 MiB minus what the kernel keeps for itself (a tinyconfig kernel keeps little).
  [ "$kib" -gt $((448 * 1024)) ] && [ "$kib" -le $((512 * 1024)) ] \
    || fail "--memory 512: MemTotal $kib KiB, expected 448..512 MiB"
  pass "--memory 512 -> MemTotal $kib KiB"
}

test_run_disk_overlay() {
  need sandcell sandcell-vmm; need_l2
  d=/tmp/run_disk_overlay; mkdir -p $d
  before=$(md5sum < $BASE)
  s=$(sc $d -- sh -c 'echo SANDCELL_RUN_MARKER > /root/written && sync && cat /root/written')
  expect_status $d 0 "$s" "write /root/written"
  grep -q SANDCELL_RUN_MARKER $d/out || { show_run $d; fail "the guest could not read back its write"; }
  s=$(sc $d -- sh -c 'test ! -e /root/written')
  expect_status $d 0 "$s" "a second sandbox must not see the first one's write"
  # Hashing 64 MiB costs seconds under TCG: once before, once after both sandboxes.
  [ "$(md5sum < $BASE)" = "$before" ] || fail "the base image changed"
  pass "write visible inside, base image unchanged, next sandbox starts clean"
}

test_run_poweroff() {
  need sandcell sandcell-vmm; need_l2
  d=/tmp/run_poweroff; mkdir -p $d
  # busybox poweroff signals PID 1 (SIGUSR2) and returns at once: the command must not get
  # to its next line, the guest must go down, and `sandcell run` must report that as 0.
  s=$(sc $d -- sh -c 'poweroff; sleep 60; echo STILL_RUNNING')
  grep -q STILL_RUNNING $d/out && { show_run $d; fail "poweroff inside the guest did nothing (the command ran on; does PID 1 handle SIGUSR2?)"; }
  expect_status $d 0 "$s" "poweroff inside the guest"
  pass "poweroff inside the guest -> the guest went down, sandcell run exits 0"
}

test_run_panic() {
  need sandcell sandcell-vmm; need_l2
  d=/tmp/run_panic; mkdir -p $d
  s=$(sc $d -- sh -c 'test -e /proc/sysrq-trigger || { echo NO_SYSRQ; exit 99; }; echo c > /proc/sysrq-trigger; sleep 30')
  grep -q NO_SYSRQ $d/out && fail "the guest kernel has no /proc/sysrq-trigger (CONFIG_MAGIC_SYSRQ); cannot panic it from inside"
  [ "$s" != 0 ] || { show_run $d; fail "guest panic reported as exit 0"; }
  grep -qi panic $d/err || { show_run $d; fail "exit $s but stderr does not mention the panic"; }
  pass "guest panic -> sandcell run exit $s, stderr: $(grep -i panic $d/err | head -n 1 | cut -c1-80)"
}

# A volume through the runtime (`sandcell run --volume`): the microvm runtime starts a
# virtiofsd for the host directory, gives the VMM its virtio-fs device and the agent mounts
# it from `sandcell.fs=`. What the guest writes and fsyncs is in the host directory when the
# command ends; the virtiofsd is gone with the sandbox.
test_run_volume() {
  need sandcell sandcell-vmm virtiofsd; need_l2
  d=/tmp/run_volume; rm -rf $d; mkdir -p $d/share
  echo from-host > $d/share/in.txt
  # With the VMM jailed (required: the run fails without a jail), so the socket hand-over to
  # the jail's uid is on the path.
  s=$(SANDCELL_VMM_JAIL=1 sc $d --volume $d/share:/data -- sh -c 'cat /data/in.txt; echo from-guest > /data/out.txt; mkdir -p /data/d/e; head -c 65536 /dev/urandom > /data/d/e/bin; sync /data/d/e/bin; md5sum < /data/d/e/bin')
  expect_status $d 0 "$s" "a command on a volume"
  [ "$(head -n 1 $d/out)" = from-host ] || { show_run $d; fail "the guest did not read the host's file through the volume"; }
  [ "$(cat $d/share/out.txt 2>/dev/null)" = from-guest ] || { show_run $d; fail "the guest's file is not in the host directory"; }
  [ "$(md5sum < $d/share/d/e/bin | cut -c1-32)" = "$(sed -n 2p $d/out | cut -c1-32)" ] || fail "the fsynced 64 KiB differ on the host"
  n=0
  while pgrep -x virtiofsd > /dev/null; do
    n=$((n + 1)); [ $n -lt 100 ] || { ps; fail "a virtiofsd outlived its sandbox by 5 s"; }
    sleep 0.05
  done
  s=$(sc $d --volume $d/share:/bad,path -- true)
  [ "$s" != 0 ] && grep -q "commas" $d/err || { show_run $d; fail "a mount path the command line cannot carry was not refused by name"; }
  pass "host file read, guest files (a nested dir, fsynced 64 KiB, md5 equal) in the host directory; no virtiofsd left; a bad mount path refused"
}

# The desktop image on the microvm runtime: the `desktop` template's own session script
# (Xvfb at 1024x768, the xfce4 session) comes up in a microVM, Chromium from Debian starts in
# it and opens a page, and a screenshot (scrot, as the Computer API takes them) shows the
# page's colour. The image reaches L1 as a read-only disk (run.sh); L2 gets 1 GiB.
test_desktop_microvm() {
  need sandcell sandcell-vmm; need_l2
  d=/tmp/desktop_microvm; rm -rf $d; mkdir -p $d /mnt/desktop
  if [ ! -b /dev/vda ]; then
    for m in $(cat /lib/modules/net/order); do insmod /lib/modules/net/$m.ko 2>/dev/null || true; done
    n=0
    until [ -b /dev/vda ]; do
      n=$((n + 1)); [ $n -lt 100 ] || fail "no desktop disk in L1 (/dev/vda): is the desktop image installed? (run.sh says)"
      sleep 0.1
    done
  fi
  grep -q ' /mnt/desktop ' /proc/mounts || mount -o ro,noload /dev/vda /mnt/desktop \
    || fail "mounting the desktop disk failed"
  [ -f /mnt/desktop/rootfs.ext4 ] || fail "the desktop disk holds no rootfs.ext4"
  cat > $d/guest.sh <<'GUEST'
up() { cut -d' ' -f1 /proc/uptime; }
export DISPLAY=:0 NO_AT_BRIDGE=1 HOME=/root
echo "start $(up)"
/usr/local/lib/sandcell/desktop-session.sh > /tmp/session.log 2>&1 &
i=0
until pgrep -x xfce4-session >/dev/null && pgrep -x xfwm4 >/dev/null && xdpyinfo >/dev/null 2>&1; do
  i=$((i + 1)); [ $i -lt 2400 ] || { echo "the desktop session never came up"; tail -n 20 /tmp/session.log; exit 1; }
  sleep 0.1
done
echo "desktop $(up) $(xdotool getdisplaygeometry)"
# Under nested TCG every process start and every JIT-compiled page costs seconds: one
# process, no V8 JIT, nothing in the background.
chromium --no-sandbox --single-process --no-zygote --js-flags=--jitless --disable-gpu \
  --disable-extensions --disable-component-update --disable-background-networking \
  --disable-features=Translate,MediaRouter,OptimizationHints --no-first-run \
  --no-default-browser-check --disable-dev-shm-usage --user-data-dir=/tmp/chromium \
  --window-position=0,0 --window-size=1024,768 \
  'data:text/html,<body style="margin:0;background:rgb(200,30,40)"><h1>Sandcell</h1></body>' \
  > /tmp/chromium.log 2>&1 &
i=0
until xdotool search --onlyvisible --class chromium >/dev/null 2>&1; do
  i=$((i + 1)); [ $i -lt 3600 ] || { echo "no Chromium window"; tail -n 20 /tmp/chromium.log; exit 1; }
  sleep 0.1
done
echo "window $(up) $(xdotool search --onlyvisible --class chromium | head -n 1)"
i=0
while :; do
  scrot -o /tmp/shot.png
  red=$(python3 -c '
from PIL import Image
im = Image.open("/tmp/shot.png").convert("RGB").resize((64, 48))
px = list(im.getdata())
print(sum(1 for r, g, b in px if r > 150 and g < 90 and b < 90) * 100 // len(px))')
  [ "$red" -lt 30 ] || break
  i=$((i + 1)); [ $i -lt 60 ] || { echo "the page never showed: ${red}% red"; exit 1; }
  echo "shot $(up) red=${red}%"
  sleep 2
done
echo "painted $(up) red=${red}% size=$(stat -c %s /tmp/shot.png)"
GUEST
  # Longer than the other tests (DESKTOP_TIMEOUT in run_one): a line on the console every
  # minute, so that run.sh does not take the silence for a frozen L1.
  ( while sleep 60; do echo "NESTED-ALIVE desktop_microvm" > /dev/console; done ) &
  alive=$!
  set +e
  t0=$(now_cs)
  { timeout -s KILL $((DESKTOP_TIMEOUT - 20)) $SC_RUN --image /mnt/desktop/rootfs.ext4 --memory 1024 \
      -- sh -s < $d/guest.sh 2> $d/err; echo $? > $d/status; } | tee $d/out
  s=$(cat $d/status)
  set -e
  kill $alive 2>/dev/null || true
  [ "$s" = 0 ] || { show_run $d; fail "the desktop run exited $s: $(tail -n 2 $d/out | tr '\n' ' ')"; }
  bench desktop_microvm_run_to_painted_ms $(( ($(now_cs) - t0) * 10 )) ms
  grep -q '^painted ' $d/out || fail "no screenshot result"
  pass "$(tr '\n' ' ' < $d/out | cut -c1-200)"
}

# ---- the daemon --------------------------------------------------------------------------------

# `sandcell serve --runtime microvm`: create a sandbox over REST (1 vCPU: a 2-vCPU L2 may not
# boot within the runtime's 30 s boot timeout under nested TCG), run a command in it through
# the envd proxy (the SDKs' path: E2b-Sandbox-Id/Port headers and the access token). The
# daemon and its VMM end with the test's session.
test_daemon_smoke() {
  need sandcell sandcell-vmm nested-probe; need_l2
  d=/tmp/daemon_smoke; mkdir -p $d
  ip link set lo up 2>/dev/null || true
  # A cold boot on purpose (daemon_template tests the template snapshot path).
  sandcell --data-dir $DATA serve --runtime microvm --no-network --no-template-snapshots \
    --listen 127.0.0.1:3000 --min-free-disk-mib 16 --memory-overcommit 4 > $d/serve.out 2>&1 &
  serve_ready $d/serve.out
  t0=$(now_cs)
  nested-probe post --tcp 127.0.0.1:3000 --timeout 150 --path /sandboxes --header "X-API-Key: $key" \
    --body '{"templateID":"minimal","timeout":120,"cpuCount":1,"memoryMB":256}' > $d/create.out 2>&1 \
    || { cat $d/create.out; tail -n 20 $d/serve.out; fail "POST /sandboxes: $(head -c 300 $d/create.out)"; }
  bench daemon_create_cold_ms $(( ($(now_cs) - t0) * 10 )) ms
  id=$(sed -n 's/.*"sandboxID":"\([^"]*\)".*/\1/p' $d/create.out)
  token=$(sed -n 's/.*"envdAccessToken":"\([^"]*\)".*/\1/p' $d/create.out)
  [ -n "$id" ] || fail "no sandboxID in $(head -c 300 $d/create.out)"
  tok=; [ -z "$token" ] || tok="X-Access-Token: $token"
  set +e
  nested-probe exec --tcp 127.0.0.1:3000 --timeout 60 --header "E2b-Sandbox-Id: $id" \
    --header "E2b-Sandbox-Port: 49983" ${tok:+--header "$tok"} "echo DAEMON_\$((6 * 7)); uname -r" \
    > $d/exec.out 2> $d/exec.err
  s=$?
  set -e
  [ "$s" = 0 ] && grep -q DAEMON_42 $d/exec.out \
    || { cat $d/exec.out $d/exec.err; tail -n 20 $d/serve.out; fail "command through the envd proxy: exit $s"; }
  kernel=$(sed -n 2p $d/exec.out)
  pass "daemon (microvm): created $id, ran a command through the envd proxy (guest kernel $kernel)"
}

# ---- snapshots (snapshot.sh), virtio-net (net.sh), templates (template.sh), the VMM's jail
# (jail.sh), hostile guests (attacks.sh) ------------------------------------------------------

. "$(dirname "$SELF")/snapshot.sh"
. "$(dirname "$SELF")/net.sh"
. "$(dirname "$SELF")/template.sh"
. "$(dirname "$SELF")/jail.sh"
. "$(dirname "$SELF")/attacks.sh"

# ---- runner ----------------------------------------------------------------------------------

run_one() {
  name=$1
  log=/tmp/nested-logs/$name.log
  DETAIL=/tmp/nested-logs/$name.detail
  BENCH=/tmp/nested-logs/$name.bench
  export DETAIL BENCH
  : > "$DETAIL"; : > "$BENCH"
  start=$(now_cs)
  setsid /bin/sh "$SELF" one "$name" > "$log" 2>&1 &
  pid=$!
  limit=$TEST_TIMEOUT
  [ "$name" != desktop_microvm ] || limit=$DESKTOP_TIMEOUT
  ( sleep "$limit"; kill -9 -"$pid" 2>/dev/null; echo "TIMEOUT after ${limit}s" > "$DETAIL" ) &
  watchdog=$!
  wait "$pid"
  rc=$?
  kill "$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null
  kill -9 -"$pid" 2>/dev/null   # whatever the test left running
  secs=$(( ($(now_cs) - start) / 100 ))
  detail=$(head -n 1 "$DETAIL")
  while read -r b; do echo "NESTED-BENCH $b"; done < "$BENCH"
  if [ "$rc" = 0 ]; then
    echo "NESTED-RESULT $name PASS ${secs}s ${detail}"
    return 0
  fi
  echo "NESTED-RESULT $name FAIL ${secs}s ${detail:-exit status $rc}"
  tail -n 60 "$log" | sed "s/^/NESTED-LOG $name | /"
  return 1
}

case "$1" in
  one)
    set -e
    "test_$2"
    ;;
  all)
    mkdir -p /tmp/nested-logs
    only=$(tr ' ' '\n' < /proc/cmdline | sed -n 's/^nested\.only=//p' | tr ',' ' ')
    plan=
    for t in $(sed -n 's/^test_\([a-z0-9_]*\)() {$/\1/p' "$SELF" "$(dirname "$SELF")/snapshot.sh" "$(dirname "$SELF")/net.sh" "$(dirname "$SELF")/template.sh" "$(dirname "$SELF")/jail.sh" "$(dirname "$SELF")/attacks.sh"); do
      if [ -z "$only" ] || echo " $only " | grep -q " $t "; then plan="$plan $t"; fi
    done
    echo "NESTED-PLAN$plan"
    passed=0; failed=0
    for t in $plan; do
      if run_one "$t"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    done
    # Syscalls the VMM's filters killed (or, under SANDCELL_VMM_SECCOMP=log, would have):
    # the kernel's audit records, for completing crates/vmm/src/seccomp/.
    dmesg 2>/dev/null | grep -E 'type=1326|seccomp' | grep -o 'comm="[^"]*".*syscall=[0-9]*' \
      | sort | uniq -c | sed 's/^/NESTED-SECCOMP /' | head -n 40
    echo "NESTED-DONE passed=$passed failed=$failed"
    ;;
  *)
    echo "usage: $0 all | one NAME" >&2
    exit 2
    ;;
esac
