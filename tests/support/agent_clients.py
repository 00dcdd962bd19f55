"""What an agent does on the wire, for tests/e2e_daemon.rs: run in a guest
namespace with the mitmproxy venv's python (for `h2`), against
tests/support/agent_servers.py, through whatever tunnel the guest has.

Every mode connects to IP:PORT, with NAME for SNI, Host and verification
against CA, sends `x-api-key: ppp-proxy-managed` (the placeholder ppp
swaps for the key), and prints one JSON object.

  sse IP PORT NAME CA PATH
      HTTP/1.1 GET of a /sse-ticks stream; for each `data: <ns>` event,
      the time from the server's write (its time.monotonic_ns(), the clock
      every namespace shares) to the moment it was read here:
      {"lat_ms": [...]}.
  sse-post IP PORT NAME CA PATH
      The same for a POST (a small Messages request body) whose stream's
      events carry the write time as their delta's text (agent_servers'
      /v1/messages): {"lat_ms": [...]}.
  h2-get IP PORT NAME CA PATH
      One HTTP/2 GET: {"alpn", "status", "body"}.
  h2-bidi IP PORT NAME CA N
      A gRPC-style bidirectional stream to /bidi: N length-prefixed
      messages, each sent only once the echo of the one before came back,
      with the request still open; then the end of the request, and the
      trailers: {"alpn", "status", "echoes", "trailers", "headers"}. A
      proxy that holds the request until it ends, or the response until it
      ends, never echoes message 1: that is reported as
      {"error": ...} (exit 1) after 15 s.
  ws IP PORT NAME CA UP DOWN
      A WebSocket on plain HTTP (CA unused) to tests/support/upstream.py's
      /ws: a ping and its pong, UP bytes up and DOWN bytes down, each one
      message: {"pong", "up", "down", "echo"}.
  h2-hog IP PORT NAME CA TOTAL SECONDS
      The attack on the proxy's HTTP/2 buffers: a /bidi stream whose
      receive window this side keeps at 0, while TOTAL bytes go up as fast
      as the proxy takes them, for at most SECONDS: {"sent"} (and "error"
      if cut off).
"""

import json
import re
import socket
import ssl
import sys
import time

mode, ip, port, name, ca = sys.argv[1:6]
rest = sys.argv[6:]


def connect(alpn):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(alpn)
    raw = socket.create_connection((ip, int(port)), timeout=15)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return ctx.wrap_socket(raw, server_hostname=name)


def sse(path, post=False):
    s = connect(["http/1.1"])
    body = b'{"model":"claude-bench","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}'
    method = "POST" if post else "GET"
    extra = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if post else ""
    s.sendall(
        (
            f"{method} {path} HTTP/1.1\r\nHost: {name}\r\nAccept: text/event-stream\r\n{extra}"
            "x-api-key: ppp-proxy-managed\r\nConnection: close\r\n\r\n"
        ).encode()
        + (body if post else b"")
    )
    s.settimeout(30)
    # The body is decoded chunk by chunk: a proxy may re-chunk it, so that
    # an event spans two chunks.
    raw, body, lat, head, state, left = b"", b"", [], None, "head", 0
    event = re.compile(rb'"text":"(\d+)"' if post else rb"data: (\d+)\n\n")
    while state != "done":
        data = s.recv(1 << 16)
        now = time.monotonic_ns()
        if not data:
            break
        raw += data
        while True:
            if state == "head":
                end = raw.find(b"\r\n\r\n")
                if end < 0:
                    break
                head, raw = raw[:end].decode("latin-1"), raw[end + 4 :]
                if "chunked" not in head.lower():
                    sys.exit(f"not a chunked response: {head!r}")
                state = "size"
            elif state == "size":
                end = raw.find(b"\r\n")
                if end < 0:
                    break
                left, raw = int(raw[:end].split(b";")[0], 16), raw[end + 2 :]
                state = "data" if left else "done"
            elif state == "data":
                take = raw[:left]
                body, raw, left = body + take, raw[len(take) :], left - len(take)
                if left:
                    break
                state = "crlf"
            elif state == "crlf":
                if len(raw) < 2:
                    break
                raw, state = raw[2:], "size"
            else:
                break
        last = 0
        for m in event.finditer(body):
            lat.append((now - int(m.group(1))) / 1e6)
            last = m.end()
        body = body[last:]
    print(json.dumps({"lat_ms": lat, "head": (head or "").split("\r\n", 1)[0]}))


def h2conn():
    import h2.config
    import h2.connection

    s = connect(["h2"])
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    s.sendall(conn.data_to_send())
    return s, conn


def h2_get(path):
    import h2.events

    s, conn = h2conn()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(
        sid,
        [(":method", "GET"), (":scheme", "https"), (":authority", name), (":path", path),
         ("x-api-key", "ppp-proxy-managed")],
        end_stream=True,
    )
    s.sendall(conn.data_to_send())
    status, body, done = None, b"", False
    while not done:
        data = s.recv(1 << 16)
        if not data:
            break
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                status = dict(ev.headers).get(":status")
            elif isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                body += ev.data
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                done = True
        s.sendall(conn.data_to_send())
    print(json.dumps({"alpn": s.selected_alpn_protocol(), "status": status, "body": body.decode("utf-8", "replace")}))


def h2_bidi(n):
    import h2.events

    s, conn = h2conn()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(
        sid,
        [(":method", "POST"), (":scheme", "https"), (":authority", name), (":path", "/bidi"),
         ("content-type", "application/grpc"), ("te", "trailers"), ("x-api-key", "ppp-proxy-managed")],
    )
    s.sendall(conn.data_to_send())
    out = {"alpn": s.selected_alpn_protocol(), "status": None, "echoes": [], "trailers": {}, "headers": {}}
    buf, ended = b"", False

    def pump():
        nonlocal buf, ended
        data = s.recv(1 << 16)
        if not data:
            raise EOFError("the proxy closed the connection")
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                out["headers"] = dict(ev.headers)
                out["status"] = out["headers"].get(":status")
            elif isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                buf += ev.data
                while len(buf) >= 5 and len(buf) >= 5 + int.from_bytes(buf[1:5], "big"):
                    size = int.from_bytes(buf[1:5], "big")
                    out["echoes"].append(buf[5 : 5 + size].decode())
                    buf = buf[5 + size :]
            elif isinstance(ev, h2.events.TrailersReceived):
                out["trailers"] = dict(ev.headers)
            elif isinstance(ev, h2.events.StreamEnded):
                ended = True
            elif isinstance(ev, h2.events.StreamReset):
                raise EOFError(f"stream reset, code {ev.error_code}")
        s.sendall(conn.data_to_send())

    try:
        for i in range(1, n + 1):
            msg = f"ping {i}".encode()
            conn.send_data(sid, b"\0" + len(msg).to_bytes(4, "big") + msg)
            s.sendall(conn.data_to_send())
            while len(out["echoes"]) < i:
                pump()
        conn.end_stream(sid)
        s.sendall(conn.data_to_send())
        while not ended:
            pump()
    except (OSError, EOFError) as e:
        out["error"] = f"after {len(out['echoes'])} echoes of {n}: {type(e).__name__}: {e}"
        print(json.dumps(out))
        sys.exit(1)
    print(json.dumps(out))


def h2_hog(total, seconds):
    """The attack on the proxy's HTTP/2 buffers: a /bidi stream with this
    side's receive window at 0, so that nothing the upstream echoes may be
    sent here, while TOTAL bytes go up as fast as the proxy takes them."""
    import h2.settings

    s, conn = h2conn()
    conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    sid = conn.get_next_available_stream_id()
    conn.send_headers(
        sid,
        [(":method", "POST"), (":scheme", "https"), (":authority", name), (":path", "/bidi"),
         ("content-type", "application/grpc")],
    )
    s.sendall(conn.data_to_send())
    s.setblocking(False)
    chunk = b"\0" * 16384
    sent = 0
    end = time.monotonic() + seconds
    got = 0
    try:
        while sent < total and time.monotonic() < end:
            # Read all that came (so TCP never pushes back on the proxy)
            # and acknowledge none of it: the window stays at 0.
            while True:
                try:
                    data = s.recv(1 << 16)
                except (BlockingIOError, ssl.SSLWantReadError):
                    break
                if not data:
                    raise EOFError("the proxy closed the connection")
                got += len(data)
                conn.receive_data(data)
            if conn.local_flow_control_window(sid) < len(chunk):
                time.sleep(0.001)
                continue
            conn.send_data(sid, chunk)
            out = conn.data_to_send()
            while out and time.monotonic() < end:
                try:
                    n = s.send(out)
                    out = out[n:]
                    sent += n
                except (BlockingIOError, ssl.SSLWantWriteError):
                    time.sleep(0.001)
    except (OSError, EOFError) as e:
        print(json.dumps({"sent": sent, "got": got, "error": f"{type(e).__name__}: {e}"}))
        return
    print(json.dumps({"sent": sent, "got": got}))


def ws(up, down):
    """A WebSocket session as an agent's remote control has it: a ping
    answered by a pong, a binary message of UP bytes to the server, a text
    asking for DOWN bytes back, which arrive as one binary message, then
    the server's JSON echo: {"pong", "up", "down", "echo"}."""
    import base64
    import os
    import struct

    s = socket.create_connection((ip, int(port)), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        (
            f"GET /ws HTTP/1.1\r\nHost: {name}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    buf = b""
    while b"\r\n\r\n" not in buf:
        got = s.recv(4096)
        if not got:
            sys.exit(f"no handshake: {buf!r}")
        buf += got
    head, buf = buf.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 101"):
        sys.exit(f"no upgrade: {head!r}")

    def send(opcode, payload):
        n = len(payload)
        size = bytes([0x80 | n]) if n < 126 else (bytes([0x80 | 126]) + struct.pack(">H", n) if n < 65536
                                                  else bytes([0x80 | 127]) + struct.pack(">Q", n))
        s.sendall(bytes([0x80 | opcode]) + size + b"\0\0\0\0" + payload)  # zero mask key

    def frame():
        nonlocal buf

        def need(k):
            nonlocal buf
            while len(buf) < k:
                got = s.recv(1 << 20)
                if not got:
                    sys.exit("closed mid-frame")
                buf += got

        need(2)
        opcode, n, at = buf[0] & 0x0F, buf[1] & 0x7F, 2
        if n == 126:
            need(4)
            n, at = struct.unpack(">H", buf[2:4])[0], 4
        elif n == 127:
            need(10)
            n, at = struct.unpack(">Q", buf[2:10])[0], 10
        need(at + n)
        payload, buf = buf[at : at + n], buf[at + n :]
        return opcode, payload

    out = {}
    send(9, b"are you there")
    op, payload = frame()
    out["pong"] = payload.decode() if op == 10 else f"opcode {op}"
    send(2, bytes(up))
    send(1, f"big {down}".encode())
    op, payload = frame()
    out["down"] = len(payload) if op == 2 else f"opcode {op}"
    op, payload = frame()
    out["echo"] = json.loads(payload) if op == 1 else f"opcode {op}"
    out["up"] = up
    print(json.dumps(out))


if mode == "sse":
    sse(rest[0])
elif mode == "sse-post":
    sse(rest[0], post=True)
elif mode == "h2-get":
    h2_get(rest[0])
elif mode == "h2-bidi":
    h2_bidi(int(rest[0]))
elif mode == "h2-hog":
    h2_hog(int(rest[0]), float(rest[1]))
elif mode == "ws":
    ws(int(rest[0]), int(rest[1]))
else:
    sys.exit(f"unknown mode {mode}")
