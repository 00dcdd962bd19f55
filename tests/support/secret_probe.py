"""A guest that keeps its connections open while the host changes secrets,
for tests/e2e_secrets_live.rs: run in a guest namespace with the mitmproxy
venv's python (for `h2`), against tests/support/upstream.py through the
tunnel.

usage: secret_probe.py IP PORT NAME CA

Connects to IP:PORT with NAME for SNI, Host and verification against CA.
Every request is `GET /live/<tag>` carrying the service placeholder
(`x-api-key: ppp-proxy-managed`) and a custom one
(`x-custom: PPP_LIVE_TOKEN`); the upstream's request log shows what ppp
made of them. Commands, one per line on stdin, each answered by one JSON
line on stdout:

  new TAG    a request on a new HTTP/1.1 connection, closed after it
  keep TAG   a request on the one kept-alive HTTP/1.1 connection
  auth TAG   a request on a new connection with the custom placeholder
             as its key (`x-api-key: PPP_LIVE_TOKEN`), nothing else
  h2 TAG     a new stream on the one open HTTP/2 connection
  hammer K   start sending `/race/<n>` back to back, in a thread, on a
             connection of its own: kept-alive HTTP/1.1 (K = keep) or
             HTTP/2 streams (K = h2)
  mark       {"next": n}: every race request from n on starts after
             this line was read
  stop       stop the hammer: {"sent": n}

Answers carry {"status", "port"}: `port` is the client's local port, so
the test can check that `keep` and `h2` really stayed on one connection
(http.client would otherwise reconnect silently). Any failure is
{"error": ...}.
"""

import http.client
import json
import socket
import ssl
import sys
import threading

ip, port, name, ca = sys.argv[1:5]
HEADERS = {"x-api-key": "ppp-proxy-managed", "x-custom": "PPP_LIVE_TOKEN", "host": name}


def context(alpn):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(alpn)
    return ctx


def http1(keep):
    conn = http.client.HTTPSConnection(ip, int(port), timeout=15, context=context(["http/1.1"]))
    # SNI and verification are for NAME, the socket goes to IP.
    conn._create_connection = lambda *a, **k: socket.create_connection((ip, int(port)), timeout=15)
    conn.host = name
    conn.connect()
    if keep:
        conn.auto_open = 0  # a closed connection raises instead of reconnecting
    return conn


def get1(conn, path, close, headers=None):
    headers = dict(headers or HEADERS)
    if close:
        headers["connection"] = "close"
    local = conn.sock.getsockname()[1]
    conn.request("GET", path, headers=headers)
    r = conn.getresponse()
    r.read()
    return {"status": r.status, "port": local}


class H2:
    def __init__(self):
        import h2.config
        import h2.connection

        raw = socket.create_connection((ip, int(port)), timeout=15)
        self.sock = context(["h2"]).wrap_socket(raw, server_hostname=name)
        if self.sock.selected_alpn_protocol() != "h2":
            raise RuntimeError(f"ALPN chose {self.sock.selected_alpn_protocol()}")
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())

    def get(self, path):
        import h2.events

        sid = self.conn.get_next_available_stream_id()
        headers = [(":method", "GET"), (":scheme", "https"), (":authority", name), (":path", path)]
        headers += [(k, v) for k, v in HEADERS.items() if k != "host"]
        self.conn.send_headers(sid, headers, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        status = None
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                raise RuntimeError("the HTTP/2 connection closed")
            for ev in self.conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                    status = int(dict(ev.headers)[":status"])
                elif isinstance(ev, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                elif isinstance(ev, h2.events.StreamReset) and ev.stream_id == sid:
                    raise RuntimeError(f"stream reset: {ev.error_code}")
                elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                    self.sock.sendall(self.conn.data_to_send())
                    return {"status": status, "port": self.sock.getsockname()[1]}
            self.sock.sendall(self.conn.data_to_send())


class Hammer(threading.Thread):
    def __init__(self, kind):
        super().__init__(daemon=True)
        if kind == "h2":
            h2 = H2()
            self.get = h2.get
        else:
            conn = http1(True)
            self.get = lambda path: get1(conn, path, False)
        self.next = 0
        self.error = None
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def run(self):
        try:
            while not self.stopping.is_set():
                with self.lock:
                    n = self.next
                    self.next += 1
                self.get(f"/race/{n}")
        except Exception as e:  # noqa: BLE001 - reported on stop
            self.error = f"{type(e).__name__}: {e}"

    def mark(self):
        with self.lock:
            return self.next


keep = http1(True)
h2c = H2()
hammer = None
for line in sys.stdin:
    cmd, _, tag = line.strip().partition(" ")
    try:
        if cmd == "new":
            out = get1(http1(False), f"/live/{tag}", True)
        elif cmd == "auth":
            # The custom placeholder where an agent puts its key.
            out = get1(http1(False), f"/live/{tag}", True, {"x-api-key": "PPP_LIVE_TOKEN", "host": name})
        elif cmd == "keep":
            out = get1(keep, f"/live/{tag}", False)
        elif cmd == "h2":
            out = h2c.get(f"/live/{tag}")
        elif cmd == "hammer":
            hammer = Hammer(tag or "keep")
            hammer.start()
            out = {"started": True}
        elif cmd == "mark":
            out = {"next": hammer.mark()}
        elif cmd == "stop":
            hammer.stopping.set()
            hammer.join(20)
            out = {"sent": hammer.next, "error": hammer.error}
        else:
            out = {"error": f"unknown command {cmd!r}"}
    except Exception as e:  # noqa: BLE001 - the test reports it
        out = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(out), flush=True)
