# Templates are snapshots (sourced by tests.sh): `sandcell serve --runtime microvm
# --no-network` restores creates from a template snapshot into pooled `--wait-restore` VMMs.

# POST /sandboxes on the daemon at :3000 with body $2 into $1/create.out; prints the time in ms.
# What explains a failure goes to stderr: stdout is the caller's $(...).
tpl_create() {
  t0=$(now_cs)
  nested-probe post --tcp 127.0.0.1:3000 --timeout 150 --path /sandboxes --header "X-API-Key: $key" \
    --body "$2" > $1/create.out 2>&1 \
    || { { cat $1/create.out; tail -n 40 $D/serve.out; } >&2; fail "POST /sandboxes: $(head -c 300 $1/create.out)"; }
  echo $(( ($(now_cs) - t0) * 10 ))
}

# Runs command $2 in the sandbox whose create answer is in $1/create.out; output in $1/exec.out.
tpl_exec() {
  id=$(sed -n 's/.*"sandboxID":"\([^"]*\)".*/\1/p' $1/create.out)
  token=$(sed -n 's/.*"envdAccessToken":"\([^"]*\)".*/\1/p' $1/create.out)
  [ -n "$id" ] || fail "no sandboxID in $(head -c 300 $1/create.out)"
  echo "$id" > $1/id
  tok=; [ -z "$token" ] || tok="X-Access-Token: $token"
  nested-probe exec --tcp 127.0.0.1:3000 --timeout 60 --header "E2b-Sandbox-Id: $id" \
    --header "E2b-Sandbox-Port: 49983" ${tok:+--header "$tok"} "$2" > $1/exec.out 2> $1/exec.err \
    || { cat $1/exec.out $1/exec.err; tail -n 20 $D/serve.out; fail "a command in $id failed"; }
}

# The restored VMMs outlive the daemon by design, and the snapshot sits in L1's RAM: both go.
tpl_cleanup() {
  # `if`, not `[ ] &&`: under set -e a missing pid file (the glob unmatched) or a VMM gone
  # already would make the trap, and with it the test, fail.
  local f
  for f in /run/sandcell/*/vmm.pid; do
    if [ -f "$f" ]; then kill -9 "$(cat "$f")" 2>/dev/null || true; fi
  done
  rm -rf $DATA/template-snapshots
}

# Two sandboxes of one template: both restored into pooled VMMs (the daemon says so, and
# their VMMs never had a config to boot), both answer, and they differ in identity and RNG.
test_daemon_template() {
  need sandcell sandcell-vmm nested-probe; need_l2
  D=/tmp/daemon_template; mkdir -p $D/a $D/b
  ip link set lo up 2>/dev/null || true
  rm -rf $DATA/template-snapshots
  trap tpl_cleanup EXIT
  sandcell --data-dir $DATA serve --runtime microvm --no-network --listen 127.0.0.1:3000 --min-free-disk-mib 16 --memory-overcommit 4 \
    > $D/serve.out 2>&1 &
  serve=$!
  serve_ready $D/serve.out
  body='{"templateID":"minimal","timeout":120,"cpuCount":1,"memoryMB":128,"envVars":{"TPL_VAR":"tpl-42"}}'
  first=$(tpl_create $D/a "$body")
  second=$(tpl_create $D/b "$body")
  cmd='echo TPL_$((6 * 7)); cat /proc/sys/kernel/random/boot_id; head -c 16 /dev/urandom | od -An -tx1 | tr -d " \n"; echo; echo "id=$E2B_SANDBOX_ID var=$TPL_VAR"; hostname'
  tpl_exec $D/a "$cmd"
  tpl_exec $D/b "$cmd"
  ida=$(cat $D/a/id); idb=$(cat $D/b/id)
  for s in a b; do
    grep -q TPL_42 $D/$s/exec.out || { cat $D/$s/exec.out; fail "sandbox $s did not run the command"; }
    grep -q "var=tpl-42" $D/$s/exec.out || { cat $D/$s/exec.out; fail "sandbox $s lacks the create's envVars (they come only from /init)"; }
  done
  for id in $ida $idb; do
    grep -q "microvm sandbox $id: restored from template snapshot" $D/serve.out \
      || { tail -n 30 $D/serve.out; fail "sandbox $id was not restored from the template snapshot"; }
  done
  grep -q "booting cold" $D/serve.out && { tail -n 30 $D/serve.out; fail "a create fell back to a cold boot"; }
  grep -q "snapshot built now" $D/serve.out || fail "the first create did not build the template snapshot"
  [ "$(grep -c 'snapshot built now' $D/serve.out)" = 1 ] || fail "the template snapshot was built more than once"
  grep -q "id=$ida " $D/a/exec.out || { cat $D/a/exec.out; fail "E2B_SANDBOX_ID of $ida is not its own id"; }
  grep -q "id=$idb " $D/b/exec.out || { cat $D/b/exec.out; fail "E2B_SANDBOX_ID of $idb is not its own id"; }
  # A new identity in the template's memory image takes its id as hostname (the agent, at /init).
  [ "$(sed -n 5p $D/a/exec.out)" = "$ida" ] || { cat $D/a/exec.out; fail "the hostname of $ida is not its id"; }
  [ "$(sed -n 5p $D/b/exec.out)" = "$idb" ] || { cat $D/b/exec.out; fail "the hostname of $idb is not its id"; }
  boot_a=$(sed -n 2p $D/a/exec.out); boot_b=$(sed -n 2p $D/b/exec.out)
  rand_a=$(sed -n 3p $D/a/exec.out); rand_b=$(sed -n 3p $D/b/exec.out)
  [ -n "$rand_a" ] && [ "$rand_a" != "$rand_b" ] || fail "the two sandboxes read the same /dev/urandom bytes ($rand_a)"
  # The kernel makes boot_id on its first read, after the restore: each has its own.
  [ -n "$boot_a" ] && [ "$boot_a" != "$boot_b" ] || fail "the two sandboxes share boot_id $boot_a"
  # Neither booted: each runs in a VMM started as `--wait-restore` (never given a config).
  for id in $ida $idb; do
    pid=$(cat /run/sandcell/$id/vmm.pid) || fail "no vmm.pid for $id"
    tr '\0' ' ' < /proc/$pid/cmdline | grep -q -- "--wait-restore" \
      || fail "the VMM of $id ($(tr '\0' ' ' < /proc/$pid/cmdline)) is not a pooled --wait-restore one"
    tr '\0' ' ' < /proc/$pid/cmdline | grep -q -- "--config" && fail "the VMM of $id was given a config (a boot)"
  done
  ms_a=$(sed -n "s/.*sandbox $ida: restored.*agent answering after \([0-9]*\) ms.*/\1/p" $D/serve.out)
  ms_b=$(sed -n "s/.*sandbox $idb: restored.*agent answering after \([0-9]*\) ms.*/\1/p" $D/serve.out)
  bench daemon_create_template_first_ms "$first" ms
  bench daemon_create_template_ms "$second" ms
  bench runtime_template_restore_to_agent_ms "${ms_b:-0}" ms
  # Stopping the daemon kills its idle pooled VMMs (the restored ones outlive it by design).
  idle=
  for f in /run/sandcell/.vmm-pool/*/vmm.pid; do if [ -f "$f" ]; then idle="$idle $(cat "$f")"; fi; done
  [ -n "$idle" ] || fail "no idle VMMs in the warm pool"
  kill -TERM $serve; wait $serve 2>/dev/null || true
  sleep 0.5
  for p in $idle; do
    if [ -e /proc/$p ] && ! grep -q ') Z ' /proc/$p/stat 2>/dev/null; then
      fail "idle pooled VMM $p outlived the daemon"
    fi
  done
  pass "two creates restored from one template snapshot (first ${first} ms with the build, second ${second} ms; runtime restore to agent ${ms_b} ms); own ids, env, random bytes, boot_ids; pooled VMMs, no boot; idle VMMs ($idle ) gone with the daemon"
}

# net_modules: the kernel modules of the daemon's networks (l1-kernel.sh), dependencies first.
net_modules() {
  for m in $(cat /lib/modules/net/order); do
    grep -q "^$m " /proc/modules || insmod /lib/modules/net/$m.ko || fail "insmod $m failed"
  done
}

# Networked creates restored too, through a daemon with its networks (namespaces, veth,
# nftables, the TAP and its tc redirects, all in L1): the first create builds a networked template snapshot (its template VM in a network of its own), the
# second restores it into a pooled VMM given its TAP, and the agent readdresses each guest to
# its own network, where a TCP connection to the daemon's DNS server on its gateway succeeds
# (through the TAP, tc and the veth; the commands run as the sandbox's user, who may not ping).
test_daemon_net_template() {
  need sandcell sandcell-vmm nested-probe ip tc nft; need_l2
  net_modules
  D=/tmp/daemon_net_template; mkdir -p $D/a $D/b
  ip link set lo up 2>/dev/null || true
  rm -rf $DATA/template-snapshots
  trap tpl_cleanup EXIT
  sandcell --data-dir $DATA serve --runtime microvm \
    --listen 127.0.0.1:3000 --min-free-disk-mib 16 --memory-overcommit 4 > $D/serve.out 2>&1 &
  serve=$!
  serve_ready $D/serve.out 600
  body='{"templateID":"minimal","timeout":120,"cpuCount":1,"memoryMB":128}'
  first=$(tpl_create $D/a "$body")
  second=$(tpl_create $D/b "$body")
  for s in a b; do
    tpl_exec $D/$s 'ip -4 -o addr show dev eth0; ip route; gw=$(ip route | sed -n "s/^default via \([0-9.]*\).*/\1/p"); nc -w 20 $gw 53 </dev/null && echo TCP_OK $gw'
  done
  ida=$(cat $D/a/id); idb=$(cat $D/b/id)
  for id in $ida $idb; do
    grep -q "microvm sandbox $id: restored from template snapshot" $D/serve.out \
      || { tail -n 30 $D/serve.out; fail "networked sandbox $id was not restored from the template snapshot"; }
  done
  grep -q "booting cold" $D/serve.out && { tail -n 30 $D/serve.out; fail "a networked create fell back to a cold boot"; }
  [ "$(grep -c 'snapshot built now' $D/serve.out)" = 1 ] || fail "the networked template snapshot was not built exactly once"
  for s in a b; do
    grep -q TCP_OK $D/$s/exec.out || { cat $D/$s/exec.out; tail -n 20 $D/serve.out; fail "sandbox $s: no TCP connection to its gateway's DNS server"; }
    [ "$(grep -c ' inet ' $D/$s/exec.out)" = 1 ] || { cat $D/$s/exec.out; fail "sandbox $s: eth0 has not exactly one IPv4 address"; }
  done
  addr_a=$(sed -n 's/.* inet \([0-9.]*\).*/\1/p' $D/a/exec.out)
  addr_b=$(sed -n 's/.* inet \([0-9.]*\).*/\1/p' $D/b/exec.out)
  [ -n "$addr_a" ] && [ "$addr_a" != "$addr_b" ] || fail "the two sandboxes have the same address $addr_a"
  for id in $ida $idb; do
    pid=$(cat /run/sandcell/$id/vmm.pid) || fail "no vmm.pid for $id"
    tr '\0' ' ' < /proc/$pid/cmdline | grep -q -- "--wait-restore" \
      || fail "the VMM of $id is not a pooled --wait-restore one"
    ls -l /proc/$pid/fd | grep -q /dev/net/tun || fail "the VMM of $id holds no TAP"
  done
  # The floor beside it: the same create booted (SANDCELL_MICROVM_NET_TEMPLATES=0), by a
  # daemon of its own logging to $D/cold/serve.out.
  kill -TERM $serve; wait $serve 2>/dev/null || true
  D=$D/cold; mkdir -p $D/c
  SANDCELL_MICROVM_NET_TEMPLATES=0 sandcell --data-dir $DATA serve --runtime microvm \
    --listen 127.0.0.1:3000 --min-free-disk-mib 16 --memory-overcommit 4 > $D/serve.out 2>&1 &
  serve_ready $D/serve.out 600
  cold=$(tpl_create $D/c "$body")
  tpl_exec $D/c 'gw=$(ip route | sed -n "s/^default via \([0-9.]*\).*/\1/p"); nc -w 20 $gw 53 </dev/null && echo TCP_OK $gw'
  grep -q TCP_OK $D/c/exec.out || { cat $D/c/exec.out; fail "the booted networked sandbox: no TCP connection to its gateway"; }
  grep -q "restored from template snapshot" $D/serve.out && fail "with SANDCELL_MICROVM_NET_TEMPLATES=0 a networked create was restored"
  bench daemon_net_create_template_first_ms "$first" ms
  bench daemon_net_create_template_ms "$second" ms
  bench daemon_net_create_cold_ms "$cold" ms
  pass "networked creates: the first built the networked template snapshot (${first} ms), the second restored it (${second} ms; booted: ${cold} ms); both in pooled VMMs given their TAP, readdressed to $addr_a and $addr_b, TCP to each gateway's DNS server"
}
