"""The servers agents really talk to, for tests/e2e_daemon.rs.

Runs inside the test's upstream network namespace, never in the root one,
with the upstream's test certificate:

* HTTPS on ADDR:8443 (HTTP/1.1):
  - GET /sse?n=N&gate=NAME: a text/event-stream. Event 1 is sent at once;
    the rest only after the file DIR/NAME exists, which the test creates
    once it has read event 1. A proxy that buffers the stream never hands
    event 1 over, so the test fails by its deadline instead of by timing.
  - GET /sse-idle?idle=S&tag=T: one event, S seconds of silence, one more;
    DIR/T-resumed is created just before that one is written, so a test
    can tell whether the first event reached it before the silence ended.
  - GET /sse-ticks?n=N&every=S: N events, one every S seconds, each
    `data: <time.monotonic_ns() when it was written>` (the clock all
    namespaces share), for the latency benchmark.
  - POST /v1/messages?n=N&every=S (and /v1/messages-unmetered, the same
    stream on a path no provider meters): an Anthropic Messages stream,
    message_start, then N content_block_delta events one every S seconds,
    each text the time.monotonic_ns() it was written, then message_delta
    and message_stop: the usage meter's benchmark (bench/usage-sse.sh).
  - POST|PUT /sink: reads the body as it comes (Content-Length or chunked)
    without keeping it, answers {"bytes", "sha256", "expect", "key_sha256"}
    (the SHA-256 of the x-api-key that arrived: ppp scrubs the key itself
    out of responses).
  - GET /download?bytes=N: N bytes (a repeating pattern), chunked.
* HTTPS on ADDR:8444, HTTP/2 only (ALPN h2, the `h2` library of the
  mitmproxy venv):
  - POST /bidi: gRPC-style bidirectional streaming. Response headers go
    out at once; every DATA frame is echoed back as it arrives, while the
    request is still open; when the request ends, trailers
    `grpc-status: 0` end the response.
  - anything else: {"protocol": "h2", "method", "path", "body_bytes",
    "key_sha256"} once the request has ended.
* HTTP on ADDR:8080: git's smart HTTP (`git http-backend`) for the bare
  repositories under DIR/git.

READY is created once every socket listens.

usage: agent_servers.py ADDR CERT KEY DIR READY
"""

import hashlib
import http.server
import socket
import json
import os
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse

import h2.config
import h2.connection
import h2.events

addr, cert, key, root, ready = sys.argv[1:6]
PATTERN = bytes(range(256)) * 256  # 64 KiB


def key_sha256(value):
    return hashlib.sha256(value.encode()).hexdigest() if value is not None else None


class Agentish(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.client_address[0], fmt % args))

    def query(self):
        return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def start_stream(self, content_type):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def do_GET(self):
        path = urllib.parse.urlsplit(self.path).path
        q = self.query()
        if path == "/sse":
            self.start_stream("text/event-stream")
            self.chunk(b"data: 1\n\n")
            gate = os.path.join(root, os.path.basename(q.get("gate", "gate")))
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.02)
            for i in range(2, int(q.get("n", "5")) + 1):
                self.chunk(b"data: %d\n\n" % i)
            self.chunk(b"")
        elif path == "/sse-idle":
            self.start_stream("text/event-stream")
            self.chunk(b"data: hello\n\n")
            time.sleep(float(q.get("idle", "1")))
            open(os.path.join(root, os.path.basename(q.get("tag", "idle")) + "-resumed"), "w").close()
            self.chunk(b"data: after-idle\n\n")
            self.chunk(b"")
        elif path == "/sse-ticks":
            # As an LLM API's server does: no Nagle delay on small events.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.start_stream("text/event-stream")
            every = float(q.get("every", "0.05"))
            start = time.monotonic()
            for i in range(int(q.get("n", "100"))):
                time.sleep(max(0.0, start + i * every - time.monotonic()))
                self.chunk(b"data: %d\n\n" % time.monotonic_ns())
            self.chunk(b"")
        elif path == "/download":
            left = int(q.get("bytes", "0"))
            self.start_stream("application/octet-stream")
            while left > 0:
                n = min(left, len(PATTERN))
                self.chunk(PATTERN[:n])
                left -= n
            self.chunk(b"")
        else:
            self.send_error(404)

    def anthropic_ticks(self):
        """A Messages stream whose deltas carry their write time."""
        q = self.query()
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.start_stream("text/event-stream")
        start_event = {
            "type": "message_start",
            "message": {
                "id": "msg_bench",
                "type": "message",
                "role": "assistant",
                "model": "claude-bench",
                "content": [],
                "usage": {"input_tokens": 10, "output_tokens": 1},
            },
        }
        self.chunk(b"event: message_start\ndata: %s\n\n" % json.dumps(start_event).encode())
        every = float(q.get("every", "0.05"))
        n = int(q.get("n", "100"))
        start = time.monotonic()
        for i in range(n):
            time.sleep(max(0.0, start + i * every - time.monotonic()))
            delta = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"%d"}}'
            self.chunk(b"event: content_block_delta\ndata: " + delta % time.monotonic_ns() + b"\n\n")
        end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": n}}
        self.chunk(b"event: message_delta\ndata: %s\n\n" % json.dumps(end).encode())
        self.chunk(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        self.chunk(b"")

    def do_POST(self):
        if urllib.parse.urlsplit(self.path).path in ("/v1/messages", "/v1/messages-unmetered"):
            return self.anthropic_ticks()
        h = hashlib.sha256()
        total = 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                left = size
                while left:
                    data = self.rfile.read(min(left, 1 << 16))
                    h.update(data)
                    total += len(data)
                    left -= len(data)
                self.rfile.readline()
        else:
            left = int(self.headers.get("Content-Length") or 0)
            while left:
                data = self.rfile.read(min(left, 1 << 16))
                if not data:
                    break
                h.update(data)
                total += len(data)
                left -= len(data)
        out = json.dumps(
            {
                "bytes": total,
                "sha256": h.hexdigest(),
                "expect": self.headers.get("Expect"),
                "key_sha256": key_sha256(self.headers.get("x-api-key")),
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_PUT = do_POST


class Git(http.server.BaseHTTPRequestHandler):
    """`git http-backend` as CGI: enough of RFC 3875 for git's smart HTTP,
    with the request body and the response streamed, not held."""

    protocol_version = "HTTP/1.0"

    def log_message(self, fmt, *args):
        sys.stderr.write("git %s\n" % (fmt % args))

    def do_any(self):
        url = urllib.parse.urlsplit(self.path)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": os.path.join(root, "git"),
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": urllib.parse.unquote(url.path.removeprefix("/git")),
            "QUERY_STRING": url.query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "REMOTE_ADDR": self.client_address[0],
        }
        if self.headers.get("Content-Length"):
            env["CONTENT_LENGTH"] = self.headers["Content-Length"]
        if self.headers.get("Git-Protocol"):
            env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
        p = subprocess.Popen(["git", "http-backend"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        left = int(self.headers.get("Content-Length") or 0)
        while left:
            data = self.rfile.read(min(left, 1 << 16))
            if not data:
                break
            p.stdin.write(data)
            left -= len(data)
        p.stdin.close()
        status, headers = "200 OK", []
        while True:
            line = p.stdout.readline().rstrip(b"\r\n")
            if not line:
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "status":
                status = value.strip()
            else:
                headers.append((name, value.strip()))
        code, _, reason = status.partition(" ")
        self.send_response(int(code), reason)
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        while data := p.stdout.read(1 << 16):
            self.wfile.write(data)
        p.wait()

    do_GET = do_POST = do_any


def serve_h2(raw):
    """One HTTP/2 connection (sans-IO `h2`, blocking socket, own thread)."""
    try:
        sock = h2_ctx.wrap_socket(raw, server_side=True)
    except (OSError, ssl.SSLError) as e:
        sys.stderr.write("h2: handshake failed: %s\n" % e)
        raw.close()
        return
    with sock:
        if sock.selected_alpn_protocol() != "h2":
            sys.stderr.write("h2: ALPN %r, not h2\n" % sock.selected_alpn_protocol())
            return
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        streams = {}
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                return
            if not data:
                return
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.RequestReceived):
                    headers = dict(ev.headers)
                    streams[ev.stream_id] = {"headers": headers, "bytes": 0}
                    sys.stderr.write("h2 %s %s\n" % (headers.get(":method"), headers.get(":path")))
                    if headers.get(":path") == "/bidi":
                        conn.send_headers(
                            ev.stream_id,
                            [
                                (":status", "200"),
                                ("content-type", "application/grpc"),
                                ("x-key-sha256", key_sha256(headers.get("x-api-key")) or "none"),
                            ],
                        )
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    st = streams.get(ev.stream_id)
                    if st is None:
                        continue
                    st["bytes"] += len(ev.data)
                    if st["headers"].get(":path") == "/bidi" and ev.data:
                        conn.send_data(ev.stream_id, ev.data)
                elif isinstance(ev, h2.events.StreamEnded):
                    st = streams.pop(ev.stream_id, None)
                    if st is None:
                        continue
                    h = st["headers"]
                    if h.get(":path") == "/bidi":
                        conn.send_headers(ev.stream_id, [("grpc-status", "0"), ("grpc-message", "OK")], end_stream=True)
                    else:
                        out = json.dumps(
                            {
                                "protocol": "h2",
                                "method": h.get(":method"),
                                "path": h.get(":path"),
                                "body_bytes": st["bytes"],
                                "key_sha256": key_sha256(h.get("x-api-key")),
                            }
                        ).encode()
                        conn.send_headers(
                            ev.stream_id,
                            [(":status", "200"), ("content-type", "application/json"), ("content-length", str(len(out)))],
                        )
                        conn.send_data(ev.stream_id, out, end_stream=True)
                elif isinstance(ev, h2.events.StreamReset):
                    streams.pop(ev.stream_id, None)
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    sock.sendall(conn.data_to_send())
                    return
            sock.sendall(conn.data_to_send())


def accept_h2(listener):
    while True:
        raw, _ = listener.accept()
        threading.Thread(target=serve_h2, args=(raw,), daemon=True).start()


h2_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
h2_ctx.load_cert_chain(cert, key)
h2_ctx.set_alpn_protocols(["h2"])
h2_listener = socket.create_server((addr, 8444))
threading.Thread(target=accept_h2, args=(h2_listener,), daemon=True).start()

https = http.server.ThreadingHTTPServer((addr, 8443), Agentish)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
https.socket = ctx.wrap_socket(https.socket, server_side=True)
git = http.server.ThreadingHTTPServer((addr, 8080), Git)
for server in (https, git):
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
open(ready, "w").close()
threading.Event().wait()
