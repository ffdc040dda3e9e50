#!/usr/bin/env bash
# Checks the installed `base` image: its files (setuid sudo, ownership, free room in the ext4)
# and, inside a real gvisor sandbox, the tools and the `user` account E2B code relies on.
#
#   tests/images/base.sh
#
# Needs root (the gvisor runtime), runsc, target/debug/sandcell (or $SANDCELL_BIN), and the
# image installed in the data dir ($SANDCELL_DATA_DIR, default /var/lib/sandcell):
#   scripts/build-image.sh base && scripts/install-artifacts.sh --image base
# Anything missing is a failure, not a skip. Prints one line per check and
# "N passed, N failed" last; exits non-zero when a check fails.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
sandcell=${SANDCELL_BIN:-$root/target/debug/sandcell}
data=${SANDCELL_DATA_DIR:-/var/lib/sandcell}
image=$data/images/base
passed=0
failed=0

ok() { echo "ok - $1"; passed=$((passed + 1)); }
not_ok() { echo "not ok - $1"; shift; for l in "$@"; do echo "    $l"; done; failed=$((failed + 1)); }
finish() { echo "$passed passed, $failed failed"; [ "$failed" = 0 ]; exit; }
# check NAME EXPECTED ACTUAL: exact comparison.
check() {
  if [ "$2" = "$3" ]; then ok "$1"; else not_ok "$1" "expected: $2" "got:      $3"; fi
}
# check_re NAME REGEX ACTUAL: extended regex, whole value.
check_re() {
  if [[ "$3" =~ ^$2$ ]]; then ok "$1"; else not_ok "$1" "expected (regex): $2" "got: $3"; fi
}

# --- prerequisites: each missing one fails the run ---
[ "$(id -u)" = 0 ] || { not_ok "running as root" "the gvisor runtime needs root"; finish; }
[ -x "$sandcell" ] || { not_ok "sandcell CLI at $sandcell" "build it: cargo build -p sandcell-cli"; finish; }
command -v runsc >/dev/null || { not_ok "runsc installed" "apt-get install runsc"; finish; }
[ -f "$image/rootfs.ext4" ] && [ -d "$image/rootfs" ] \
  || { not_ok "base installed in $image" "scripts/build-image.sh base && scripts/install-artifacts.sh --image base"; finish; }

# --- the files, without running anything ---
tree=$image/rootfs
check "tree: sudo is root-owned and setuid" "4755 0 0" "$(stat -c '%a %u %g' "$tree/usr/bin/sudo")"
check "tree: /home/user belongs to 1000:1000" "1000 1000" "$(stat -c '%u %g' "$tree/home/user")"
check "tree: /etc/shadow is root:shadow 0640" "640 0 42" "$(stat -c '%a %u %g' "$tree/etc/shadow")"
check "tree: sudoers rule for user is 0440" "440" "$(stat -c '%a' "$tree/etc/sudoers.d/user")"
check "tree: agent at /sbin/sandcell-agent" "yes" "$([ -x "$tree/sbin/sandcell-agent" ] && echo yes || echo no)"
check "tree: /usr/local/bin/sudo is the agent (the sudo service's client)" "/sbin/sandcell-agent" "$(readlink "$tree/usr/local/bin/sudo")"
check "tree: node and npm under /usr/local" "yes" "$([ -x "$tree/usr/local/bin/node" ] && [ -e "$tree/usr/local/lib/node_modules/npm/bin/npm-cli.js" ] && echo yes || echo no)"
check "tree: apt lists cleaned" "" "$(ls -A "$tree/var/lib/apt/lists" | grep -v '^lock$\|^partial$' || true)"

stat_in_ext4() { debugfs -R "stat $1" "$image/rootfs.ext4" 2>/dev/null | sed -n 's/.*Mode: *\([0-7]*\).*/\1/p; s/^User: *\([0-9]*\) *Group: *\([0-9]*\).*/\1 \2/p' | paste -sd' ' -; }
check "ext4: sudo is root-owned and setuid" "04755 0 0" "$(stat_in_ext4 /usr/bin/sudo)"
check "ext4: /home/user belongs to 1000:1000" "0755 1000 1000" "$(stat_in_ext4 /home/user)"
check "ext4: /etc/shadow is root:shadow 0640" "0640 0 42" "$(stat_in_ext4 /etc/shadow)"
free_mib=$(dumpe2fs -h "$image/rootfs.ext4" 2>/dev/null \
  | awk -F: '/^Free blocks/ { f = $2 } /^Block size/ { b = $2 } END { print int(f * b / 1048576) }')
check "ext4: at least 512 MiB free (has ${free_mib:-?} MiB)" yes "$([ "${free_mib:-0}" -ge 512 ] && echo yes || echo no)"

# --- inside a gvisor sandbox ---
# run NAME CMD...: runs CMD in a fresh sandbox; sets $out, $err, $rc.
run() {
  local errf; errf=$(mktemp)
  out=$("$sandcell" --data-dir "$data" run --runtime gvisor --image base -- "$@" 2>"$errf")
  rc=$?
  err=$(cat "$errf"); rm -f "$errf"
}

# The brief's command line, as a user of the image would type it.
run bash -lc 'python3 -c "print(1+1)"; git --version; curl --version; id user; sudo -u user id -u'
check "sandbox: the tool check exits 0" 0 "$rc"
mapfile -t lines <<<"$out"
check "python3 computes" "2" "${lines[0]:-}"
check_re "git runs" 'git version 2\.[0-9.]+' "${lines[1]:-}"
check_re "curl runs (with TLS)" 'curl 7\.[0-9.]+ \(x86_64-pc-linux-gnu\) libcurl/.* OpenSSL/.*' "${lines[2]:-}"
check "id user" "uid=1000(user) gid=1000(user) groups=1000(user),27(sudo)" "$(grep '^uid=' <<<"$out")"
check "sudo -u user id -u" "1000" "${lines[${#lines[@]}-1]:-}"
check "no warnings on stderr (sudo resolves the sandbox's hostname)" "" "$err"

# The environment a login shell and the user get.
env_script=$(cat <<'EOF'
echo "$LANG"
sudo -u user -i bash -c 'echo $HOME $SHELL; pwd'
pip3 --version | cut -d' ' -f1
python3 -c 'import ssl, sqlite3, json; print("stdlib ok")'
getent hosts "$(hostname)" | wc -l
ps -o comm= -p 1
EOF
)
run bash -lc "$env_script"
check "sandbox: the environment check exits 0" 0 "$rc"
mapfile -t lines <<<"$out"
check "LANG is C.UTF-8" "C.UTF-8" "${lines[0]:-}"
check "user's home and shell (sudo -i)" "/home/user /bin/bash" "${lines[1]:-}"
check "user's login directory" "/home/user" "${lines[2]:-}"
check "pip is there" "pip" "${lines[3]:-}"
check "python3 stdlib modules import" "stdlib ok" "${lines[4]:-}"
check "the hostname resolves" "1" "${lines[5]:-}"
check "PID 1 is the agent" "sandcell-agent" "${lines[6]:-}"

# Login shells (every command the SDKs run is `bash -l -c`) start no process of their own:
# each is a fork and an exec, 20-45 ms under gVisor (scripts/build-image.sh edits Debian's
# login scripts for it), and PATH comes out as Debian sets it.
login_script=$(cat <<'EOF'
bash -l -x -c true 2>&1 | grep -cE '^\++ (id|mesg|tty)( |$)'
bash -l -c 'echo $PATH'
sudo -u user bash -l -x -c true 2>&1 | grep -cE '^\++ (id|mesg|tty)( |$)'
sudo -u user bash -l -c 'echo $PATH'
EOF
)
run bash -c "$login_script"
mapfile -t lines <<<"$out"
check "root's login shell runs no id, mesg or tty" "0" "${lines[0]:-}"
check "root's login PATH" "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "${lines[1]:-}"
check "user's login shell runs no id, mesg or tty" "0" "${lines[2]:-}"
check_re "user's login PATH" '(/home/user/[^:]*:)*/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games' "${lines[3]:-}"

# What E2B's template has and agents reach for: `python` is Python 3, a C and a C++
# compiler and make, usable by `user` in its home.
build_script=$(cat <<'EOF'
python -c 'import sys; print(sys.version_info[0])'
make --version | head -n 1
cd /home/user && printf '#include <stdio.h>\nint main(void){puts("cc ok");return 0;}\n' > t.c && gcc -O2 -o t t.c && ./t
printf '#include <iostream>\nint main(){std::cout<<"c++ ok"<<std::endl;}\n' > t.cc && g++ -o tcc t.cc && ./tcc
printf 'all:\n\t@echo make ok\n' > Makefile && make -s
EOF
)
run sudo -u user bash -c "$build_script"
check "sandbox: the build-tools check exits 0" 0 "$rc"
mapfile -t lines <<<"$out"
check "python is Python 3" "3" "${lines[0]:-}"
check_re "make runs" 'GNU Make 4\.[0-9.]+' "${lines[1]:-}"
check "gcc compiles and links C as user" "cc ok" "${lines[2]:-}"
check "g++ compiles and links C++ as user" "c++ ok" "${lines[3]:-}"
check "make runs a Makefile" "make ok" "${lines[4]:-}"

# sudo from `user`: gVisor ignores setuid bits, so the agent runs the command (sudo service).
sudo_script=$(cat <<'EOF'
sudo id -u
sudo -n -u user id -un
sudo sh -c 'echo "$USER $SUDO_USER $PATH"'
FOO=kept sudo -E sh -c 'echo "$FOO"'
sudo -i sh -c 'pwd'
sudo sh -c 'exit 7'; echo "rc=$?"
sudo no-such-command 2>&1; echo "rc=$?"
EOF
)
run sudo -u user bash -c "$sudo_script"
mapfile -t lines <<<"$out"
check "sudo as user: root" "0" "${lines[0]:-}"
check "sudo -n -u user" "user" "${lines[1]:-}"
check "sudo's environment (target, caller, secure_path)" "root user /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "${lines[2]:-}"
check "sudo -E keeps the caller's variables" "kept" "${lines[3]:-}"
check "sudo -i starts in root's home" "/root" "${lines[4]:-}"
check "sudo passes the exit status on" "rc=7" "${lines[5]:-}"
check "sudo: an unknown command" "sudo: no-such-command: command not found" "${lines[6]:-}"
check "sudo: its exit status" "rc=1" "${lines[7]:-}"

# Node.js (the current LTS) and npm, for `user`.
run sudo -u user bash -lc 'node -p "process.version.split(\".\")[0]"; npm --version; npx --version'
check "sandbox: node and npm run" 0 "$rc"
mapfile -t lines <<<"$out"
check "node is v26 (LTS)" "v26" "${lines[0]:-}"
check_re "npm runs" '12\.[0-9.]+' "${lines[1]:-}"
check_re "npx runs" '12\.[0-9.]+' "${lines[2]:-}"

# The user can write its home, not the system.
run sudo -u user bash -c 'echo hi > ~/f && cat ~/f; touch /usr/x 2>/dev/null && echo wrote-usr || echo no-usr'
check "user writes home, not /usr" "hi
no-usr" "$out"

finish
