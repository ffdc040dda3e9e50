#!/usr/bin/env bash
# The one-machine equivalent of a wildcard DNS record and a trusted certificate for
# `sandcell serve --domain D` (docs/port-urls.md), as `make run` sets it up:
#
#   scripts/local-domain.sh up D IP CA_PEM   every name under D resolves to IP; CA_PEM is
#                                            trusted by the system store
#   scripts/local-domain.sh down D           undoes `up`
#   scripts/local-domain.sh status D         says what is in place
#
# Names: dnsmasq (Debian's dnsmasq-base) on 127.77.0.53:53 answers D and every name under it
# with IP and forwards every other question to the resolvers /etc/resolv.conf named before,
# which stay listed after it (so that, were dnsmasq gone, names still resolve, a timeout
# later). The package registries and every other name resolve as before. A resolv.conf that
# is a link (systemd-resolved, resolvconf) is not edited: the script says what to add.
# Certificate: CA_PEM is copied to /usr/local/share/ca-certificates/sandcell-D.crt and
# update-ca-certificates runs (what the E2B Python SDK's transport and curl read; a
# browser with its own store, Firefox or Chromium's NSS db, needs it imported there).
#
# Needs root. `up` run again replaces what an earlier `up` of D did.
set -euo pipefail

LISTEN=${SANDCELL_LOCAL_DNS:-127.77.0.53}
RESOLV=${SANDCELL_RESOLV_CONF:-/etc/resolv.conf}
CERTS=${SANDCELL_CA_DIR:-/usr/local/share/ca-certificates}
STATE=${SANDCELL_LOCAL_STATE:-/run/sandcell-local-domain}

say() { echo "local-domain: $*" >&2; }
die() { say "$*"; exit 1; }
usage() { die "usage: $0 up DOMAIN IP CA_PEM | down DOMAIN | status DOMAIN"; }

valid_domain() {
  [[ $1 =~ ^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)+$ ]]
}

dns_up() {
  local domain=$1 ip=$2 dir=$STATE/$1
  mkdir -p "$dir"
  # The resolvers before this script: the upstreams dnsmasq forwards to.
  # Without this script's own lines: a file still edited by an `up` whose state is gone (a
  # reboot empties /run) must not be restored with them.
  local backup=$dir/resolv.conf.before
  if [ ! -e "$backup" ]; then
    grep -v -e '^# sandcell local-domain: ' -e "^nameserver[[:space:]]*$LISTEN[[:space:]]*\$" \
      "$RESOLV" >"$backup" || true
  fi
  local upstreams
  upstreams=$(sed -n 's/^[[:space:]]*nameserver[[:space:]]\+\([^[:space:]]*\).*/\1/p' "$backup" | grep -vx "$LISTEN" || true)
  [ -n "$upstreams" ] || die "$RESOLV names no nameserver to forward other names to"
  local args=(--keep-in-foreground --conf-file=/dev/null --no-resolv --no-poll
    --listen-address="$LISTEN" --bind-interfaces --port=53 --cache-size=1000
    --address="/$domain/$ip" --pid-file="$dir/dnsmasq.pid" --log-facility=-)
  for u in $upstreams; do args+=(--server="$u"); done
  dns_stop "$domain"
  if ss -Hlun "src $LISTEN:53" 2>/dev/null | grep -q .; then
    die "something else listens on $LISTEN:53 already (an earlier dnsmasq? SANDCELL_LOCAL_DNS picks another address)"
  fi
  : >"$dir/dnsmasq.log"
  setsid dnsmasq "${args[@]}" >>"$dir/dnsmasq.log" 2>&1 </dev/null &
  local pid=$!
  # Up once it listens; a dnsmasq that cannot bind writes its pid file and exits.
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || die "dnsmasq did not start: $(tail -3 "$dir/dnsmasq.log")"
    ss -Hlun "src $LISTEN:53" 2>/dev/null | grep -q . && break
    sleep 0.1
  done
  ss -Hlun "src $LISTEN:53" 2>/dev/null | grep -q . ||
    die "dnsmasq does not listen on $LISTEN:53: $(tail -3 "$dir/dnsmasq.log")"
  if [ -L "$RESOLV" ]; then
    say "$RESOLV is a link (managed by $(readlink -f "$RESOLV")): not edited. Send $domain's"
    say "  names to $LISTEN there (systemd-resolved: DNS=$LISTEN and Domains=~$domain in a"
    say "  resolved.conf.d drop-in)"
    return 0
  fi
  # dnsmasq first, then the resolvers before it (a fallback), then what else the file had.
  {
    echo "# sandcell local-domain: $domain via dnsmasq on $LISTEN (scripts/local-domain.sh down $domain undoes it)"
    echo "nameserver $LISTEN"
    grep -v '^[[:space:]]*#' "$backup" || true
  } >"$dir/resolv.conf.new"
  write_resolv "$dir/resolv.conf.new"
}

# In place, not by rename: in a container /etc/resolv.conf is often a bind mount.
write_resolv() {
  cat "$1" >"$RESOLV"
}

dns_stop() {
  local pidfile=$STATE/$1/dnsmasq.pid pid
  pid=$(cat "$pidfile" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -f "$pidfile"
}

ca_up() {
  local domain=$1 pem=$2
  grep -q -- "-----BEGIN CERTIFICATE-----" "$pem" 2>/dev/null || die "$pem is not a PEM certificate"
  mkdir -p "$CERTS"
  install -m 0644 "$pem" "$CERTS/sandcell-$domain.crt"
  update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed"
}

ca_down() {
  if [ -e "$CERTS/sandcell-$1.crt" ]; then
    rm -f "$CERTS/sandcell-$1.crt"
    update-ca-certificates >/dev/null 2>&1 || say "update-ca-certificates failed"
  fi
}

check_names() {
  local domain=$1 ip=$2 got
  got=$(getent ahostsv4 "check.$domain" | awk 'NR==1 {print $1}')
  [ "$got" = "$ip" ] || die "check.$domain resolves to '${got:-nothing}', not $ip"
}

cmd=${1:-}
case "$cmd" in
  up)
    [ $# -eq 4 ] || usage
    domain=$2 ip=$3 pem=$4
    valid_domain "$domain" || die "'$domain' is not a domain name"
    [[ $ip =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "'$ip' is not an IPv4 address"
    [ "$(id -u)" = 0 ] || die "needs root (it edits $RESOLV and the system CA store)"
    command -v dnsmasq >/dev/null || die "dnsmasq is not installed (apt-get install dnsmasq-base)"
    ca_up "$domain" "$pem"
    dns_up "$domain" "$ip"
    [ -L "$RESOLV" ] || check_names "$domain" "$ip"
    say "names under $domain resolve to $ip (dnsmasq on $LISTEN, first in $RESOLV); its CA is"
    say "  trusted system-wide ($CERTS/sandcell-$domain.crt). '$0 down $domain' undoes both."
    ;;
  down)
    [ $# -eq 2 ] || usage
    domain=$2
    valid_domain "$domain" || die "'$domain' is not a domain name"
    dns_stop "$domain"
    backup=$STATE/$domain/resolv.conf.before
    if [ -e "$backup" ] && [ ! -L "$RESOLV" ] && grep -q "^# sandcell local-domain: $domain " "$RESOLV"; then
      write_resolv "$backup"
    fi
    rm -rf "${STATE:?}/$domain"
    ca_down "$domain"
    say "$domain: resolver and CA as they were"
    ;;
  status)
    [ $# -eq 2 ] || usage
    domain=$2
    pid=$(cat "$STATE/$domain/dnsmasq.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then echo "dnsmasq: running (pid $pid)"; else echo "dnsmasq: not running"; fi
    if grep -q "^nameserver $LISTEN\$" "$RESOLV" 2>/dev/null; then echo "$RESOLV: $LISTEN first"; else echo "$RESOLV: not edited"; fi
    if [ -e "$CERTS/sandcell-$domain.crt" ]; then echo "CA: trusted"; else echo "CA: not installed"; fi
    ;;
  *) usage ;;
esac
