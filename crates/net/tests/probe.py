#!/usr/bin/python3
"""What a sandbox does, for the tests: run inside the sandbox's network namespace.

probe.py http URL          -> "OK <status> <body>" or "ERR <reason>"
probe.py dns NAME SERVER [tcp|aaaa] -> "A ip,ip" / "AAAA ip,ip" / "RCODE n" / "ERR <reason>"
probe.py tcp IP PORT       -> "OK" or "ERR <reason>"
probe.py httphost IP HOST [PORT] -> GET http://IP:PORT/ (80) with "Host: HOST": "OK <status> <body>" or "ERR ..."
probe.py tls IP SNI [PORT] -> a ClientHello naming SNI to IP:PORT (443): "OK <first bytes back>" or "ERR ..."
probe.py banner IP PORT    -> connect, send nothing, read: "OK <first bytes>" or "ERR ..."
"""
import socket, struct, sys, urllib.request

def http(url):
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            print("OK", r.status, r.read(200).decode(errors="replace").strip())
    except Exception as e:
        print("ERR", type(e).__name__, e)

def dns(name, server, tcp=False, qtype=1):
    q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\0" + struct.pack(">HH", qtype, 1)
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
        if t == qtype == 1:
            ips.append(socket.inet_ntoa(r[pos + 10:pos + 14]))
        if t == qtype == 28:
            ips.append(socket.inet_ntop(socket.AF_INET6, r[pos + 10:pos + 26]))
        pos += 10 + l
    print("A" if qtype == 1 else "AAAA", ",".join(ips))

def tcp(ip, port):
    try:
        socket.create_connection((ip, int(port)), timeout=3).close()
        print("OK")
    except Exception as e:
        print("ERR", type(e).__name__, e)

def httphost(ip, host, port=80):
    try:
        s = socket.create_connection((ip, int(port)), timeout=3)
        s.sendall(("GET / HTTP/1.0\r\nHost: %s\r\n\r\n" % host).encode())
        r = b""
        while True:
            d = s.recv(4096)
            if not d:
                break
            r += d
        head, _, body = r.partition(b"\r\n\r\n")
        status = head.split(b" ")[1].decode() if head else "none"
        print("OK", status, body.decode(errors="replace").strip())
    except Exception as e:
        print("ERR", type(e).__name__, e)

def client_hello(sni):
    name = sni.encode()
    sn = struct.pack(">HBH", len(name) + 3, 0, len(name)) + name
    exts = struct.pack(">HH", 0, len(sn)) + sn
    body = b"\x03\x03" + b"\x07" * 32 + b"\x00" + b"\x00\x02\x13\x01\x01\x00"
    body += struct.pack(">H", len(exts)) + exts
    hs = b"\x01" + struct.pack(">I", len(body))[1:] + body
    return b"\x16\x03\x01" + struct.pack(">H", len(hs)) + hs

def banner(ip, port):
    try:
        s = socket.create_connection((ip, int(port)), timeout=3)
        d = s.recv(100)
        print("OK", d.decode(errors="replace").strip()) if d else print("ERR closed")
    except Exception as e:
        print("ERR", type(e).__name__, e)

def tls(ip, sni, port=443):
    try:
        s = socket.create_connection((ip, int(port)), timeout=3)
        s.sendall(client_hello(sni))
        d = s.recv(100)
        print("OK", d.decode(errors="replace").strip()) if d else print("ERR closed")
    except Exception as e:
        print("ERR", type(e).__name__, e)

cmd = sys.argv[1]
if cmd == "http":
    http(sys.argv[2])
elif cmd == "dns":
    mode = sys.argv[4] if len(sys.argv) > 4 else ""
    dns(sys.argv[2], sys.argv[3], mode == "tcp", 28 if mode == "aaaa" else 1)
elif cmd == "tcp":
    tcp(sys.argv[2], sys.argv[3])
elif cmd == "httphost":
    httphost(*sys.argv[2:5])
elif cmd == "tls":
    tls(*sys.argv[2:5])
elif cmd == "banner":
    banner(sys.argv[2], sys.argv[3])
