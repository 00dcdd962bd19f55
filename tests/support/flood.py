"""What a hostile guest sends, for the flood tests in tests/e2e_daemon.rs.

Runs inside a guest network namespace (through its WireGuard tunnel), with
the test venv's python; prints one JSON object on stdout.

usage:
  flood.py ws IP HOST TOTAL MSG      WebSocket to IP:80 /ws with Host HOST:
                                     TOTAL bytes in binary messages of MSG
                                     bytes, then a text message; prints the
                                     server's answer to it
  flood.py headers IP HOST SIZE N    N HTTP/1.1 requests to IP:80, each with
                                     one SIZE-byte header; prints what came
                                     back for each (status line or "closed")
  flood.py dns IP PORT PREFIX N      N DNS A queries over UDP to IP:PORT for
                                     distinct names PREFIX<i>.flood.test
  flood.py dns-sockets IP PORT PREFIX N
                                     the same, each query from a socket
                                     (source port) of its own, as
                                     getaddrinfo does
  flood.py udp IP PORT SECONDS SIZE  SIZE-byte datagrams to IP:PORT as fast
                                     as they go, for SECONDS
  flood.py conns IP PORT N EXPECT    N idle TCP connections to IP:PORT held
                                     open; waits (up to 60 s) until all but
                                     EXPECT were closed by the other side;
                                     prints how many stayed open, then
                                     closes them and makes one HTTP request
  flood.py slow IP HOST N SECONDS KEEP
                                     slowloris: N TCP connections to IP:80,
                                     each with an unfinished HTTP/1.1
                                     request (Host HOST) and a header line
                                     every few seconds, for SECONDS; KEEP=1
                                     keeps a connection's descriptor open
                                     after the proxy closed it (never
                                     answering its FIN); prints how many the
                                     proxy closed and what a request on a
                                     fresh connection then got
  flood.py agent IP HOST KEEPALIVE STREAMS UPLOAD
                                     what a legitimate agent holds open at
                                     once (HTTP to IP:80, Host HOST):
                                     KEEPALIVE kept-alive connections asked
                                     twice 15 s apart, STREAMS 2 MiB
                                     responses read over ~20 s, one UPLOAD
                                     byte POST; prints each one's statuses
  flood.py held IP HOST TOTAL STALL  a POST to IP:80 with Host HOST and a
                                     chunked body of up to TOTAL bytes, sent
                                     as fast as the connection takes it;
                                     prints {"sent", "stalled"} once TOTAL
                                     went or a send blocked STALL seconds,
                                     then {"reply"}: the status line, or
                                     "closed"
  flood.py h2 IP CA SNI AUTH...      one HTTP/2 connection over TLS to
                                     IP:443 with SNI SNI, one GET per AUTH
                                     (its :authority), in turn, to /h2-<i>;
                                     prints each stream's status and body
"""

import base64
import json
import os
import resource
import select
import socket
import struct
import sys
import time


def ws(ip, host, total, msg):
    s = socket.create_connection((ip, 80), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(
        (
            f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        got = s.recv(4096)
        if not got:
            raise SystemExit(f"no handshake: {head!r}")
        head += got
    if not head.startswith(b"HTTP/1.1 101"):
        raise SystemExit(f"no upgrade: {head!r}")
    # A zero mask key leaves the payload as it is: no per-byte work here.
    frame = struct.pack(">BBQ", 0x82, 0x80 | 127, msg) + b"\0\0\0\0" + bytes(msg)
    sent = 0
    while sent < total:
        s.sendall(frame)
        sent += msg
    text = b"done"
    s.sendall(bytes([0x81, 0x80 | len(text)]) + b"\0\0\0\0" + text)
    buf = head.split(b"\r\n\r\n", 1)[1]
    while len(buf) < 2 or len(buf) < 2 + (buf[1] & 0x7F):
        got = s.recv(65536)
        if not got:
            raise SystemExit(f"closed before the answer: {buf!r}")
        buf += got
    reply = json.loads(buf[2 : 2 + (buf[1] & 0x7F)])
    return {"sent": sent, "reply": reply}


def headers(ip, host, size, n):
    results = []
    for i in range(n):
        s = socket.create_connection((ip, 80), timeout=30)
        s.setblocking(False)
        req = memoryview(f"GET /big-headers-{i} HTTP/1.1\r\nHost: {host}\r\nX-Big: ".encode() + b"h" * size + b"\r\n\r\n")
        got = b""
        # Send while reading: the proxy may answer and close long before it
        # read everything (its userspace TCP then stops reading, it does
        # not reset), so a blocking send would wait forever.
        while b"\r\n" not in got:
            readable, writable, _ = select.select([s], [s] if req else [], [], 10)
            if not readable and not writable:
                break  # stalled: nothing more is read or answered
            if readable:
                try:
                    part = s.recv(4096)
                except OSError:
                    break
                if not part:
                    break
                got += part
            elif writable:
                try:
                    req = req[s.send(req[: 1 << 16]) :]
                except BlockingIOError:
                    pass
                except OSError:
                    req = req[:0]
        results.append(got.split(b"\r\n", 1)[0].decode("latin-1") if got else "closed")
        s.close()
    return {"results": results}


def dns(ip, port, prefix, n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    sent = 0
    for i in range(n):
        name = f"{prefix}{i}.flood.test"
        q = struct.pack(">HHHHHH", i & 0xFFFF, 0x0100, 1, 0, 0, 0)
        q += b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0"
        q += struct.pack(">HH", 1, 1)
        while True:
            try:
                s.sendto(q, (ip, port))
                break
            except BlockingIOError:
                time.sleep(0.001)
        sent += 1
        try:
            while True:
                s.recv(4096)  # drain answers, not needed
        except BlockingIOError:
            pass
        if i % 200 == 199:
            time.sleep(0.05)  # ~4,000 a second: a flood, not a tunnel overrun
    return {"sent": sent}


def dns_sockets(ip, port, prefix, n):
    """`dns`, but a new socket for each name: a new UDP connection each for
    the proxy. Closed after its answer (or 0.2 s), so the guest's own
    descriptors stay few."""
    sent = answered = 0
    for i in range(n):
        name = f"{prefix}{i}.flood.test"
        q = struct.pack(">HHHHHH", i & 0xFFFF, 0x0100, 1, 0, 0, 0)
        q += b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0"
        q += struct.pack(">HH", 1, 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(0.2)
        s.sendto(q, (ip, port))
        sent += 1
        try:
            s.recv(4096)
            answered += 1
        except OSError:
            pass
        s.close()
    return {"sent": sent, "answered": answered}


def udp(ip, port, seconds, size):
    """Datagrams of `size` bytes to ip:port as fast as the guest can send,
    for `seconds`: more than the proxy's one Python loop can read."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    payload = b"\x00" * size
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            s.sendto(payload, (ip, port))
            sent += 1
        except BlockingIOError:
            time.sleep(0.0005)
        try:
            while True:
                s.recv(4096)
        except BlockingIOError:
            pass
    return {"sent": sent}


def conns(ip, port, n, expect):
    """Open `n` TCP connections and send nothing, as a guest hoarding the
    proxy's connections would; count those the proxy closes."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 256)), hard))
    socks, failed = [], 0
    for _ in range(n):
        s = socket.socket()
        s.settimeout(10)
        try:
            s.connect((ip, port))
            socks.append(s)
        except OSError:
            failed += 1
            s.close()
    open_ = {s.fileno(): s for s in socks}
    poll = select.poll()  # select() stops at descriptor 1023
    for fd in open_:
        poll.register(fd, select.POLLIN)
    closed = 0
    end = time.monotonic() + 60
    while len(open_) > expect and time.monotonic() < end:
        for fd, _ in poll.poll(1000):
            poll.unregister(fd)
            try:
                data = open_[fd].recv(1)
            except OSError:
                data = b""
            if not data:
                open_.pop(fd).close()
                closed += 1
    held = len(open_)
    for s in open_.values():
        s.close()
    # Room again: one request on a fresh connection.
    time.sleep(1)
    s = socket.create_connection((ip, port), timeout=10)
    s.sendall(f"GET /after-hoarding HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n".encode())
    answer = b""
    while chunk := s.recv(4096):
        answer += chunk
    s.close()
    return {"failed": failed, "closed": closed, "held": held, "after": answer.split(b"\r\n", 1)[0].decode()}

def slow(ip, host, n, seconds, keep):
    """Slowloris: requests whose headers never end, each connection fed a
    header line every few seconds so that no idle timeout closes it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 256)), hard))
    socks, failed = {}, 0
    poll = select.poll()  # select() stops at descriptor 1023
    for i in range(n):
        s = socket.socket()
        s.settimeout(10)
        try:
            s.connect((ip, 80))
            s.sendall(f"GET /slow-{i} HTTP/1.1\r\nHost: {host}\r\n".encode())
        except OSError:
            failed += 1
            s.close()
            continue
        s.setblocking(False)
        socks[s.fileno()] = s
        poll.register(s.fileno(), select.POLLIN)
    # For a test that must act only once every connection is open (a fixed
    # sleep raced a slow machine's opening burst).
    print(f"opened {len(socks)}", file=sys.stderr, flush=True)
    closed = set()
    end = time.monotonic() + seconds
    next_line = time.monotonic() + 3
    while time.monotonic() < end:
        for fd, _ in poll.poll(500):
            try:
                data = socks[fd].recv(4096)
            except OSError:
                data = b""
            if not data:
                poll.unregister(fd)
                closed.add(fd)
        if time.monotonic() >= next_line:
            next_line = time.monotonic() + 3
            for fd, s in socks.items():
                if fd not in closed:
                    try:
                        s.send(b"X-a: b\r\n")
                    except OSError:
                        pass
        if not keep:
            for fd in closed & socks.keys():
                socks.pop(fd).close()
    still = len([fd for fd in socks if fd not in closed])
    # A request on a fresh connection, while the held ones are still open.
    try:
        c = socket.create_connection((ip, 80), timeout=20)
        c.sendall(f"GET /after-slowloris HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := c.recv(4096):
            answer += chunk
        c.close()
        after = answer.split(b"\r\n", 1)[0].decode("latin-1") or "closed"
    except OSError as e:
        after = f"error: {e}"
    for s in socks.values():
        s.close()
    return {"failed": failed, "closed": len(closed), "open": still, "after": after}



def agent(ip, host, keepalive, streams, upload):
    """What a legitimate agent keeps open at once: `keepalive` kept-alive
    connections, each asked again after a pause; `streams` long responses
    read slowly (as an SSE stream is); one upload of `upload` bytes."""
    import http.client
    import threading

    out = {"keepalive": [], "streams": [], "upload": None}
    lock = threading.Lock()

    def keep(i):
        c = http.client.HTTPConnection(ip, 80, timeout=60)
        codes = []
        for round_ in range(2):
            c.request("GET", f"/keepalive-{i}-{round_}", headers={"Host": host})
            r = c.getresponse()
            r.read()
            codes.append(r.status)
            if round_ == 0:
                time.sleep(15)
        c.close()
        with lock:
            out["keepalive"].append(codes)

    def stream(i, size=2 << 20):
        c = http.client.HTTPConnection(ip, 80, timeout=60)
        c.request("GET", f"/chunked/{size}", headers={"Host": host})
        r = c.getresponse()
        got = 0
        while chunk := r.read(64 << 10):
            got += len(chunk)
            time.sleep(0.5)  # ~20 s for 2 MiB
        c.close()
        with lock:
            out["streams"].append([r.status, got == size])

    def up():
        c = http.client.HTTPConnection(ip, 80, timeout=120)
        c.request("POST", "/upload", body=bytes(upload), headers={"Host": host})
        r = c.getresponse()
        body = json.loads(r.read() or b"{}")
        out["upload"] = [r.status, body.get("body_bytes") == upload]

    threads = [threading.Thread(target=keep, args=(i,)) for i in range(keepalive)]
    threads += [threading.Thread(target=stream, args=(i,)) for i in range(streams)]
    threads.append(threading.Thread(target=up))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def held(ip, host, total, stall):
    """Headers an `ask` default holds, then the body behind them, pushed
    while the user has not answered: what mitmdump reads of it meanwhile it
    would have to keep."""
    s = socket.create_connection((ip, 80), timeout=30)
    s.sendall(f"POST /held-body HTTP/1.1\r\nHost: {host}\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
    size = 1 << 20
    chunk = b"%x\r\n" % size + bytes(size) + b"\r\n"
    s.settimeout(stall)
    sent, stalled = 0, False
    while sent < total:
        try:
            s.sendall(chunk)
        except TimeoutError:
            stalled = True
            break
        sent += size
    print(json.dumps({"sent": sent, "stalled": stalled}), flush=True)
    s.settimeout(120)
    got = b""
    try:
        while b"\r\n" not in got:
            more = s.recv(4096)
            if not more:
                break
            got += more
    except OSError:
        pass
    return {"reply": got.split(b"\r\n", 1)[0].decode("latin-1") if b"\r\n" in got else "closed"}


def h2(ip, ca, sni, auths):
    """HTTP/2 connection coalescing, as the guest would try it: the first
    stream names the host the connection was made for, the next ones
    another host on the same connection."""
    import ssl

    import h2.config
    import h2.connection
    import h2.events

    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["h2"])
    s = ctx.wrap_socket(socket.create_connection((ip, 443), timeout=30), server_hostname=sni)
    if s.selected_alpn_protocol() != "h2":
        raise SystemExit(f"no h2: {s.selected_alpn_protocol()}")
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    c.initiate_connection()
    s.sendall(c.data_to_send())
    out = []
    for i, auth in enumerate(auths):
        sid = 2 * i + 1
        headers = [(":method", "GET"), (":scheme", "https"), (":authority", auth), (":path", f"/h2-{i}")]
        c.send_headers(sid, headers, end_stream=True)
        s.sendall(c.data_to_send())
        status, body, done = None, b"", False
        while not done:
            data = s.recv(65536)
            if not data:
                break
            for ev in c.receive_data(data):
                if getattr(ev, "stream_id", None) != sid:
                    continue
                if isinstance(ev, h2.events.ResponseReceived):
                    status = dict(ev.headers)[b":status"].decode()
                elif isinstance(ev, h2.events.DataReceived):
                    body += ev.data
                    c.acknowledge_received_data(ev.flow_controlled_length, sid)
                elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                    done = True
            s.sendall(c.data_to_send())
        out.append({"authority": auth, "status": status, "body": body.decode("utf-8", "replace")})
    return out


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "ws":
        out = ws(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "headers":
        out = headers(args[0], args[1], int(args[2]), int(args[3]))
    elif cmd == "dns":
        out = dns(args[0], int(args[1]), args[2], int(args[3]))
    elif cmd == "dns-sockets":
        out = dns_sockets(args[0], int(args[1]), args[2], int(args[3]))
    elif cmd == "udp":
        out = udp(args[0], int(args[1]), float(args[2]), int(args[3]))
    elif cmd == "conns":
        out = conns(args[0], int(args[1]), int(args[2]), int(args[3]))
    elif cmd == "h2":
        out = h2(args[0], args[1], args[2], args[3:])
    elif cmd == "slow":
        out = slow(args[0], args[1], int(args[2]), float(args[3]), args[4] == "1")
    elif cmd == "agent":
        out = agent(args[0], args[1], int(args[2]), int(args[3]), int(args[4]))
    elif cmd == "held":
        out = held(args[0], args[1], int(args[2]), float(args[3]))
    else:
        raise SystemExit(__doc__)
    print(json.dumps(out))


main()
