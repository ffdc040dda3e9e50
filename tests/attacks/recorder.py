"""The fake internet's recording upstream (run.sh starts it in the fake internet's netns):
HTTP/1.1 with keep-alive, every request it receives appended to a JSON-lines file as
{"port", "path", "headers"} (the Host among them) before it is answered 200 "ok".
`/redirect` answers 302 to http://other.bars.test/landed (the redirect leak attempt).

With CERT and KEY it speaks HTTPS (the upstream of the TLS interception tests; its CA is
the one the daemon is given by `--egress-extra-ca`, never one the sandbox trusts).

Usage: recorder.py ADDRESS PORT FILE [CERT KEY]
"""

import http.server
import json
import ssl
import sys
import threading

ADDR, PORT, FILE = sys.argv[1], int(sys.argv[2]), sys.argv[3]
LOCK = threading.Lock()


class Recorder(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def handle_one(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        record = {
            "port": PORT,
            "path": self.path,
            "headers": [[k, v] for k, v in self.headers.items()],
            "body": body.decode("latin-1"),
        }
        with LOCK, open(FILE, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", "http://other.bars.test/landed")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST = do_PUT = handle_one

    def log_message(self, *a):
        pass


server = http.server.ThreadingHTTPServer((ADDR, PORT), Recorder)
if len(sys.argv) > 5:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(sys.argv[4], sys.argv[5])
    # The handshake happens in the request's own thread, on its first read: a client that
    # stalls it holds up no one else.
    server.socket = tls.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
server.serve_forever()
