#!/usr/bin/python3
"""What a sandbox does, for the tests: run inside the sandbox's network namespace.

probe.py http URL          -> "OK <status> <body>" or "ERR <reason>"
probe.py dns NAME SERVER [tcp] -> "A ip,ip" / "RCODE n" / "ERR <reason>"
probe.py tcp IP PORT       -> "OK" or "ERR <reason>"
"""
import socket, struct, sys, urllib.request

def http(url):
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            print("OK", r.status, r.read(200).decode(errors="replace").strip())
    except Exception as e:
        print("ERR", type(e).__name__, e)

def dns(name, server, tcp=False):
    q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\0" + struct.pack(">HH", 1, 1)
    try:
        if tcp:
            s = socket.create_connection((server, 53), timeout=3)
            s.sendall(struct.pack(">H", len(q)) + q)
            n = struct.unpack(">H", s.recv(2))[0]
            r = b""
            while len(r) < n:
                r += s.recv(n - len(r))
        else:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(3)
            s.connect((server, 53))
            s.send(q)
            r = s.recv(4096)
    except Exception as e:
        print("ERR", type(e).__name__, e)
        return
    rcode = r[3] & 0xF
    if rcode:
        print("RCODE", rcode)
        return
    an = struct.unpack(">H", r[6:8])[0]
    pos = 12
    while r[pos]:
        pos += r[pos] + 1
    pos += 5
    ips = []
    for _ in range(an):
        if r[pos] & 0xC0 == 0xC0:
            pos += 2
        else:
            while r[pos]:
                pos += r[pos] + 1
            pos += 1
        t, _, _, l = struct.unpack(">HHIH", r[pos:pos + 10])
        if t == 1:
            ips.append(socket.inet_ntoa(r[pos + 10:pos + 14]))
        pos += 10 + l
    print("A", ",".join(ips))

def tcp(ip, port):
    try:
        socket.create_connection((ip, int(port)), timeout=3).close()
        print("OK")
    except Exception as e:
        print("ERR", type(e).__name__, e)

cmd = sys.argv[1]
if cmd == "http":
    http(sys.argv[2])
elif cmd == "dns":
    dns(sys.argv[2], sys.argv[3], len(sys.argv) > 4 and sys.argv[4] == "tcp")
elif cmd == "tcp":
    tcp(sys.argv[2], sys.argv[3])
