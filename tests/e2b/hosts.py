"""/etc/hosts lines for the port-URL tests: the names of a sandbox's ports under the daemon's
domain resolve to its HTTPS address (SANDCELL_HTTPS_IP). Each process marks its lines with
its pid and removes only those."""

import os

HOSTS = "/etc/hosts"
IP = os.environ["SANDCELL_HTTPS_IP"]
MARK = f"# sandcell tests/e2b port URLs {os.getpid()}"


def hosts_add(names):
    with open(HOSTS, "a") as f:
        f.write(f"{IP} {' '.join(names)} {MARK}\n")


def hosts_clear():
    with open(HOSTS) as f:
        kept = [line for line in f if not line.rstrip("\n").endswith(MARK)]
    with open(HOSTS, "w") as f:
        f.writelines(kept)
