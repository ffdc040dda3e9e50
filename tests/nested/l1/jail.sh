# The VMM's jail through the runtime (sourced by tests.sh): `SANDCELL_VMM_JAIL=1 sandcell
# serve --runtime microvm` starts every sandcell-vmm jailed (crates/runtime/src/microvm/
# jail/). Checked from outside, on the running VMMs: their own uid, no capabilities,
# no_new_privs, seccomp, a root without L1's files, their cgroup's limits; then the
# sandbox's life under the jail (pause to disk, resume, fork) and a jail that cannot be made.
#
# L1 runs from the initramfs's rootfs, where pivot_root (the jail's step 2) is refused: the
# daemon runs chrooted into a bind of L1's / in a mount namespace of its own, which pivot_root
# accepts. Everything else (/proc, /run, /var/lib/sandcell) is the same tree.

JAIL_ADDR=127.0.0.1:3002
# jail_serve's template snapshot flag: off unless a test empties it (test_jail_template).
JAIL_TEMPLATES=--no-template-snapshots

# jail_serve DIR: the jailed daemon on $JAIL_ADDR, its output in DIR/serve.out, pid in JAIL_PID.
jail_serve() {
  ip link set lo up 2>/dev/null || true
  # cgroup v2 for the VMMs' cgroups (L1's init mounts none).
  if ! grep -q ' /sys/fs/cgroup cgroup2 ' /proc/mounts; then
    mount -t cgroup2 none /sys/fs/cgroup || fail "cannot mount cgroup2 on /sys/fs/cgroup"
  fi
  mkdir -p /jailhost
  unshare -m sh -c 'mount --rbind / /jailhost && mount --make-rprivate /jailhost &&
    exec chroot /jailhost env SANDCELL_VMM_JAIL=1 "$@"' sh \
    sandcell --data-dir $DATA serve --runtime microvm --no-network ${JAIL_TEMPLATES---no-template-snapshots} \
    --listen $JAIL_ADDR --min-free-disk-mib 16 --memory-overcommit 4 > $1/serve.out 2>&1 &
  JAIL_PID=$!
  serve_ready $1/serve.out
}

# jail_post DIR NAME PATH BODY: POST to the jailed daemon; the answer in DIR/NAME.out.
jail_post() {
  nested-probe post --tcp $JAIL_ADDR --timeout 150 --path "$3" --header "X-API-Key: $key" \
    --body "$4" > $1/$2.out 2>&1 \
    || { cat $1/$2.out; tail -n 20 $1/serve.out; fail "POST $3: $(head -c 300 $1/$2.out)"; }
}

# jail_exec DIR ANSWER CMD: runs CMD in the sandbox of the create/resume answer file ANSWER.
jail_exec() {
  # Its own names: the tests' $id is the sandbox they follow, whatever this one runs in.
  jx_id=$(sed -n 's/.*"sandboxID":"\([^"]*\)".*/\1/p' "$2" | head -n 1)
  token=$(sed -n 's/.*"envdAccessToken":"\([^"]*\)".*/\1/p' "$2" | head -n 1)
  [ -n "$jx_id" ] || fail "no sandboxID in $(head -c 300 "$2")"
  tok=; [ -z "$token" ] || tok="X-Access-Token: $token"
  nested-probe exec --tcp $JAIL_ADDR --timeout 60 --header "E2b-Sandbox-Id: $jx_id" \
    --header "E2b-Sandbox-Port: 49983" ${tok:+--header "$tok"} "$3" > $1/exec.out 2> $1/exec.err \
    || { cat $1/exec.out $1/exec.err; tail -n 20 $1/serve.out; fail "a command in $jx_id failed"; }
}

# jail_check ID: the running VMM of sandbox ID is jailed; prints its uid.
jail_check() {
  pid=$(cat /run/sandcell/$1/vmm.pid 2>/dev/null) || fail "no vmm.pid for $1"
  st=/proc/$pid/status
  [ -f $st ] || fail "the VMM of $1 (pid $pid) is not running"
  uid=$(awk '/^Uid:/ { print $2 }' $st)
  [ "$uid" -ge 900000 ] 2>/dev/null || fail "the VMM of $1 runs as uid $uid, not one of the jail's (900000+)"
  awk '/^Uid:|^Gid:/ { for (i = 2; i <= 5; i++) if ($i != u) bad = 1 } END { exit bad }' u=$uid $st \
    || fail "the VMM of $1 has mixed ids: $(grep -E '^(Uid|Gid):' $st | tr '\t\n' '  ')"
  grep -q '^NoNewPrivs:[[:space:]]*1$' $st || fail "the VMM of $1: $(grep NoNewPrivs $st)"
  grep -q '^Seccomp:[[:space:]]*2$' $st || fail "the VMM of $1: $(grep '^Seccomp:' $st)"
  for c in CapInh CapPrm CapEff CapBnd CapAmb; do
    grep -q "^$c:[[:space:]]*0*\$" $st || fail "the VMM of $1: $(grep "^$c:" $st)"
  done
  # Its root holds its binds, /dev and /proc only: none of L1's own files.
  for host_path in nested/tests.sh bin/busybox etc init; do
    [ ! -e /proc/$pid/root/$host_path ] || fail "the VMM of $1 sees L1's /$host_path"
  done
  [ -e /proc/$pid/root/dev/kvm ] || fail "the VMM of $1 has no /dev/kvm"
  cg=$(cut -d: -f3 /proc/$pid/cgroup)
  [ "$cg" = /sandcell/$1 ] || fail "the VMM of $1 is in cgroup $cg, not /sandcell/$1"
  echo $uid
}

# jail_layout ID UID: sandbox ID (1 vCPU, 128 MiB) has its cgroup's three limits, and its run
# and state dirs stay root's (the daemon reads files there) with a vmm/ of UID's in each, the
# only place its VMM writes (its sockets, console log and disk top).
jail_layout() {
  cg=/sys/fs/cgroup/sandcell/$1
  [ "$(cat $cg/memory.max)" = $(( (128 + 128) << 20 )) ] || fail "memory.max $(cat $cg/memory.max)"
  [ "$(cat $cg/pids.max)" = 33 ] || fail "pids.max $(cat $cg/pids.max)"
  [ "$(cat $cg/cpu.max)" = "100000 100000" ] || fail "cpu.max $(cat $cg/cpu.max)"
  for dir in /run/sandcell/$1 $DATA/sandboxes/$1; do
    [ "$(stat -c %u:%a $dir)" = "0:700" ] || fail "$dir is $(stat -c %u:%a $dir), not root's 0700"
    [ "$(stat -c %u:%a $dir/vmm)" = "$2:700" ] || fail "$dir/vmm is $(stat -c %u:%a $dir/vmm), not $2's 0700"
  done
}

# A jailed create: the checks above, the cgroup's limits, a command in the guest, and a
# create that cannot get its jail (no cgroup v2) fails at once with the jail's error.
test_jail_daemon() {
  need sandcell sandcell-vmm nested-probe; need_l2
  d=/tmp/jail_daemon; mkdir -p $d
  jail_serve $d
  t0=$(now_cs)
  jail_post $d create /sandboxes '{"templateID":"minimal","timeout":120,"cpuCount":1,"memoryMB":128}'
  bench jail_create_cold_ms $(( ($(now_cs) - t0) * 10 )) ms
  jail_exec $d $d/create.out 'echo JAILED_$((6 * 7))'
  grep -q JAILED_42 $d/exec.out || fail "the command's output: $(cat $d/exec.out)"
  id=$(sed -n 's/.*"sandboxID":"\([^"]*\)".*/\1/p' $d/create.out)
  uid=$(jail_check $id) || exit 1
  jail_layout $id $uid
  run=/run/sandcell/$id; state=$DATA/sandboxes/$id
  for f in owner.json vmm.pid vm.json vmm.log; do
    [ "$(stat -c %u $run/$f)" = 0 ] || fail "$run/$f is not root's: $(stat -c %u $run/$f)"
  done
  [ -S $run/vmm/control.sock ] && [ -S $run/vmm/vsock.sock ] || fail "no sockets in $run/vmm: $(ls -la $run/vmm)"
  [ -f $state/vmm/disk.overlay ] || fail "no disk top in $state/vmm: $(ls -la $state/vmm)"
  # Without cgroup v2 the jail cannot be made (unmounted in the daemon's namespace only):
  # the create fails at once, with the jail's error.
  nsenter -t $JAIL_PID -m -r umount -l /sys/fs/cgroup || fail "unmounting the daemon's cgroup2"
  t0=$(now_cs)
  if nested-probe post --tcp $JAIL_ADDR --timeout 150 --path /sandboxes --header "X-API-Key: $key" \
      --body '{"templateID":"minimal","timeout":120,"cpuCount":1,"memoryMB":128}' > $d/refused.out 2>&1; then
    fail "a create without cgroup v2 succeeded: $(head -c 300 $d/refused.out)"
  fi
  took=$(( ($(now_cs) - t0) * 10 ))
  grep -q "jail cannot be set up" $d/refused.out && grep -q "cgroup v2" $d/refused.out \
    || fail "the refused create said: $(head -c 400 $d/refused.out)"
  [ $took -lt 30000 ] || fail "the refused create took $took ms"
  jail_stop
  pass "VMM of $id: uid $uid, NoNewPrivs 1, Seccomp 2, no capabilities, no L1 files in its root, cgroup memory.max 256 MiB pids.max 33 cpu.max 1 CPU, run and state dirs root's 0700 with a vmm/ of its own 0700; without cgroup v2 the create fails in $took ms: $(grep -o 'jail cannot[^"]*' $d/refused.out | head -c 120)"
}

jail_stop() {
  kill -TERM $JAIL_PID; wait $JAIL_PID 2>/dev/null || true
  for f in /run/sandcell/*/vmm.pid; do
    if [ -f "$f" ]; then kill -9 "$(cat "$f")" 2>/dev/null || true; fi
  done
}

# A jailed sandbox's life: pause to disk (the jailed VMM writes the snapshot in its state dir,
# the runtime moves it out), resume (a jailed restore that reads it through read-only binds),
# fork (the child, under a uid of its own, reopens the parent's frozen memfd from a passed
# descriptor). Memory written before each step is there after it.
test_jail_snapshots() {
  need sandcell sandcell-vmm nested-probe; need_l2
  d=/tmp/jail_snapshots; mkdir -p $d
  jail_serve $d
  jail_post $d create /sandboxes '{"templateID":"minimal","timeout":120,"cpuCount":1,"memoryMB":128}'
  id=$(sed -n 's/.*"sandboxID":"\([^"]*\)".*/\1/p' $d/create.out)
  jail_exec $d $d/create.out 'echo MEM_MARK > /tmp/mark && echo DISK_MARK > $HOME/mark && sync'
  first=$(jail_check $id) || exit 1
  t0=$(now_cs)
  jail_post $d pause /sandboxes/$id/pause '{}'
  bench jail_pause_ms $(( ($(now_cs) - t0) * 10 )) ms
  t0=$(now_cs)
  jail_post $d resume /sandboxes/$id/resume '{"timeout":120}'
  bench jail_resume_ms $(( ($(now_cs) - t0) * 10 )) ms
  jail_exec $d $d/resume.out 'cat /tmp/mark $HOME/mark'
  [ "$(cat $d/exec.out | tr '\n' ' ')" = "MEM_MARK DISK_MARK " ] || fail "after resume: $(cat $d/exec.out)"
  resumed=$(jail_check $id) || exit 1
  t0=$(now_cs)
  jail_post $d fork /sandboxes/$id/fork '{"count":1,"timeout":120}'
  bench jail_fork_ms $(( ($(now_cs) - t0) * 10 )) ms
  child=$(sed -n 's/.*"sandboxID":"\([^"]*\)".*/\1/p' $d/fork.out | head -n 1)
  [ -n "$child" ] || fail "no child in $(head -c 400 $d/fork.out)"
  jail_exec $d $d/fork.out 'cat /tmp/mark $HOME/mark; echo CHILD > /tmp/mark'
  [ "$(cat $d/exec.out | tr '\n' ' ')" = "MEM_MARK DISK_MARK " ] || fail "in the fork child: $(cat $d/exec.out)"
  child_uid=$(jail_check $child) || exit 1
  parent_uid=$(jail_check $id) || exit 1
  [ "$child_uid" != "$parent_uid" ] || fail "the fork child and its parent share uid $child_uid"
  # The parent's top, frozen by the fork, left the VMM's directory: root's, read-only to it.
  frozen=$DATA/sandboxes/$id/disk.overlay
  [ "$(stat -c %u:%a $frozen 2>&1)" = "0:644" ] || fail "the frozen layer: $(stat -c %u:%a $frozen 2>&1)"
  [ ! -e $DATA/sandboxes/$id/vmm/disk.overlay ] || fail "the frozen layer is still in the VMM's dir"
  jail_exec $d $d/resume.out 'cat /tmp/mark'
  [ "$(cat $d/exec.out)" = MEM_MARK ] || fail "the parent sees its child's write: $(cat $d/exec.out)"
  jail_stop
  pass "jailed pause+resume (uid $first then $resumed) and fork (child uid $child_uid, parent $parent_uid): memory and disk kept, each VMM jailed, the frozen layer root's outside the VMM's dir"
}

# Template snapshots under the jail: the template VM boots jailed, the warm pool's idle
# `--wait-restore` VMMs are jailed from their start (own uid, a cgroup of the pool's), and a
# create restores into one: its cgroup becomes the sandbox's, sized for it, its directories
# the sandbox's vmm/ dirs, the snapshot's files reach it as root's read-only links. Then the
# sandbox's life goes on: pause to disk and resume (paths named as its jail shows them).
test_jail_template() {
  need sandcell sandcell-vmm nested-probe; need_l2
  d=/tmp/jail_template; mkdir -p $d
  rm -rf $DATA/template-snapshots
  trap tpl_cleanup EXIT
  JAIL_TEMPLATES= jail_serve $d
  body='{"templateID":"minimal","timeout":120,"cpuCount":1,"memoryMB":128}'
  jail_post $d first /sandboxes "$body"
  t0=$(now_cs)
  jail_post $d create /sandboxes "$body"
  bench jail_create_template_ms $(( ($(now_cs) - t0) * 10 )) ms
  id=$(sed -n 's/.*"sandboxID":"\([^"]*\)".*/\1/p' $d/create.out)
  grep -q "microvm sandbox $id: restored from template snapshot" $d/serve.out \
    || { tail -n 30 $d/serve.out; fail "sandbox $id was not restored from the template snapshot"; }
  grep -q "booting cold" $d/serve.out && { tail -n 30 $d/serve.out; fail "a create fell back to a cold boot"; }
  pid=$(cat /run/sandcell/$id/vmm.pid)
  tr '\0' ' ' < /proc/$pid/cmdline | grep -q -- "--wait-restore" || fail "the VMM of $id is not a pooled one"
  uid=$(jail_check $id) || exit 1
  jail_layout $id $uid
  state=$DATA/sandboxes/$id
  [ "$(stat -c %u:%a $state/vmm/in.memory)" = "0:644" ] || fail "the linked memory $(stat -c %u:%a $state/vmm/in.memory)"
  # The idle VMMs waiting in the pool are jailed too.
  idle=0
  for f in /run/sandcell/.vmm-pool/*/vmm.pid; do
    [ -f "$f" ] || continue
    p=$(cat $f); idle=$((idle + 1))
    u=$(awk '/^Uid:/ { print $2 }' /proc/$p/status)
    [ "$u" -ge 900000 ] 2>/dev/null || fail "idle pooled VMM $p runs as uid $u"
    # (Its seccomp filters come with its VM, as for every VMM: checked on the restored one.)
    grep -q '^NoNewPrivs:[[:space:]]*1$' /proc/$p/status || fail "idle pooled VMM $p: $(grep NoNewPrivs /proc/$p/status)"
    grep -q '^CapEff:[[:space:]]*0*$' /proc/$p/status || fail "idle pooled VMM $p: $(grep CapEff /proc/$p/status)"
    case "$(cut -d: -f3 /proc/$p/cgroup)" in /sandcell/pool-*) ;; *) fail "idle pooled VMM $p in cgroup $(cut -d: -f3 /proc/$p/cgroup)";; esac
  done
  [ $idle -gt 0 ] || fail "no idle VMMs in the warm pool"
  jail_exec $d $d/create.out 'echo MEM_MARK > /tmp/mark && echo DISK_MARK > $HOME/mark && sync && echo TPL_$((6 * 7))'
  grep -q TPL_42 $d/exec.out || fail "the command's output: $(cat $d/exec.out)"
  jail_post $d pause /sandboxes/$id/pause '{}'
  jail_post $d resume /sandboxes/$id/resume '{"timeout":120}'
  jail_exec $d $d/resume.out 'cat /tmp/mark $HOME/mark'
  [ "$(cat $d/exec.out | tr '\n' ' ')" = "MEM_MARK DISK_MARK " ] || fail "after resume: $(cat $d/exec.out)"
  resumed=$(jail_check $id) || exit 1
  jail_stop
  sleep 0.5
  left=$(ls -d /sys/fs/cgroup/sandcell/pool-* 2>/dev/null | wc -l)
  [ "$left" = 0 ] || fail "$left pooled VMM cgroups outlived the daemon"
  pass "template restore into a jailed pooled VMM (uid $uid, cgroup sandcell/$id of 256 MiB, $idle idle jailed VMMs with their own uids, no capabilities, in pool-* cgroups), pause+resume after it (uid $resumed): memory and disk kept; no pool cgroup left at stop"
}
