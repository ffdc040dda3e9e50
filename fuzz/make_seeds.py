#!/usr/bin/env python3
"""Writes fuzz/seeds/<target>/*: small well-formed inputs for each target, so the fuzzer
starts from the shapes real input has (a DNS query, an HTTP head, a ClientHello, a
Dockerfile, agent envelopes, virtqueues holding valid chains). Run it again after changing
a target's input layout; the seeds are committed."""

import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "seeds", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- dns_wire ---
def dns_query(qid, name, qtype, pointer=False):
    out = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        out += bytes([len(label)]) + label.encode()
    out += b"\x00" + struct.pack(">HH", qtype, 1)
    return out


put("dns_wire", "a_example_com", dns_query(0x1234, "example.com", 1))
put("dns_wire", "aaaa_pub_bars_test", dns_query(7, "pub.bars.test", 28))
put("dns_wire", "pointer_loop", struct.pack(">HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c" + b"\x00\x01\x00\x01")


# --- egress_sniff: a split step, then a connection's first bytes ---
def client_hello(sni):
    name = sni.encode()
    sn = struct.pack(">HBH", len(name) + 3, 0, len(name)) + name
    exts = bytes([0x00, 0x0B, 0x00, 0x02, 0x01, 0x00]) + struct.pack(">HH", 0, len(sn)) + sn
    body = b"\x03\x03" + bytes([7] * 32) + b"\x00" + bytes([0x00, 0x02, 0x13, 0x01, 0x01, 0x00])
    body += struct.pack(">H", len(exts)) + exts
    hs = b"\x01" + struct.pack(">I", len(body))[1:] + body
    return b"\x16\x03\x01" + struct.pack(">H", len(hs)) + hs


put("egress_sniff", "http_head", b"\x05GET / HTTP/1.1\r\nHost: Pub.Bars.Test:8080\r\nAccept: */*\r\n\r\n")
put("egress_sniff", "http_two_hosts", b"\x03POST /x HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\nbody")
put("egress_sniff", "tls_sni", b"\x07" + client_hello("api.example.com"))
put("egress_sniff", "tls_sni_dot", b"\x01" + client_hello("API.example.com."))

# --- dockerfile ---
put("dockerfile", "simple", b"""# escape=\\
ARG BASE=debian
FROM ${BASE}:bookworm AS build
ENV A=1 B="two words" C='$A'
RUN echo "$A" && \\
    apt-get update
COPY --from=build --chown=1000:1000 /src /dst
WORKDIR /work
USER nobody
CMD ["python3", "-m", "http.server"]
""")
put("dockerfile", "backtick", b"""# escape=`
FROM scratch
RUN dir c:\\ `
    && echo ${X:-default} ${Y:+set}
""")

# --- agent_envelope: a chunk size, then envelopes (flags, u32 BE length, message) ---
def env(flags, msg):
    return struct.pack(">BI", flags, len(msg)) + msg


put("agent_envelope", "two", b"\x03" + env(0, b'{"event":{"start":{"pid":1}}}') + env(2, b"{}"))
put("agent_envelope", "too_large", b"\x10" + struct.pack(">BI", 0, 1 << 20))

# --- oci_unpack: arbitrary-derived; any bytes are a layer of some shape ---
put("oci_unpack", "bytes", bytes(range(256)))
put("oci_unpack", "dotdot", b"\x02\x07../evil\x00\x00\x05hello" * 4)

# --- virtio: per queue a descriptor table (16 x 16 bytes) and an avail ring (6 + 2 x 16),
# then the data region at DATA_BASE (0x10_0000). ---
QSIZE = 16
DATA_BASE = 0x10_0000
F_NEXT, F_WRITE = 1, 2


def queue(descs, heads):
    table = b"".join(struct.pack("<QIHH", a, l, f, n) for (a, l, f, n) in descs)
    table = table.ljust(16 * QSIZE, b"\x00")
    ring = b"".join(struct.pack("<H", h) for h in heads).ljust(2 * QSIZE, b"\x00")
    avail = struct.pack("<HH", 0, len(heads)) + ring + b"\x00\x00"
    return table + avail


empty = queue([], [])
put("virtio_rng", "one_chain", queue([(DATA_BASE, 64, F_WRITE, 0)], [0]))
put("virtio_rng", "two_chains", queue([(DATA_BASE, 3000, F_WRITE | F_NEXT, 1), (DATA_BASE + 0x2000, 1096, F_WRITE, 0), (DATA_BASE, 8, F_WRITE, 0)], [0, 2]))

HDR, STATUS, DATA = DATA_BASE, DATA_BASE + 0x100, DATA_BASE + 0x1000


def blk(req_type, sector, data_flags):
    q = queue([(HDR, 16, F_NEXT, 1), (DATA, 512, data_flags | F_NEXT, 2), (STATUS, 1, F_WRITE, 0)], [0])
    return q + struct.pack("<IIQ", req_type, 0, sector)


put("virtio_block", "read_sector_0", blk(0, 0, F_WRITE))
put("virtio_block", "write_sector_3", blk(1, 3, 0))
put("virtio_block", "get_id", queue([(HDR, 16, F_NEXT, 1), (DATA, 20, F_WRITE | F_NEXT, 2), (STATUS, 1, F_WRITE, 0)], [0]) + struct.pack("<IIQ", 8, 0, 0))

frame = bytes(12) + bytes([0xFF] * 6) + bytes([2, 0, 0, 0, 0, 1]) + b"\x08\x00" + bytes(46)
rx = queue([(DATA_BASE + 0x8000, 1526, F_WRITE, 0)], [0])
tx = queue([(DATA_BASE, len(frame), 0, 0)], [0])
put("virtio_net", "one_frame", rx + tx + frame)

vhdr = struct.pack("<QQIIIHHIII", 3, 2, 1024, 1234, 0, 1, 1, 0, 262144, 0)  # REQUEST to host port 1234
rxq = queue([(DATA_BASE + 0x8000, 4096, F_WRITE, 0)], [0])
txq = queue([(DATA_BASE, len(vhdr), 0, 0)], [0])
put("virtio_vsock", "connect_request", rxq + txq + empty + vhdr)


# --- mmio_restore: a postcard MmioState of an activated virtio-rng, then guest memory ---
def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


state = b"".join([
    varint(4), varint(0), varint(1), varint(0), varint(1 << 32), varint(0), varint(15), varint(0), varint(0),
    varint(1), varint(16), b"\x01", varint(0), varint(0x100), varint(0x200),
    b"\x01", varint(1), varint(0), varint(0),
])
mem = queue([(0x1000, 64, F_WRITE, 0)], [0]).ljust(0x300, b"\x00")
put("mmio_restore", "activated_rng", state + mem)
put("mmio_restore", "not_activated", state[:-4] + b"\x00" + mem)
