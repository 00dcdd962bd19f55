"""Upstream echo server for the end-to-end tests (tests/support/netns.rs).

Runs inside the test's upstream network namespace, never in the root one.
HTTP on ADDR:80 and HTTPS on ADDR:443 answer every request with a JSON echo
of what arrived (method, path, headers, client address, whether TLS was
used), and append the same JSON as one line to LOG, so a test can also see
requests whose response never made it back. A chunked request body is read
and counted, never kept (`body_bytes`, for the flood tests). Two paths do
something else: `GET /chunked/<n>` answers n zero bytes, chunked, generated
as they are sent; `GET /sse-ticks/<n>/<ms>` is a text/event-stream of n events
(`data: <i>`), one every ms milliseconds (a long-lived SSE stream); `/ws` is a WebSocket server that counts what a client
sends (binary messages) and answers each text message with
`{"echo": <text>, "bytes": <binary bytes so far>}`. A request with an
`x-fixture: NAME` header is answered with tests/fixtures/usage/NAME (an LLM
provider's recorded response, for tests/e2e_usage.rs): a `.sse` file as a
chunked text/event-stream, one event per chunk, anything else as one JSON
body; `x-fixture-status` sets the status, `x-fixture-gzip: 1` compresses
it, `x-fixture-delay-ms` spaces the events (10 ms by default), and
`x-fixture-cut: N` closes the connection after N bytes of the body
(a stream the upstream broke off). DNS on ADDR:53 (UDP) answers A
queries from ZONE, a JSON object {name: ipv4} re-read on every query (so a
test can change answers), NXDOMAIN for unknown names, no answer at all for a
name whose value is "drop" (a name whose DNS never answers), and logs each
query as a JSON line to DNSLOG. READY is created once every socket listens: the
fixture polls for it instead of sleeping.

usage: upstream.py ADDR[,ADDR...] CERT KEY LOG READY ZONE DNSLOG

With several addresses, HTTP and HTTPS listen on each and DNS on the first.
TCP port 7 on each address echoes every line back (a long-lived stream).
"""

import base64
import gzip
import hashlib
import http.server
import json
import socket
import ssl
import struct
import sys
import threading
import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "usage"

addrs, cert, key, log_path, ready_path, zone_path, dns_log_path = sys.argv[1:8]
addrs = addrs.split(",")
log_lock = threading.Lock()


class Echo(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def handle_any(self):
        if self.path.startswith("/chunked/"):
            return self.send_chunked(int(self.path.rsplit("/", 1)[1]))
        if self.path.startswith("/sse-ticks/"):
            n, ms = self.path.split("/")[2:4]
            return self.send_ticks(int(n), int(ms))
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        body_bytes = 0
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body, body_bytes = "", self.read_chunked()
            if body_bytes is None:
                return  # the body never ended: nothing arrived
        else:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
            body_bytes = length
        echo = {
            "body_bytes": body_bytes,
            "method": self.command,
            "path": self.path,
            "headers": {k: v for k, v in self.headers.items()},
            "body": body,
            "client": self.client_address[0],
            "server": self.connection.getsockname()[0],
            "tls": isinstance(self.connection, ssl.SSLSocket),
        }
        line = json.dumps(echo)
        with log_lock, open(log_path, "a") as f:
            f.write(line + "\n")
        if self.headers.get("x-fixture"):
            return self.send_fixture(self.headers["x-fixture"])
        out = (line + "\n").encode()
        # `/401/...`: a service that rejects the key (e2e_secret_command).
        self.send_response(401 if self.path.startswith("/401/") else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = handle_any

    def read_chunked(self):
        """Count a chunked body without keeping it; None if it was cut off."""
        total = 0
        while True:
            line = self.rfile.readline(1024)
            if not line.endswith(b"\n"):
                return None
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return total
            left = size
            while left:
                got = self.rfile.read(min(left, 1 << 20))
                if not got:
                    return None
                left -= len(got)
            total += size
            if self.rfile.read(2) != b"\r\n":
                return None

    def send_chunked(self, n):
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        block = bytes(256 * 1024)
        left = n
        while left:
            part = block[: min(left, len(block))]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            left -= len(part)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def send_fixture(self, name):
        body = (FIXTURES / Path(name).name).read_bytes()
        sse = name.endswith(".sse")
        gz = self.headers.get("x-fixture-gzip") == "1"
        cut = int(self.headers.get("x-fixture-cut") or -1)
        if gz:
            body = gzip.compress(body)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.send_response(int(self.headers.get("x-fixture-status") or 200))
        self.send_header("Content-Type", "text/event-stream" if sse else "application/json")
        if gz:
            self.send_header("Content-Encoding", "gzip")
        if sse:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        parts = [p + b"\n\n" for p in body.split(b"\n\n") if p] if sse and not gz else [body]
        sent = 0
        for part in parts:
            if 0 <= cut < sent + len(part):
                part = part[: cut - sent]
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part) if sse else part)
            self.wfile.flush()
            sent += len(part)
            if 0 <= cut <= sent:
                # Broken off mid-body: no last chunk, the connection closed.
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            time.sleep(int(self.headers.get("x-fixture-delay-ms") or 10) / 1000.0)
        if sse:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    def send_ticks(self, n, ms):
        # As an LLM API's server does: each small event goes out at once.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for i in range(1, n + 1):
            event = b"data: %d\n\n" % i
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()
            time.sleep(ms / 1000.0)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"].encode()
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept.decode())
        self.end_headers()
        self.wfile.flush()
        counted = 0
        while True:
            frame = ws_read_frame(self.rfile)
            if frame is None:
                return
            opcode, payload_len, payload = frame
            if opcode == 8:  # close
                self.wfile.write(b"\x88\x00")
                self.wfile.flush()
                return
            if opcode == 9:  # ping
                self.wfile.write(ws_frame(10, payload))
                self.wfile.flush()
            elif opcode == 1:
                text = payload.decode()
                if text.startswith("big "):
                    # A large message the other way: `big N` gets N bytes.
                    self.wfile.write(ws_frame(2, bytes(int(text[4:]))))
                reply = json.dumps({"echo": text, "bytes": counted}).encode()
                self.wfile.write(ws_frame(1, reply))
                self.wfile.flush()
            elif opcode in (0, 2):
                counted += payload_len

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.client_address[0], fmt % args))


def ws_read_frame(f):
    """(opcode, payload length, payload) of one client frame; a binary or
    continuation payload is skipped, not kept. None at EOF."""
    head = f.read(2)
    if len(head) < 2:
        return None
    opcode, n = head[0] & 0x0F, head[1] & 0x7F
    if n == 126:
        n = struct.unpack(">H", f.read(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", f.read(8))[0]
    mask = f.read(4) if head[1] & 0x80 else b"\0\0\0\0"
    if opcode in (0, 2):
        left = n
        while left:
            got = f.read(min(left, 1 << 20))
            if not got:
                return None
            left -= len(got)
        return opcode, n, b""
    data = f.read(n)
    return opcode, n, bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def ws_frame(opcode, payload, mask=None):
    """One final frame; masked (as a client must) when `mask` is given."""
    n = len(payload)
    if n < 126:
        head = bytes([0x80 | opcode, n | (0x80 if mask else 0)])
    elif n < 1 << 16:
        head = bytes([0x80 | opcode, 126 | (0x80 if mask else 0)]) + struct.pack(">H", n)
    else:
        head = bytes([0x80 | opcode, 127 | (0x80 if mask else 0)]) + struct.pack(">Q", n)
    if not mask:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def dns_answer(query):
    """The reply to one DNS query, or None when it is not worth answering."""
    if len(query) < 12:
        return None
    tid, flags, qdcount, _an, _ns, arcount = struct.unpack(">HHHHHH", query[:12])
    if qdcount != 1 or flags & 0x8000:
        return None
    i, labels = 12, []
    while i < len(query) and query[i] != 0:
        n = query[i]
        labels.append(query[i + 1 : i + 1 + n].decode("ascii", "replace").lower())
        i += 1 + n
    i += 1
    if i + 4 > len(query):
        return None
    qtype, _qclass = struct.unpack(">HH", query[i : i + 4])
    question = query[12 : i + 4]
    name = ".".join(labels)
    with open(zone_path) as f:
        ip = json.load(f).get(name)
    with log_lock, open(dns_log_path, "a") as f:
        # arcount: the additional records (EDNS among them) that arrived.
        f.write(json.dumps({"name": name, "qtype": qtype, "answer": ip, "arcount": arcount}) + "\n")
    if ip == "drop":
        return None
    answers, ancount, rcode = b"", 0, 0
    extra, arcount_out = b"", 0
    # A zone value is an address, "drop", or an alias: {"cname": target},
    # {"dname": target} (every name under this one maps under target), with
    # an optional "additional": [name, address] put in the additional
    # section. Aliases are followed as a recursive resolver would,
    # each hop in the answer section; at most 64 hops.
    with open(zone_path) as f:
        zone = json.load(f)
    cur, hops = name, 0
    while isinstance(ip, dict) or ip is None:
        if ip is None:
            # A DNAME at a parent of `cur`?
            owner = next(
                (p for p in (".".join(cur.split(".")[k:]) for k in range(1, cur.count(".") + 1))
                 if isinstance(zone.get(p), dict) and "dname" in zone[p]),
                None,
            )
            if owner is None or hops >= 64:
                break
            target = cur[: -len(owner)] + zone[owner]["dname"]
            cur = cur.lower()
            answers += dns_name(owner) + struct.pack(">HHIH", 39, 1, 5, len(dns_name(zone[owner]["dname"])))
            answers += dns_name(zone[owner]["dname"])
            answers += dns_name(cur) + struct.pack(">HHIH", 5, 1, 5, len(dns_name(target))) + dns_name(target)
            ancount += 2
        elif "cname" in ip:
            if hops >= 64:
                break
            target = ip["cname"]
            answers += dns_name(cur) + struct.pack(">HHIH", 5, 1, 5, len(dns_name(target))) + dns_name(target)
            ancount += 1
            if "additional" in ip:
                owner, addr = ip["additional"]
                extra += dns_name(owner) + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton(addr)
                arcount_out += 1
        else:
            break
        cur, hops = target, hops + 1
        ip = zone.get(cur.lower().rstrip("."))
    if isinstance(ip, str) and ip != "drop" and qtype == 1:
        answers += dns_name(cur) + struct.pack(">HHIH", 1, 1, 5, 4) + socket.inet_aton(ip)
        ancount += 1
    elif ancount == 0:
        rcode = 3  # NXDOMAIN
    header = struct.pack(">HHHHHH", tid, 0x8400 | (flags & 0x0100) | rcode, 1, ancount, 0, arcount_out)
    return header + question + answers + extra


def dns_name(name):
    """`name` in DNS wire format, uncompressed."""
    return b"".join(bytes([len(p)]) + p.encode("ascii") for p in name.split(".") if p) + b"\0"


def serve_dns(sock):
    while True:
        query, client = sock.recvfrom(4096)
        reply = dns_answer(query)
        if reply is not None:
            sock.sendto(reply, client)


dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
dns.bind((addrs[0], 53))
threading.Thread(target=serve_dns, args=(dns,), daemon=True).start()

ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
servers = []
for addr in addrs:
    plain = http.server.ThreadingHTTPServer((addr, 80), Echo)
    tls = http.server.ThreadingHTTPServer((addr, 443), Echo)
    # Handshake in the handler thread, so one stalled client cannot block accept().
    tls.socket = ctx.wrap_socket(tls.socket, server_side=True, do_handshake_on_connect=False)
    servers += [plain, tls]
for server in servers:
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()


def echo_lines(conn):
    with conn, conn.makefile("rwb", buffering=0) as f:
        for line in f:
            f.write(line)


def serve_echo(sock):
    while True:
        conn, _ = sock.accept()
        threading.Thread(target=echo_lines, args=(conn,), daemon=True).start()


for addr in addrs:
    echo = socket.create_server((addr, 7))
    threading.Thread(target=serve_echo, args=(echo,), daemon=True).start()
open(ready_path, "w").close()
threading.Event().wait()
