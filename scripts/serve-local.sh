#!/usr/bin/env bash
# The end of `make run`: `sandcell serve` on http://127.0.0.1:3000 with port URLs
# (`--domain D`, HTTPS on 127.0.0.1:443, docs/port-urls.md) and this host set up to use them:
# every name under D resolves to 127.0.0.1 and the daemon's CA is trusted
# (scripts/local-domain.sh). Ctrl-C stops the daemon and undoes the host setup. Port 443
# taken, or SANDCELL_DOMAIN=none: the daemon serves without port URLs, as before.
#
#   scripts/serve-local.sh SANDCELL_BIN DATA_DIR
set -euo pipefail

bin=${1:?usage: serve-local.sh SANDCELL_BIN DATA_DIR}
data=${2:?usage: serve-local.sh SANDCELL_BIN DATA_DIR}
domain=${SANDCELL_DOMAIN:-sandcell.localhost}
here=$(cd "$(dirname "$0")" && pwd)
say() { echo "==> $*"; }

domain_args=()
if [ "$domain" = none ]; then
  domain=
elif ss -Hltn "sport = :443" 2>/dev/null | grep -qE '(127\.0\.0\.1|0\.0\.0\.0|\*|\[::\]):443'; then
  say "port 443 of 127.0.0.1 is taken: serving without port URLs (SANDCELL_DOMAIN=none to skip this check)"
  domain=
else
  domain_args=(--domain "$domain" --https-port 443)
fi

"$bin" serve --data-dir "$data" "${domain_args[@]}" &
serve=$!
set_up=
stop() {
  kill -TERM "$serve" 2>/dev/null || true
  wait "$serve" 2>/dev/null || true
  if [ -n "$set_up" ]; then "$here/local-domain.sh" down "$domain" || true; fi
}
trap 'stop; exit 130' INT TERM HUP
# Listening once port 3000 answers (the CA is written before the listeners start).
for _ in $(seq 300); do
  kill -0 "$serve" 2>/dev/null || { wait "$serve"; exit $?; }
  (exec 3<>/dev/tcp/127.0.0.1/3000) 2>/dev/null && break
  sleep 0.1
done

key="\$(sudo cat $data/admin.key)"
if [ -n "$domain" ]; then
  # Undone at the stop even when `up` fails halfway (`down` undoes what there is).
  set_up=1
  if "$here/local-domain.sh" up "$domain" 127.0.0.1 "$data/tls/ca.pem"; then
    say "port URLs: https://<port>-<sandboxID>.$domain (this host resolves and trusts them until Ctrl-C)"
    echo "    E2B SDKs (Python, npm), from another shell:"
    echo "      export E2B_API_URL=http://127.0.0.1:3000 E2B_DOMAIN=$domain E2B_API_KEY=$key"
    echo "    (desktop.stream.get_url() then opens in this host's browser)"
  else
    say "the host setup for $domain failed (above): port URLs need *.$domain to resolve to"
    echo "    127.0.0.1 and $data/tls/ca.pem to be trusted; meanwhile:"
    echo "      export E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000 E2B_API_KEY=$key"
  fi
else
  echo "    E2B SDKs, from another shell:"
  echo "      export E2B_API_URL=http://127.0.0.1:3000 E2B_SANDBOX_URL=http://127.0.0.1:3000 E2B_API_KEY=$key"
fi
echo "    then in python3:  from e2b import Sandbox; sbx = Sandbox.create(); print(sbx.commands.run('uname -a').stdout)"
echo "    CLI (as root on this host): target/release/sandcell create, ls, exec ID -- uname -a, shell ID, cp, kill"
status=0
wait "$serve" || status=$?
if [ -n "$set_up" ]; then "$here/local-domain.sh" down "$domain" || true; fi
exit "$status"
