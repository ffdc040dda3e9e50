# virtio-net tests of the nested-KVM harness (sourced by tests.sh after snapshot.sh, whose
# helpers gx, ctl, stop_vm are used). The L2 guest (our kernel, the minimal image, the agent
# as PID 1) gets a virtio-net device on a TAP in L1; the agent configures eth0 at init from
# `sandcell.net=`; servers in L1 (busybox httpd, nc) listen on the TAP's address.
#
#   L1 sctap0 10.0.2.1/24  <-- TAP -->  sandcell-vmm virtio-net  <-->  L2 eth0 10.0.2.2/24

NET_TAP=sctap0
NET_HOST=10.0.2.1
NET_GUEST=10.0.2.2
NET_MAC=02:5c:00:00:02:02
NET_BLOB_BYTES=4194304
NET_CMDLINE="sandcell.net=ip=$NET_GUEST/24,gw=$NET_HOST,mtu=1500,dns=$NET_HOST"

# net_setup: the TAP (persistent, so a restored VMM attaches to the same one after the
# parent exits), its address, an HTTP server with a random blob. Idempotent.
net_setup() {
  [ -c /dev/net/tun ] || fail "/dev/net/tun is missing in L1 (tun.ko not loaded?)"
  ip link show $NET_TAP >/dev/null 2>&1 || tunctl -t $NET_TAP >/dev/null \
    || fail "tunctl -t $NET_TAP failed"
  ip addr flush dev $NET_TAP
  ip addr add $NET_HOST/24 dev $NET_TAP
  ip link set $NET_TAP up
  mkdir -p /tmp/www
  [ -s /tmp/www/blob ] || head -c $NET_BLOB_BYTES /dev/urandom > /tmp/www/blob
  md5sum < /tmp/www/blob | cut -d' ' -f1 > /tmp/www/blob.md5
  # In the foreground of this test's session: it dies with the test.
  httpd -f -p $NET_HOST:8080 -h /tmp/www &
}

# net_vm DIR: boots the agent guest with a net device on the TAP (128 MiB) in the
# background and waits for the agent.
net_vm() {
  vm_config "$1" "$L2_CMDLINE $NET_CMDLINE init=/sbin/sandcell-agent --listen vsock:$AGENT_PORT" 1 128 vsock
  sed -i "s|\"serial_log\"|\"net\": {\"tap\": \"$NET_TAP\", \"guest_mac\": \"$NET_MAC\"}, \"serial_log\"|" "$1/vm.json"
  grep -q '"net"' "$1/vm.json" || fail "could not add the net device to $1/vm.json"
  sandcell-vmm --config "$1/vm.json" >"$1/vmm.out" 2>&1 &
  echo $! > "$1/pid"
  $P wait-agent --uds "$1/vsock" --timeout 120 > "$1/ready" \
    || { cat "$1/vmm.out"; show_serial "$1"; fail "boot of $1: the agent never answered"; }
}

# net_download DIR: the guest fetches the blob from L1's httpd; fails unless it arrives
# whole. Prints the L1-side time in centiseconds (agent exec included).
net_download() {
  t0=$(now_cs)
  sum=$(gx "$1" "wget -q -O /tmp/blob http://$NET_HOST:8080/blob && md5sum < /tmp/blob") \
    || { show_serial "$1"; fail "wget http://$NET_HOST:8080/blob in the guest failed: $sum"; }
  t1=$(now_cs)
  [ "${sum%% *}" = "$(cat /tmp/www/blob.md5)" ] || fail "the guest's copy of the blob differs: ${sum%% *}"
  echo $((t1 - t0))
}

# net_upload DIR PORT: the guest sends its copy of the blob to an nc listener in L1; fails
# unless it arrives whole. Prints the L1-side time in centiseconds, from the guest command
# starting to the last byte in L1 (agent exec included).
net_upload() {
  rm -f /tmp/net-up.$2
  # nc's stdin stays open (sleep): a listener whose stdin ends stops reading.
  sleep 120 | nc -l -p "$2" > /tmp/net-up.$2 &
  sleep 0.3
  t0=$(now_cs)
  gx "$1" "nc $NET_HOST $2 < /tmp/blob" > /dev/null || fail "nc to $NET_HOST:$2 in the guest failed"
  n=0
  until [ "$(wc -c < /tmp/net-up.$2)" -ge $NET_BLOB_BYTES ]; do
    n=$((n + 1)); [ $n -lt 600 ] || fail "upload: $(wc -c < /tmp/net-up.$2) of $NET_BLOB_BYTES bytes arrived in L1"
    sleep 0.1
  done
  t1=$(now_cs)
  [ "$(md5sum < /tmp/net-up.$2 | cut -d' ' -f1)" = "$(cat /tmp/www/blob.md5)" ] \
    || fail "the blob the guest sent arrived different in L1"
  echo $((t1 - t0))
}

# KiB/s of the blob over CENTISECONDS.
kibps() { cs=$1; [ "$cs" -gt 0 ] || cs=1; echo $(( NET_BLOB_BYTES / 1024 * 100 / cs )); }

# The guest's interface as the agent configured it, ping at full MTU both ways, a 4 MiB
# HTTP download from L1 and a 4 MiB TCP upload to L1, checksums compared.
test_net_tcp() {
  need sandcell-vmm nested-probe; need_l2
  net_setup
  d=/tmp/net_tcp; mkdir -p $d
  net_vm $d
  info=$(gx $d "cat /sys/class/net/eth0/address /sys/class/net/eth0/mtu /etc/resolv.conf") \
    || fail "reading the guest's eth0: $info"
  echo "$info"
  echo "$info" | grep -qx "$NET_MAC" || fail "eth0's MAC is not $NET_MAC: $info"
  echo "$info" | grep -qx 1500 || fail "eth0's MTU is not 1500: $info"
  echo "$info" | grep -qx "nameserver $NET_HOST" || fail "/etc/resolv.conf is not ours: $info"
  # 1472 bytes of ICMP payload: a full 1500-byte IP packet.
  out=$(gx $d "ping -c 2 -s 1472 -W 20 $NET_HOST") || { echo "$out"; show_serial $d; fail "guest -> L1 ping failed"; }
  echo "$out" | grep -q "2 packets received" || fail "guest -> L1 ping: $out"
  ping -c 2 -s 1472 -W 20 $NET_GUEST > $d/ping.out || { cat $d/ping.out; fail "L1 -> guest ping failed"; }
  down=$(net_download $d)
  up=$(net_upload $d 5001)
  bench net_guest_to_l1_tcp_kibps "$(kibps "$up")" KiB/s
  bench net_l1_to_guest_http_kibps "$(kibps "$down")" KiB/s
  stop_vm $d
  pass "eth0 $NET_GUEST/24 mtu 1500 by the agent; pings at full MTU both ways; 4 MiB down (HTTP) $(kibps "$down") KiB/s, 4 MiB up (TCP) $(kibps "$up") KiB/s, checksums equal (nested TCG: not a speed)"
}

NET_SNAP=/tmp/net_snap

# net_make_snapshot: a net guest that has used the network (the blob downloaded), fully
# snapshotted into $NET_SNAP/vm.{state,mem} with its disk top frozen (the parent went on,
# on top.1, and was stopped): every restore takes a top of its own over the frozen layer,
# so net_snapshot and net_readdress restore the same snapshot. Sets NET_SNAP_MS.
net_make_snapshot() {
  rm -rf $NET_SNAP; d=$NET_SNAP/parent; mkdir -p $d
  net_vm $d
  gx $d "wget -q -O /tmp/blob http://$NET_HOST:8080/blob" || fail "the parent's download failed"
  NET_SNAP_MS=$(ctl $d "{\"op\":\"snapshot\",\"state_path\":\"$NET_SNAP/vm.state\",\"mem_path\":\"$NET_SNAP/vm.mem\",\"mode\":\"full\",\"disk_new_top\":\"$d/top.1\"}")
  stop_vm $d
}

# net_restore DIR: `sandcell-vmm --restore` of $NET_SNAP (the runtime's way) into DIR, on
# its own disk top; the VMM reattaches $NET_TAP by the name in the state. Waits for the agent.
net_restore() {
  sandcell-vmm --restore $NET_SNAP/vm.state --mem $NET_SNAP/vm.mem --vsock-uds $1/vsock \
    --disk-overlay $1/overlay --serial-log $1/serial.log --control-socket $1/control \
    > $1/vmm.out 2>&1 &
  echo $! > $1/pid
  $P wait-agent --uds $1/vsock --timeout 120 > $1/ready \
    || { cat $1/vmm.out; show_serial $1; fail "the restored agent of $1 never answered"; }
}

# A guest with a network, snapshotted and restored by `sandcell-vmm --restore` (the
# runtime's way) after the parent exited: the restored VMM reattaches the TAP by name and
# the guest's network works as before, without reconfiguration.
test_net_snapshot() {
  need sandcell-vmm nested-probe; need_l2
  net_setup
  net_make_snapshot
  r=$NET_SNAP/restored; mkdir -p $r
  net_restore $r
  out=$(gx $r "ping -c 1 -W 20 $NET_HOST") || { echo "$out"; cat $r/vmm.out; fail "restored guest -> L1 ping failed"; }
  up=$(net_upload $r 5002)
  down=$(net_download $r)
  stop_vm $r
  pass "snapshot ${NET_SNAP_MS} ms with a net device; restored VMM reattached $NET_TAP: ping, 4 MiB up and down, checksums equal"
}

# net_init DIR JSON: POST /init to DIR's agent; fails the test unless it answers 2xx.
net_init() {
  $P post --uds "$1/vsock" --path /init --body "$2" > "$1/init.out" 2>&1 \
    || fail "/init $2 on $1: $(cat "$1/init.out")"
}

# The same snapshot restored as another sandbox, whose network has other addresses: the
# TAP's address moves from 10.0.2.1/24 to 10.1.0.1/24, /init's sandcellNet readdresses the
# guest (as the microvm runtime does after a restore), and the network works at the new
# addresses only. The runtime's /init carries sandcellNet alone and cannot know the access
# token: it must succeed on an agent that holds one. The daemon's /init, with the same
# sandcellNet (a new identity, the host's time, entropy), succeeds twice.
test_net_readdress() {
  need sandcell-vmm nested-probe; need_l2
  if [ ! -f $NET_SNAP/vm.state ] || [ ! -f $NET_SNAP/vm.mem ]; then
    echo "no snapshot from net_snapshot: making one"
    net_setup
    net_make_snapshot
  fi
  old=$NET_GUEST
  NET_HOST=10.1.0.1; NET_GUEST=10.1.0.2
  net_setup
  d=$NET_SNAP/readdressed; rm -rf $d; mkdir -p $d
  net_restore $d
  before=$(gx $d "ip -4 addr show dev eth0; ip route") || fail "reading the restored guest's network: $before"
  echo "$before" | grep -q "inet $old/24" || fail "the restored guest does not have its old address $old: $before"
  # An access token, as a sandbox has (the snapshot's agent had none yet).
  net_init $d '{"accessToken":"tok-source"}'
  net="ip=$NET_GUEST/24,gw=$NET_HOST,dns=$NET_HOST"
  net_init $d "{\"sandcellNet\":\"$net\"}"
  hex=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
  init="{\"sandcellSandboxId\":\"sc-readdressed\",\"timestamp\":\"@NOW@\",\"sandcellEntropy\":\"$hex\",\"sandcellNet\":\"$net\"}"
  net_init $d "$init"
  net_init $d "$init"
  info=$(gx $d "ip -4 addr show dev eth0; ip route; cat /etc/resolv.conf") \
    || fail "reading the readdressed guest's network: $info"
  echo "$info"
  echo "$info" | grep -q "inet $NET_GUEST/24 " || fail "eth0 does not have $NET_GUEST/24: $info"
  echo "$info" | grep -q "inet $old/" && fail "eth0 still has the old address $old: $info"
  [ "$(echo "$info" | grep -c '^default ')" = 1 ] || fail "not exactly one default route: $info"
  echo "$info" | grep -q "^default via $NET_HOST dev eth0" || fail "the default route is not via $NET_HOST: $info"
  [ "$(echo "$info" | grep '^nameserver')" = "nameserver $NET_HOST" ] || fail "/etc/resolv.conf does not name $NET_HOST: $info"
  out=$(gx $d "ping -c 2 -W 20 $NET_HOST") || { echo "$out"; show_serial $d; fail "guest -> $NET_HOST ping failed"; }
  ping -c 2 -W 20 $NET_GUEST > $d/ping.out || { cat $d/ping.out; fail "L1 -> $NET_GUEST ping failed"; }
  # The HTTP download only: the upload (the slow direction under TCG, ~20 s) adds nothing
  # that net_snapshot does not already show.
  down=$(net_download $d)
  stop_vm $d
  pass "restored at new addresses: /init sandcellNet (alone, on a token-holding agent; then twice with the daemon's fields) -> eth0 $NET_GUEST/24 only, default via $NET_HOST, resolv.conf; pings both ways, 4 MiB HTTP download, checksum equal"
}

# A networked snapshot restored into a `--wait-restore` VMM, as the daemon's pooled VMMs are
# given a networked template: the VMM runs in a network namespace of its own with nothing in
# it (the pool's VMMs start before their sandbox's namespace exists), so it cannot attach the
# TAP by name; the TAP comes with the restore request as a descriptor (nested-probe control
# --tap, the runtime's open_tap + send_with_tap). A restore that asks for a passed TAP and
# has none is refused, and the VMM keeps waiting. The guest's network then works.
test_net_pool_restore() {
  need sandcell-vmm nested-probe; need_l2
  net_setup
  [ -f $NET_SNAP/vm.state ] && [ -f $NET_SNAP/vm.mem ] || net_make_snapshot
  r=$NET_SNAP/pooled; rm -rf $r; mkdir -p $r
  unshare -n sandcell-vmm --wait-restore --control-socket $r/control > $r/vmm.out 2>&1 &
  echo $! > $r/pid
  n=0
  until [ -S $r/control ]; do
    n=$((n + 1)); [ $n -lt 200 ] || { cat $r/vmm.out; fail "the --wait-restore VMM never made $r/control"; }
    sleep 0.05
  done
  vmm=$(cat $r/pid)
  grep -q "$NET_TAP" /proc/$vmm/net/dev && fail "the pooled VMM's namespace has $NET_TAP: the test would not show the descriptor path"
  req="{\"op\":\"restore\",\"state_path\":\"$NET_SNAP/vm.state\",\"mem_path\":\"$NET_SNAP/vm.mem\",\"overrides\":{\"vsock_uds_path\":\"$r/vsock\",\"disk_overlay\":\"$r/overlay\",\"serial_log\":\"$r/serial.log\",\"net_tap_fd\":true}}"
  set +e
  $P control --socket $r/control --request "$req" --timeout 60 > $r/no-tap.out 2>&1
  s=$?
  set -e
  [ $s != 0 ] && grep -q net_tap_fd $r/no-tap.out || { cat $r/no-tap.out; fail "a restore asking for a passed TAP without one was not refused by name"; }
  ctl $r '{"op":"status"}' > /dev/null
  grep -q '"waiting"' $r/ctl.out || fail "after the refused restore the VMM is not waiting: $(cat $r/ctl.out)"
  t0=$(now_cs)
  $P control --socket $r/control --tap $NET_TAP --request "$req" --timeout 120 > $r/restore.out 2> $r/restore.err \
    || { cat $r/restore.out $r/restore.err $r/vmm.out; fail "the restore with the TAP passed failed"; }
  $P wait-agent --uds $r/vsock --timeout 120 > $r/ready \
    || { cat $r/vmm.out; show_serial $r; fail "the agent restored in the pooled VMM never answered"; }
  bench net_pool_restore_to_agent_ms $(( ($(now_cs) - t0) * 10 )) ms
  ls -l /proc/$vmm/fd | grep -q /dev/net/tun || fail "the pooled VMM holds no /dev/net/tun descriptor"
  out=$(gx $r "ping -c 2 -W 20 $NET_HOST") || { echo "$out"; show_serial $r; fail "guest -> L1 ping failed after the pooled restore"; }
  ping -c 2 -W 20 $NET_GUEST > $r/ping.out || { cat $r/ping.out; fail "L1 -> guest ping failed after the pooled restore"; }
  down=$(net_download $r)
  stop_vm $r
  pass "pooled VMM in an empty namespace, TAP passed with the restore (a restore without it refused, VMM still waiting): pings both ways, 4 MiB HTTP download, checksum equal"
}
