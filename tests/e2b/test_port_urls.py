"""HTTPS port URLs: the registry `e2b` Python SDK, unmodified, against `sandcell serve
--domain D` with E2B_DOMAIN=D and no E2B_SANDBOX_URL, so envd is reached at
https://49983-<id>.D and a sandbox's own port at https://<port>-<id>.D (port 443).

Run through tests/e2b/port_urls.sh, which sets E2B_API_URL, E2B_API_KEY, E2B_DOMAIN,
SSL_CERT_FILE (the daemon's CA, for the SDK's transport), SANDCELL_CA (the same, for httpx),
SANDCELL_HTTPS_IP (where D's names must resolve) and SANDCELL_TEMPLATE. Names resolve
through /etc/hosts lines each test adds for its sandbox and removes after.
"""

import os
import socket
import ssl
import time

import certifi
import httpx
import pytest

from e2b import Sandbox
from hosts import hosts_add, hosts_clear

TEMPLATE = os.environ["SANDCELL_TEMPLATE"]
DOMAIN = os.environ["E2B_DOMAIN"]
IP = os.environ["SANDCELL_HTTPS_IP"]
CA = os.environ["SANDCELL_CA"]
PORT = 8000

# One HTTP exchange on stdin/stdout (busybox nc -e, in any template): `/stream` writes a
# line, waits for /tmp/go, writes another; an Upgrade is switched and echoed back byte for
# byte; anything else answers the Host the app saw.
SERVER = r"""#!/bin/sh
host=; upgrade=; path=
read -r method path version
while IFS= read -r line; do
    line=$(printf %s "$line" | tr -d '\r')
    [ -z "$line" ] && break
    case "$line" in
        [Hh]ost:*) host=${line#*: } ;;
        [Uu]pgrade:*) upgrade=${line#*: } ;;
    esac
done
if [ -n "$upgrade" ]; then
    printf 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n' "$upgrade"
    exec cat
fi
printf 'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n'
echo "host=$host"
if [ "$path" = /stream ]; then
    echo first
    while [ ! -e /tmp/go ]; do sleep 0.05; done
    echo second
fi
"""


def trusted():
    return ssl.create_default_context(cafile=CA)


def start_server(sbx):
    sbx.files.write("/tmp/srv.sh", SERVER)
    sbx.commands.run("chmod 755 /tmp/srv.sh")
    sbx.commands.run(f"nc -ll -p {PORT} -e /tmp/srv.sh", background=True)


def wait_up(url, **kw):
    last = None
    for _ in range(100):
        try:
            r = httpx.get(url, verify=trusted(), timeout=5, **kw)
            if r.status_code != 502:
                return r
            last = r
        except httpx.TransportError as e:
            last = e
        time.sleep(0.1)
    raise AssertionError(f"{url} never answered: {last}")


@pytest.fixture
def make():
    made = []

    def create(**kw):
        sbx = Sandbox.create(template=TEMPLATE, timeout=120, **kw)
        made.append(sbx)
        names = [f"{p}-{sbx.sandbox_id}.{DOMAIN}" for p in (49983, PORT)]
        hosts_add(names)
        return sbx

    try:
        yield create
    finally:
        hosts_clear()
        for sbx in made:
            sbx.kill()


def test_the_sdk_reaches_envd_and_ports_by_https_url(make):
    sbx = make()
    # create's answer named the domain; the SDK builds its URLs from it
    assert sbx.sandbox_domain == DOMAIN
    host = sbx.get_host(PORT)
    assert host == f"{PORT}-{sbx.sandbox_id}.{DOMAIN}"
    # envd over https://49983-<id>.D: commands and files through the SDK's own transport
    assert sbx.commands.run("echo over-https").stdout == "over-https\n"
    start_server(sbx)
    r = wait_up(f"https://{host}/")
    assert r.status_code == 200
    # the app sees the URL's Host (no mask asked)
    assert r.text == f"host={host}\n"
    # a certificate from nowhere else: without the daemon's CA (certifi's roots only; the
    # system default would read SSL_CERT_FILE, the CA) the handshake fails
    public_roots = ssl.create_default_context(cafile=certifi.where())
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"https://{host}/", verify=public_roots, timeout=5)


def test_streamed_responses_and_upgrades_pass_unbuffered(make):
    sbx = make()
    host = sbx.get_host(PORT)
    start_server(sbx)
    wait_up(f"https://{host}/")
    # the second line is written only after the first arrived here: a proxy holding the
    # body would never deliver either
    with httpx.stream("GET", f"https://{host}/stream", verify=trusted(), timeout=30) as r:
        lines = r.iter_lines()
        assert next(lines) == f"host={host}"
        assert next(lines) == "first"
        sbx.files.write("/tmp/go", "")
        assert next(lines) == "second"
    # an Upgrade: switched, then bytes both ways through the TLS connection
    raw = socket.create_connection((IP, 443), timeout=30)
    tls = trusted().wrap_socket(raw, server_hostname=host)
    tls.sendall(
        f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = tls.recv(4096)
        assert chunk, head
        head += chunk
    assert head.startswith(b"HTTP/1.1 101"), head
    rest = head.split(b"\r\n\r\n", 1)[1]
    tls.sendall(b"ping over the upgraded connection")
    while len(rest) < len(b"ping over the upgraded connection"):
        chunk = tls.recv(4096)
        assert chunk, rest
        rest += chunk
    assert rest == b"ping over the upgraded connection"
    tls.close()


def test_traffic_token_and_mask_request_host(make):
    sbx = make(
        network={"allow_public_traffic": False, "mask_request_host": "localhost:${PORT}"}
    )
    token = sbx.traffic_access_token
    assert token
    host = sbx.get_host(PORT)
    start_server(sbx)
    header = {"e2b-traffic-access-token": token}
    r = wait_up(f"https://{host}/", headers=header)
    assert r.status_code == 200
    # the app saw the mask, the port put in
    assert r.text == f"host=localhost:{PORT}\n"
    # no token, a wrong one, the envd token instead: refused before the sandbox
    for headers in ({}, {"e2b-traffic-access-token": "0" * len(token)},
                    {"x-access-token": sbx._envd_access_token or "x"}):
        r = httpx.get(f"https://{host}/", headers=headers, verify=trusted(), timeout=10)
        assert r.status_code == 403, (headers, r.text)


def test_the_api_is_not_on_the_https_port():
    r = httpx.get(
        f"https://{IP}:443/sandboxes",
        headers={"host": f"api.{DOMAIN}", "x-api-key": os.environ["E2B_API_KEY"]},
        verify=False,
        timeout=10,
    )
    assert r.status_code == 404, r.text
