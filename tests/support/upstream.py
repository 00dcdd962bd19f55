"""Upstream echo server for the end-to-end tests (tests/support/netns.rs).

Runs inside the test's upstream network namespace, never in the root one.
HTTP on ADDR:80 and HTTPS on ADDR:443 answer every request with a JSON echo
of what arrived (method, path, headers, client address, whether TLS was
used), and append the same JSON as one line to LOG, so a test can also see
requests whose response never made it back. READY is created once both
sockets listen: the fixture polls for it instead of sleeping.

usage: upstream.py ADDR CERT KEY LOG READY
"""

import http.server
import json
import ssl
import sys
import threading

addr, cert, key, log_path, ready_path = sys.argv[1:6]
log_lock = threading.Lock()


class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
        echo = {
            "method": self.command,
            "path": self.path,
            "headers": {k: v for k, v in self.headers.items()},
            "body": body,
            "client": self.client_address[0],
            "tls": isinstance(self.connection, ssl.SSLSocket),
        }
        line = json.dumps(echo)
        with log_lock, open(log_path, "a") as f:
            f.write(line + "\n")
        out = (line + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = handle_any

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.client_address[0], fmt % args))


plain = http.server.ThreadingHTTPServer((addr, 80), Echo)
tls = http.server.ThreadingHTTPServer((addr, 443), Echo)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
# Handshake in the handler thread, so one stalled client cannot block accept().
tls.socket = ctx.wrap_socket(tls.socket, server_side=True, do_handshake_on_connect=False)
for server in (plain, tls):
    server.daemon_threads = True
threading.Thread(target=plain.serve_forever, daemon=True).start()
open(ready_path, "w").close()
tls.serve_forever()
