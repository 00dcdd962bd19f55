"""ppp's mitmproxy addon: egress policy and secret injection for sandboxes.

Every guest reaches mitmdump over WireGuard, one server (UDP port) per
sandbox. This addon:

* names the sandbox from the WireGuard server's listen port, looked up in
  `$PPP_DATA/port-registry.json` (never from the peer address);
* asks the ppp daemon (`$PPP_DATA/secret.sock`, NDJSON) for every decision
  and caches the answer per (sandbox, host, ip, port) until the daemon's
  generation changes; there is no matching logic here;
* fails closed: an unknown port, a daemon that does not answer, or any
  error inside a hook denies the flow;
* injects API keys and custom placeholders the daemon hands out, only into
  requests the policy allowed;
* appends one JSON line per flow to `$PPP_DATA/flows.jsonl`, never with a
  secret value in it;
* keeps mitmdump's WireGuard servers in line with the claimed ports: when
  the daemon's generation moves it asks for the `modes` list and applies it,
  so a sandbox gains or loses its server without a restart;
* records when each server last carried a connection in
  `$PPP_DATA/tunnels.json`, for `ppp daemon status`.

See docs/addon.md for how each kind of denial is enforced.
"""

# No `from __future__ import annotations`: mitmproxy loads scripts without
# registering them in sys.modules, and dataclasses then cannot resolve string
# annotations.
import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import ipaddress
import inspect
import itertools
import json
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mitmproxy import addonmanager, connection, ctx, dns, http, tcp, tls, udp
from mitmproxy import flow as mitm_flow
from mitmproxy import exceptions as mitm_exceptions
from mitmproxy.net.dns import response_codes
from mitmproxy.proxy import commands, mode_servers, mode_specs, server_hooks
from mitmproxy.proxy import events as proxy_events
from mitmproxy.proxy import server as proxy_server
from mitmproxy.proxy.layers import dns as dns_layer
from mitmproxy.proxy.layers import http as http_layer
from mitmproxy.proxy.layers import websocket as ws_layer
from mitmproxy.proxy.layers.http import _http1

_log = logging.getLogger("ppp")


class _SafeLog:
    """`logging` that never raises into a hook: a failing handler (mitmproxy's
    forwards records to its event loop) must not turn a denial into a crash."""

    @staticmethod
    def _emit(level: int, msg: str, args: tuple[Any, ...], exc_info: bool = False) -> None:
        try:
            if _log.isEnabledFor(level):
                _log.log(level, msg, *args, exc_info=exc_info)
        except Exception:  # noqa: BLE001
            pass

    def debug(self, msg: str, *args: Any) -> None:
        self._emit(logging.DEBUG, msg, args)

    def info(self, msg: str, *args: Any) -> None:
        self._emit(logging.INFO, msg, args)

    def warning(self, msg: str, *args: Any) -> None:
        self._emit(logging.WARNING, msg, args)

    def exception(self, msg: str, *args: Any) -> None:
        self._emit(logging.ERROR, msg, args, exc_info=True)


log = _SafeLog()

# How often the daemon's generation is asked over the socket (seconds). The
# background task does it, off the request path; a hook only asks itself
# when no answer is newer than GENERATION_POLL_HOOK (no task running, as in
# tests, or a daemon that did not answer). Either way the generation file
# is checked before every cached answer.
GENERATION_POLL = 1.0
GENERATION_POLL_HOOK = 3.0
# How long a secret may be cached (seconds); dropped earlier on a new generation.
SECRET_TTL = 60.0
# How often the background task checks for new WireGuard servers and saves
# tunnel activity (seconds).
WATCH_INTERVAL = 0.2
# How often the open flows.jsonl is checked against its path (seconds).
FLOW_LOG_RECHECK = 1.0
# Tunnel activity is saved at most this often (seconds).
TUNNELS_WRITE_EVERY = 1.0
# Timeout of one daemon round trip (seconds).
DAEMON_TIMEOUT = 2.0
# The largest HTTP/1 header block (request line or status line included)
# mitmproxy may buffer: past it the client gets 431 (a server's response
# 502) and the connection is closed. mitmproxy 12.2.3 has no such limit for
# HTTP/1 ("FIXME: protect against header size DoS" in _http1.py); HTTP/2's
# is h2's 64 KiB default header list size. See docs/adr/0019.
MAX_HEADER_BYTES = 64 * 1024
# The largest request body mitmproxy may buffer for a request ppp refused at
# requestheaders (403, 413, 431, 503). mitmproxy only sends a response once
# it read the whole request, so a larger (or chunked) body gets the
# connection closed instead: answering would mean buffering what the guest
# chose to send.
REFUSED_BODY_DRAIN = 64 * 1024
# The largest WebSocket message mitmproxy may reassemble: its WebSocket
# layer holds a message whole until its last frame.
MAX_WS_MESSAGE = 16 * 1024 * 1024
# Size at which flows.jsonl is rotated to flows.jsonl.1 (one old file kept).
FLOW_LOG_MAX = 32 * 1024 * 1024
# The longest request path written to flows.jsonl, in characters: a guest
# chooses its paths, and one line must stay small enough for a reader to
# hold whole (`ppp policy log -f`, the TUI).
MAX_LOGGED_PATH = 1024
# A denial (a refused DNS query, a refused connection or request) is logged
# once per (sandbox, kind, name, port) per window, and at most LOG_BUDGET
# denials per sandbox per window; the rest are counted, and the count is
# carried by the sandbox's next line that is logged.
LOG_WINDOW = 60.0
LOG_BUDGET = 120
# Sharing mitmdump's one event loop between sandboxes (docs/adr/0020).
# Each sandbox's work on the loop (its connections' events and hooks) is
# timed; a sandbox counts as active for LOOP_ACTIVE seconds after its last
# work. While another sandbox is active, the one that used the most loop
# time lately (an average with time constant LOOP_TAU seconds) waits, before
# its connections read again, LOOP_YIELD times the time its work took, so a
# flood gets at most 1 / (1 + LOOP_YIELD) of the loop and another sandbox's
# requests find it mostly free. Alone, a sandbox is never held back.
LOOP_ACTIVE = 0.25
LOOP_TAU = 0.5
LOOP_YIELD = 2.0
# The longest single wait, so that a stale debt never stalls a connection.
LOOP_MAX_WAIT = 0.1
# The most one event or hook is charged: a hook's time is its wall time,
# which for a hook that waits (an intercepted or held flow) is not loop time.
LOOP_MAX_CHARGE = 0.05
# Entries kept in each bounded cache (decisions, secrets, log throttles).
CACHE_MAX = 4096
# Names a DNS answer may go through (CNAME, DNAME) besides the one asked;
# past it the answer is refused. The daemon's MAX_CHAIN.
CHAIN_MAX = 16
# A request held for approval waits on its own daemon connection; the daemon
# ends the wait first (its approval timeout is at most an hour).
HOLD_LIMIT = 3700.0
# Requests one sandbox may have held at once; the daemon bounds its queue
# too, this keeps the connections to it bounded.
HOLD_MAX = 512
# A decision not in the cache is asked in a worker thread, so that a host
# lookup in the daemon (up to 750 ms for a name that does not answer) stalls
# only the flow that needs it, not every sandbox's traffic on the loop.
# Threads (each with its own daemon connection):
DECIDE_THREADS = 16
# Decisions one sandbox may have in those threads at once: fewer than the
# threads, so one sandbox's slow names never take every thread; its others
# wait their turn on the loop (a coroutine each).
DECIDE_RUNNING = 4
# Decisions one sandbox, and all together, may have waiting at once; past
# either, a new one is denied at once, as HOLD_MAX denies a hold.
DECIDE_MAX = 512
DECIDE_TOTAL_MAX = 4096
# Times a decision is asked again when the policy changed while it was
# asked (its answer may be the old policy's); then it is denied.
DECIDE_TRIES = 3
# The longest hold reply read (a decision is a few hundred bytes).
HOLD_REPLY_MAX = 64 * 1024
# DNS queries one DNS connection may have waiting for the upstream's
# answer. mitmproxy 12.2.3's DNSLayer keeps every query's flow in
# `flows` (by message id) for as long as the connection lives, answered or
# not: a guest sending distinct names on one socket grew mitmdump by about
# 1.5 KB a name (issue 22, point 3). Answered flows are dropped at once;
# past this many unanswered ones, the oldest is forgotten (its client has
# long given up: resolvers wait about 5 s).
DNS_PENDING_MAX = 256
# Seconds a UDP DNS connection stays open once every query on it was
# answered. mitmproxy keeps a UDP connection 20 s after its last datagram
# (`UDP_TIMEOUT`), each with its handler, layers, tasks and flow: a guest
# that sends every name from a new socket (as getaddrinfo does) kept up to
# the 1,024-connection cap alive, and their reference cycles waited for a
# full collection, so mitmdump grew ~5 KB a name and did not give it back
# (issue 22, point 3). A stub resolver that reuses its socket sends the
# next query within milliseconds of an answer (glibc's `single-request`
# sends AAAA after the A answer) or after a timeout with its query still
# unanswered (the connection then stays: nothing closes while a query
# waits). mitmproxy_rs drops datagrams on a closed 4-tuple for 60 s either
# way, as it does after mitmproxy's own 20 s timeout.
DNS_UDP_LINGER = 0.5
# Client connections remembered as denied (dropped on disconnect anyway).
DENIED_MAX = 16384
# Client connections one sandbox may hold open at once, per transport (TCP,
# UDP). mitmproxy keeps an idle TCP connection for 10 minutes
# (`tcp_timeout`) and a UDP one for 20 s, each with its handler, buffers and
# perhaps an upstream socket from mitmdump's one descriptor table: without
# a bound a guest could open connections until mitmdump runs out of memory
# or descriptors for every sandbox. Agents' tools use far fewer (npm 15 per
# registry, pip 10, a browser about 256). Past it, the new connection is
# closed at once and the denial logged.
MAX_CONNECTIONS = 1024
# TCP client connections one sandbox may hold with no upstream connection
# behind them: a request whose headers never end (slowloris), a TLS
# handshake left half done, an idle connection whose upstream went away.
# mitmproxy keeps one 10 minutes, with its handler, layers and buffered
# bytes in Python and mitmproxy_rs's two 64 KiB smoltcp buffers: 1,024 of
# them grew mitmdump by ~72 MiB (issue 22, point 4). With those buffers
# mapped on their own (`MALLOC_MMAP_THRESHOLD_`, src/proxy/mitmdump.rs)
# one costs about 32 KiB (docs/benchmarks.md). Past this many, the one
# held longest is closed, so a new connection always gets its turn and
# the sandbox's held connections stay well under 32 MiB. Connections with an
# upstream (a request or stream in flight, keep-alive to a service, an
# SSE stream, an upload) are not held and never closed for this.
HELD_MAX = 256
# A closed connection takes a while to go: under a burst of new ones the
# loop gets to the closed handlers late, and a guest opening connections
# faster than that had 1,024 alive at once all the same. Held connections
# and those closed for HELD_MAX but not yet gone together stay under
# this; past it a new TCP connection is closed at once, as past
# MAX_CONNECTIONS, until the closed ones are gone.
HELD_LIVE_MAX = 2 * HELD_MAX
# Headers a client may use to carry its own credentials; removed before ppp
# injects a key so the guest's dummy key never reaches the service.
AUTH_HEADERS = ("authorization", "x-api-key", "x-goog-api-key", "proxy-authorization")
_AUTH_BYTES = frozenset(h.encode() for h in AUTH_HEADERS)
# The one host this addon answers itself: provisioning fetches the CA from
# http://mitm.it/cert/pem through the tunnel, and verification fetches it
# over HTTPS to prove the CA is trusted. Nothing for it ever goes upstream
# (connection_strategy=lazy and a response set here), so it needs no egress
# policy, and it works with no DNS and no internet.
LOCAL_HOST = "mitm.it"


_MISSING = object()
_od_get = collections.OrderedDict.get


class Lru(collections.OrderedDict):  # type: ignore[type-arg]
    """A dict that keeps at most `maxsize` entries, dropping the least
    recently used: every key a guest can choose (host names, DNS names,
    connection ids) lands in one of these, so none may grow without bound."""

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.maxsize = maxsize

    def get(self, key: Any, default: Any = None) -> Any:
        # The C lookup, not self[key]: a miss (a client connection that was
        # never denied, on every request) raises no KeyError.
        value = _od_get(self, key, _MISSING)
        if value is _MISSING:
            return default
        self.move_to_end(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.maxsize:
            self.popitem(last=False)


class DaemonError(Exception):
    """The daemon could not be asked, or answered with an error."""


@dataclass(frozen=True)
class Verdict:
    allow: bool
    rule_id: str | None = None
    resource: str | None = None
    # Why, in words, for the 403 body and the log.
    reason: str = ""
    generation: int | None = None
    # What the user would allow to let this flow through, when it is not the
    # host: the internal address of a DNS-rebinding refusal.
    allow_target: str | None = None
    # What kind of refusal, for the 403's words and hint: "policy" (a rule or
    # the default: allowing the host helps), "address" (an internal address
    # needs its own rule), "unresolved" (the name does not resolve to the
    # address), "mismatch" (SNI, Host and target disagree), "daemon" (fail
    # closed), "internal" (an error inside the addon).
    kind: str = "policy"
    # Decided at the TLS ClientHello, for every request inside: the SNI it
    # was about, which the 403 names (the request's Host may differ).
    tls: bool = False
    sni: str | None = None
    # The body-size limits of an allowed flow, as the daemon decided them:
    # {"upload": {"bytes": N | None, "from": "rule|sandbox|global|default"},
    #  "download": {...}}.
    limits: Any = None
    # For a flow that was held: how its wait ended ("allowed", "denied",
    # "timeout", "full", "policy").
    approval: str | None = None
    # The names the flow's name resolved through (CNAME, DNAME), as the
    # daemon judged them; logged with the flow.
    chain: tuple[str, ...] = ()
    # The destination is one of the host's own addresses (the daemon's
    # `local`): logged, so `ppp policy replay` re-decides it as internal.
    local: bool = False


def deny(reason: str, kind: str = "internal") -> Verdict:
    return Verdict(allow=False, reason=reason, kind=kind)


# A daemon that could not be asked: nothing to allow, the fix is on the host.
DAEMON_DOWN = Verdict(
    allow=False, reason="the ppp daemon did not answer, so ppp fails closed", kind="daemon"
)
# ppp's resolver inside the tunnel; DNS to any other server is refused.
TUNNEL_DNS = ("10.0.0.53", 53)
# What replaces a secret value that an upstream echoes back in a response.
REDACTED = b"[redacted by ppp]"


def redaction(value: bytes) -> bytes:
    """REDACTED cut or padded with `*` to exactly `value`'s length: the
    body keeps its length, so a Content-Length the upstream sent stays true
    (an HTTP/2 client resets a stream whose DATA disagrees with it)."""
    return (REDACTED + b"*" * len(value))[: len(value)]


LOCAL = Verdict(allow=True, rule_id="builtin:mitm.it", reason="served by ppp")
# How a held request's wait ended, in words for the 403 and the log.
HELD_REASONS = {
    "allowed": "allowed by you",
    "denied": "denied by you",
    "timeout": "nobody answered the approval request in time",
    "full": "too many requests of this sandbox wait for approval",
    "policy": "decided by a policy change",
}


class Daemon:
    """Connections to the daemon socket, one per thread, with request ids.

    The daemon answers one request at a time per connection, and a `decide`
    may wait for a host lookup (up to 750 ms): the event loop and each
    worker thread of `PppAddon._asked` therefore keep their own connection,
    so a slow answer to one never delays another's.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._ids = itertools.count(1)  # next() is atomic under the GIL
        self._local = threading.local()
        # Every thread's open socket, so close() reaches them all.
        self._socks: set[socket.socket] = set()
        self._socks_lock = threading.Lock()

    def close(self) -> None:
        """Close every thread's connection; each reconnects on its next ask."""
        with self._socks_lock:
            socks, self._socks = self._socks, set()
        for s in socks:
            try:
                s.close()
            except OSError:
                pass

    def _drop(self) -> None:
        """Close this thread's connection."""
        s = getattr(self._local, "sock", None)
        self._local.sock, self._local.buf = None, b""
        if s is not None:
            with self._socks_lock:
                self._socks.discard(s)
            try:
                s.close()
            except OSError:
                pass

    def _connect(self) -> socket.socket:
        s = getattr(self._local, "sock", None)
        if s is None or s.fileno() < 0:  # none yet, or closed by close()
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(DAEMON_TIMEOUT)
            try:
                s.connect(self.path)
            except OSError:
                s.close()
                raise
            self._local.sock, self._local.buf = s, b""
            with self._socks_lock:
                self._socks.add(s)
        return s

    def _once(self, req: dict[str, Any]) -> dict[str, Any]:
        rid = next(self._ids)
        s = self._connect()
        local = self._local
        s.sendall((json.dumps({**req, "id": rid}) + "\n").encode())
        while True:
            nl = local.buf.find(b"\n")
            if nl >= 0:
                line, local.buf = local.buf[:nl], local.buf[nl + 1 :]
                reply = json.loads(line)
                if not isinstance(reply, dict):
                    raise DaemonError("malformed reply")
                if reply.get("id") == rid:
                    return reply
                continue  # a stale reply to an abandoned request
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("daemon closed the connection")
            local.buf += chunk

    def ask(self, req: dict[str, Any]) -> dict[str, Any]:
        """One request on this thread's connection; reconnects once (the
        daemon closes idle connections)."""
        for attempt in (0, 1):
            try:
                return self._once(req)
            except (OSError, ValueError, DaemonError) as e:
                self._drop()
                if attempt == 1:
                    raise DaemonError(f"daemon socket {self.path}: {e}") from e
        raise AssertionError("unreachable")


def canonical_host(host: str | None) -> str | None:
    if not host:
        return None
    host = host.strip().rstrip(".").lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or None


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


# parse_ip's answers by input text, with the address's text form: every
# request parses the same few strings (its destination, its Host), and
# `ipaddress` costs several microseconds a call, more when it fails.
_IP_MEMO_MAX = 4096
_IP_MEMO: Lru = Lru(_IP_MEMO_MAX)


def _ip_entry(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address | None, str | None]:
    hit = _IP_MEMO.get(text)
    if hit is None:
        ip = _parse_ip(text)
        hit = (ip, str(ip) if ip is not None else None)
        _IP_MEMO[text] = hit  # bounded (LRU): a guest can send any Host
    return hit


def parse_ip(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address `text` names (brackets and zone dropped, IPv4-mapped IPv6
    unwrapped), or None."""
    if not text:
        return None
    return _ip_entry(text)[0]


def ip_text(text: str | None) -> str | None:
    """`str(parse_ip(text))`, or None when it is not an address."""
    if not text:
        return None
    return _ip_entry(text)[1]


def header_text(headers: http.Headers, name: bytes) -> str:
    """`headers.get(name, "")` (all values joined with ", ") for a lower-case
    name, in one pass over the raw fields."""
    vals = [v for k, v in headers.fields if k.lower() == name]
    if not vals:
        return ""
    return ", ".join(v.decode("utf-8", "surrogateescape") for v in vals)


_stamp_second: list[Any] = [None, ""]


def now_rfc3339() -> str:
    """UTC now as `2026-01-02T03:04:05.678Z` (milliseconds truncated, as
    `datetime.isoformat(timespec="milliseconds")`); the text up to the
    seconds is formatted once per second."""
    t = time.time()
    sec = int(t)
    if sec != _stamp_second[0]:
        _stamp_second[0] = sec
        _stamp_second[1] = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    return f"{_stamp_second[1]}.{int((t - sec) * 1000):03d}Z"


def logged_path(path: str) -> str | None:
    """A request path as flows.jsonl records it: without the query string,
    which often carries tokens or signatures (`?access_token=…`,
    `X-Amz-Signature=…`) that must never reach a log, and at most
    MAX_LOGGED_PATH characters (a cut path ends in `…`). None for a request
    with no path (CONNECT's authority form)."""
    path = path.split("?", 1)[0].split("#", 1)[0]
    if not path:
        return None
    if len(path) > MAX_LOGGED_PATH:
        path = path[: MAX_LOGGED_PATH - 1] + "\u2026"
    return path


def duration_ms(start: float | None) -> int | None:
    """Milliseconds from `start` (a mitmproxy wall-clock timestamp) to now,
    when a flow is logged at its end; None when mitmproxy set no start."""
    if not start:
        return None
    return max(0, round((time.time() - start) * 1000))


def _authority_host(text: str) -> str | None:
    """The host of `host[:port]` or `[v6][:port]`, canonical."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        return canonical_host(text[1:end]) if end > 0 else None
    if text.count(":") == 1:
        text = text.split(":", 1)[0]
    return canonical_host(text)


def request_name(flow: http.HTTPFlow) -> tuple[str | None, str | None]:
    """The one host a request names, or why its names disagree.

    A request can name its host three times: the TLS SNI, the `Host`
    header, and the target (HTTP/1 absolute-form, or HTTP/2 and HTTP/3
    `:authority`). The upstream may route by any of them (RFC 9112 servers
    route by an absolute-form target, TLS terminators by SNI), so a request
    is decided on its name only when they all agree: returns (name, None),
    or (None, reason) when they do not. (None, None): no name at all.
    """
    req = flow.request
    if not (req.path.startswith("/") or (req.path == "*" and req.method == "OPTIONS")):
        # An absolute URI in HTTP/2's :path (or anything but origin-form)
        # would reach an HTTP/1 upstream as an absolute-form target.
        return None, "the request target is not a path"
    hosts = [v for k, v in req.headers.fields if k.lower() == b"host"]
    if len(hosts) > 1:
        return None, "the request has more than one Host header"
    names: list[tuple[str, str | None]] = []
    if hosts:
        names.append(("Host header", _authority_host(hosts[0].decode("utf-8", "surrogateescape"))))
    if req.authority:
        where = "request target" if req.http_version.startswith("HTTP/1") else ":authority"
        names.append((where, _authority_host(req.authority)))
    client = flow.client_conn
    if client.tls_established:
        sni = canonical_host(client.sni)
        if sni is None:
            if any(n is not None and ip_text(n) is None for _, n in names):
                return None, "a TLS connection without SNI names a host only in the request"
        else:
            names.append(("TLS SNI", sni))
    distinct = {n for _, n in names}
    if None in distinct and len(names) > 0:
        return None, "the request names an empty host"
    if len(distinct) > 1:
        said = ", ".join(f"{n} in the {where}" for where, n in names)
        return None, f"the request names different hosts: {said}"
    return (names[0][1] if names else None), None


def _with_key(fields: tuple[tuple[bytes, bytes], ...], name: str, value: str, name2: str, value2: str) -> tuple[tuple[bytes, bytes], ...]:
    """`fields` with every AUTH_HEADERS field removed, then `name` set to
    `value` and `name2` to `value2`, as `Headers.__setitem__` sets them (the
    first field of that name keeps its place and spelling, the others go; a
    new one is added at the end), in one pass instead of one per header."""
    # Encoded as mitmproxy encodes str headers.
    n1, n2 = name.encode("utf-8", "surrogateescape"), name2.encode("utf-8", "surrogateescape")
    sets = [
        [n1.lower(), n1, value.encode("utf-8", "surrogateescape"), False],
        [n2.lower(), n2, value2.encode("utf-8", "surrogateescape"), False],
    ]
    if sets[0][0] == sets[1][0]:
        del sets[0]  # the second set wins
    out: list[tuple[bytes, bytes]] = []
    for f in fields:
        k = f[0].lower()
        if k in _AUTH_BYTES:
            continue
        for st in sets:
            if k == st[0]:
                if not st[3]:
                    st[3] = True
                    out.append((f[0], st[2]))
                break
        else:
            out.append(f)
    out.extend((st[1], st[2]) for st in sets if not st[3])
    return tuple(out)


class Scrubber:
    """A `flow.response.stream` function that replaces every secret value in
    a streamed body with its `redaction`, also across chunk boundaries: it
    holds back the longest end of each chunk that is the start of a secret
    (shorter than it) until the next chunk (or the end, `b""`) shows whether
    the secret follows. Only such an end is held: a chunk that ends
    otherwise (an SSE event ends in a blank line) goes on whole and at once,
    so streamed events and gRPC messages are never delayed. Memory: one
    chunk plus that tail."""

    # What a Scrubber needs of its secrets, by the values as given: every
    # response of a flow with an injected key gets a Scrubber, nearly always
    # for the same few values. Bounded: cleared when full.
    _tables: dict[tuple[bytes, ...], tuple[Any, ...]] = {}
    _TABLES_MAX = 256

    def __init__(self, values: list[bytes]) -> None:
        given = tuple(values)
        t = Scrubber._tables.get(given)
        if t is None:
            ordered = sorted({v for v in values if v}, key=len, reverse=True)
            t = (
                ordered,
                max((len(v) for v in ordered), default=1) - 1,
                # Knuth-Morris-Pratt failure function of each secret, so
                # that `_held` costs O(len(secret)) per chunk whatever the
                # bytes.
                [self._failure(v) for v in ordered],
                # The bytes a held end can finish with: a proper prefix of a
                # secret ends with one of them.
                frozenset(b for v in ordered for b in v[:-1]),
            )
            if len(Scrubber._tables) >= Scrubber._TABLES_MAX:
                Scrubber._tables.clear()
            Scrubber._tables[given] = t
        self.values, self.keep, self._fail, self._ends = t
        self.tail = b""

    @staticmethod
    def _failure(v: bytes) -> list[int]:
        f = [0] * len(v)
        k = 0
        for i in range(1, len(v)):
            while k and v[i] != v[k]:
                k = f[k - 1]
            if v[i] == v[k]:
                k += 1
            f[i] = k
        return f

    def _held(self, data: bytes) -> int:
        """The length of the longest end of `data` that is a proper prefix
        of a secret: only that can still become one."""
        if not data or data[-1] not in self._ends:
            return 0  # the usual case: no secret's start ends the chunk
        best = 0
        for v, f in zip(self.values, self._fail):
            q = 0
            for b in data[-(len(v) - 1) :] if len(v) > 1 else b"":
                while q and (q == len(v) or b != v[q]):
                    q = f[q - 1]
                if b == v[q]:
                    q += 1
            best = max(best, q if q < len(v) else f[q - 1])
        return best

    def scrub(self, data: bytes) -> bytes:
        for v in self.values:
            if v in data:
                data = data.replace(v, redaction(v))
        return data

    def __call__(self, chunk: bytes) -> bytes | list[bytes]:
        data = self.scrub(self.tail + chunk)
        if chunk == b"" or self.keep == 0:
            self.tail = b""
            return data
        # Hold back a tail that could be the start of a secret; a redaction
        # never contains a secret, so nothing is replaced twice.
        cut = len(data) - self._held(data)
        self.tail = data[cut:]
        # Never b"" mid-stream: mitmproxy would send it as an empty chunk,
        # which ends a chunked body.
        return data[:cut] or []


def _cap_http1_headers() -> None:
    """Bound the HTTP/1 header block mitmproxy buffers, both ways.

    mitmproxy 12.2.3's HTTP/1 readers (`Http1Server`/`Http1Client.read_headers`
    in proxy/layers/http/_http1.py) keep appending to their ReceiveBuffer until
    a blank line arrives, with no limit and no option for one. Each is wrapped
    once: after the real reader ran on new data, a head still incomplete and
    past MAX_HEADER_BYTES gets the connection closed (a guest gets 431, a
    server's response becomes a 502 for the guest). Reads are at most 64 KiB,
    so at most MAX_HEADER_BYTES + 64 KiB is ever held; a complete head over
    the limit is answered 431 at requestheaders. HTTP/2 needs nothing: h2
    refuses a header list over 64 KiB (its default) and keeps at most 64
    CONTINUATION frames."""
    for cls, from_client in ((_http1.Http1Server, True), (_http1.Http1Client, False)):
        orig = cls.read_headers
        if getattr(orig, "ppp_capped", False):
            continue

        def read_headers(self: Any, event: Any, _orig: Any = orig, _from_client: bool = from_client) -> Any:
            yield from _orig(self, event)
            if (
                isinstance(event, proxy_events.DataReceived)
                and self.state == self.read_headers
                and len(self.buf) > MAX_HEADER_BYTES
            ):
                self.buf = _http1.ReceiveBuffer()
                why = f"header block exceeds {MAX_HEADER_BYTES} bytes (blocked by ppp)"
                if _from_client:
                    log.info("ppp: a request %s; closing the connection", why)
                    yield commands.SendData(self.conn, _http1.make_error_response(431, f"request {why}"))
                    yield commands.CloseConnection(self.conn)
                    self.state = self.done
                else:
                    log.info("ppp: a response %s; closing the connection", why)
                    yield commands.CloseConnection(self.conn)
                    if self.stream_id:
                        yield _http1.ReceiveHttp(
                            _http1.ResponseProtocolError(
                                self.stream_id, f"response {why}", _http1.ErrorCode.GENERIC_SERVER_ERROR
                            )
                        )

        read_headers.ppp_capped = True  # type: ignore[attr-defined]
        cls.read_headers = read_headers


def _cap_buffered_request_bodies() -> None:
    """Bound a request body mitmproxy buffers: REFUSED_BODY_DRAIN.

    ppp streams every request it lets through (`requestheaders` sets
    `stream`), so mitmproxy 12.2.3 buffers a request body only when an
    answer was set at `requestheaders`: a refusal, or mitm.it. It then reads
    the whole body into `HttpStream.request_body_buf` before answering, with
    no limit unless `body_size_limit` is set, and that option also refuses
    a large declared upload before any addon has decided (it would break
    64 MiB requests to an LLM API). `_refused_body` kills what it can see
    coming (a large Content-Length, chunked), but an HTTP/2 or HTTP/3
    request says that it has a body only by not ending the stream in its
    HEADERS frame, which no hook sees. So `state_consume_request_body` is
    wrapped once: past the bound, the stream fails as mitmproxy fails one
    over `body_size_limit` (HTTP/1: 413 and close; HTTP/2: the stream
    reset) and the buffer is dropped."""
    cls = http_layer.HttpStream
    orig = cls.state_consume_request_body
    if getattr(orig, "ppp_capped", False):
        return

    def state_consume_request_body(self: Any, event: Any, _orig: Any = orig) -> Any:
        if (
            isinstance(event, http_layer.RequestData)
            and len(self.request_body_buf) + len(event.data) > REFUSED_BODY_DRAIN
        ):
            self.request_body_buf.clear()
            why = f"ppp: the body of a refused request is over {REFUSED_BODY_DRAIN} bytes"
            log.info("%s; failing the stream", why)
            self.flow.error = mitm_flow.Error(why)
            yield http_layer.HttpErrorHook(self.flow)
            yield http_layer.SendHttp(
                http_layer.ResponseProtocolError(self.stream_id, why, http_layer.ErrorCode.REQUEST_TOO_LARGE),
                self.context.client,
            )
            self.client_state = self.state_errored
            self.flow.live = False
            return
        yield from _orig(self, event)

    state_consume_request_body.ppp_capped = True  # type: ignore[attr-defined]
    cls.state_consume_request_body = state_consume_request_body


def _cap_websocket_messages() -> None:
    """Bound the WebSocket message mitmproxy reassembles.

    Its WebSocket layer (proxy/layers/websocket.py, `relay_messages`) joins a
    message's frames in `frame_buf` until the last one, with no limit. The
    layer's relay is wrapped once: a message past MAX_WS_MESSAGE closes both
    connections and is dropped. Finished messages are dropped from the flow
    by `websocket_message`."""
    orig = ws_layer.WebsocketLayer.relay_messages
    if getattr(orig, "ppp_capped", False):
        return

    def relay_messages(self: Any, event: Any, _orig: Any = orig) -> Any:
        if getattr(self, "ppp_closed", False) and isinstance(event, proxy_events.DataReceived):
            return  # the rest of a refused message
        yield from _orig(self, event)
        for w in (getattr(self, "client_ws", None), getattr(self, "server_ws", None)):
            if w is not None and sum(len(b) for b in w.frame_buf) > MAX_WS_MESSAGE:
                w.frame_buf = [b""]
                self.ppp_closed = True
                log.info("ppp: a WebSocket message over %d bytes; closing the connection", MAX_WS_MESSAGE)
                yield commands.CloseConnection(self.context.client)
                yield commands.CloseConnection(self.context.server)

    relay_messages.ppp_capped = True  # type: ignore[attr-defined]
    ws_layer.WebsocketLayer.relay_messages = relay_messages


def _forget_answered_dns() -> None:
    """Keep mitmproxy's DNS layer from holding every query it answered.

    `DNSLayer.flows` (proxy/layers/dns.py in 12.2.3) maps a message id to
    its flow so that the upstream's answer finds it; nothing ever removes
    an entry, so one UDP or TCP DNS connection keeps up to 65,536 flows
    (request, response, connection references) until it closes, and a
    guest chooses the ids. `handle_response` and `handle_error` are wrapped
    once: after the answer went to the client the flow leaves `flows` (a
    later reply with its id is then a new flow, answered on its own); and
    `state_query` drops the oldest pending flows past DNS_PENDING_MAX."""
    cls = dns_layer.DNSLayer
    if getattr(cls.handle_response, "ppp_bounded", False):
        return
    orig_response, orig_error, orig_query = cls.handle_response, cls.handle_error, cls.state_query

    def forget(self: Any, flow: Any) -> None:
        flows = self.flows
        req = flow.request
        if req is not None and flows.get(req.id) is flow:
            del flows[req.id]
        elif flow in flows.values():
            # A reply with no query of ours: keyed by the reply's id.
            for mid in [k for k, f in flows.items() if f is flow]:
                del flows[mid]

    def handle_response(self: Any, flow: Any, msg: Any, _orig: Any = orig_response) -> Any:
        yield from _orig(self, flow, msg)
        forget(self, flow)
        _close_answered_udp(self)

    def handle_error(self: Any, flow: Any, err: str, _orig: Any = orig_error) -> Any:
        yield from _orig(self, flow, err)
        forget(self, flow)
        _close_answered_udp(self)

    def state_query(self: Any, event: Any, _orig: Any = orig_query) -> Any:
        yield from _orig(self, event)
        flows = self.flows
        while len(flows) > DNS_PENDING_MAX:
            # Insertion order: the oldest query first.
            flows.pop(next(iter(flows)), None)

    handle_response.ppp_bounded = True  # type: ignore[attr-defined]
    cls.handle_response = handle_response
    cls.handle_error = handle_error
    # state_start binds `self.state_query` by name: the wrapper.
    cls.state_query = state_query


def _close_answered_udp(layer: Any) -> None:
    """Close `layer`'s UDP DNS connection DNS_UDP_LINGER seconds after its
    last answer went out, unless a query came in meanwhile (whose own
    answer starts the wait again). Called from inside the layer: the close
    is a timer on the loop, never a command in the middle of its answer."""
    client = layer.context.client
    if client.transport_protocol != "udp" or layer.flows:
        return
    stamp = object()
    layer.ppp_answered = stamp
    try:
        asyncio.get_running_loop().call_later(DNS_UDP_LINGER, _close_if_quiet, layer, stamp)
    except RuntimeError:
        pass  # no loop (a unit test driving the layer by hand)


def _close_if_quiet(layer: Any, stamp: object) -> None:
    if layer.flows or getattr(layer, "ppp_answered", None) is not stamp:
        return  # a query came since: its answer decides
    client = layer.context.client
    try:
        handler = ctx.master.addons.get("proxyserver").connections.get(client.id)
        if handler is not None and client in handler.transports:
            handler.close_connection(client)
    except Exception:  # noqa: BLE001
        pass  # already gone


def _size_text(n: int) -> str:
    """Bytes as ppp's sizes print them: the largest binary unit that
    divides them (`64MiB`, `1536KiB`, `100B`), as `Size`'s Display does."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def _frame_converted_bodies() -> None:
    """Give a streamed HTTP/2 or HTTP/3 request body framing on its way to
    an HTTP/1 upstream.

    mitmproxy 12.2.3's `Http1Client.send` (proxy/layers/http/_http1.py)
    turns such a request into HTTP/1 but, for a body without Content-Length
    (an upload streamed over HTTP/2 has none), sends the DATA bytes with no
    `transfer-encoding` either: the upstream reads an empty body and the
    rest as garbage. Wrapped once: such a request gets `transfer-encoding:
    chunked`, which `send` then honours for each chunk and the end."""
    orig = _http1.Http1Client.send
    if getattr(orig, "ppp_framed", False):
        return

    def send(self: Any, event: Any, _orig: Any = orig) -> Any:
        if isinstance(event, _http1.RequestHeaders) and not event.end_stream:
            req = event.request
            if (req.is_http2 or req.is_http3) and "content-length" not in req.headers and "transfer-encoding" not in req.headers:
                req.headers["transfer-encoding"] = "chunked"
        yield from _orig(self, event)

    send.ppp_framed = True  # type: ignore[attr-defined]
    _http1.Http1Client.send = send


# The notes mitmproxy's HTTP layer logs (INFO) whenever a body is streamed
# (proxy/layers/http/__init__.py, `start_request_stream` and
# `start_response_stream`). ppp streams every body, so they say nothing.
_STREAMING_NOTES = ("Streaming request to ", "Streaming response from ")


def _quiet_streaming_notes() -> None:
    """Drop mitmproxy's "Streaming response from <host>." notes.

    ppp sets `stream` on every request and response body (to count and cap
    it), so mitmproxy 12.2.3 logs one such line per flow: a LogRecord,
    formatted by each handler, a line in proxy.log that the daemon reads,
    and an `add_log` event posted to every addon through
    `call_soon_threadsafe` (a self-pipe write and one more event-loop
    wake-up): about 7% of mitmdump's busy time in bench/addon-overhead.sh,
    more than any one of the addon's hooks (docs/benchmarks.md). The handler's
    `log` (proxy/server.py `ConnectionHandler.log`, which all layer `Log`
    commands go through) is wrapped once; every other message passes."""
    cls = proxy_server.ConnectionHandler
    orig = cls.log
    if getattr(orig, "ppp_quiet", False):
        return

    def log(self: Any, message: str, level: int = logging.INFO, exc_info: Any = None, _orig: Any = orig) -> None:
        if level == logging.INFO and message.startswith(_STREAMING_NOTES):
            return
        _orig(self, message, level, exc_info)

    log.ppp_quiet = True  # type: ignore[attr-defined]
    cls.log = log


def _cache_hook_dispatch(manager: Any) -> None:
    """Find each hook's handlers once, not on every event.

    mitmproxy 12.2.3's `AddonManager.trigger_event` looks every hook up
    anew: for each of the ~40 addons in mitmdump's chain it starts a
    generator that walks the addon's sub-addons and `getattr`s the hook's
    name, inside a `safecall` context manager. A request fires eight such
    events (requestheaders, request, responseheaders, response, each
    followed by `update`), and most addons implement none of them: in
    bench/addon-overhead.sh that walk was 13% of bare mitmdump's CPU per
    request (docs/benchmarks.md).

    This keeps, per hook name, the handlers in chain order grouped by
    top-level addon, and calls them exactly as `trigger_event` does: each
    group under `safecall` (an error is logged and the next addon runs),
    `AddonHalt` stops the event, awaitables are awaited. The table is
    emptied whenever the set of handlers can change: `add`, `register`,
    `remove` and `clear` (a script's load and reload go through these) and every
    option change (ScriptLoader reorders its scripts in `configure`). It
    is rebuilt on the next event, so a change is seen by the next hook."""
    if getattr(manager, "ppp_hook_table", None) is not None:
        return
    table: dict[str, list[list[Any]]] = {}
    manager.ppp_hook_table = table

    def emptying(orig: Any) -> Any:
        def run(*args: Any, _orig: Any = orig) -> Any:
            table.clear()
            try:
                return _orig(*args)
            finally:
                table.clear()

        return run

    for name in ("add", "register", "remove", "clear"):
        setattr(manager, name, emptying(getattr(manager, name)))

    def emptied(*_: Any, **__: Any) -> None:
        table.clear()

    # The signal holds its receivers weakly: the manager keeps this one.
    manager.ppp_hook_table_emptied = emptied
    manager.master.options.changed.connect(emptied)

    orig_trigger = manager.trigger_event

    def handlers(event: Any) -> list[list[Any]] | None:
        groups = []
        try:
            for addon in manager.chain:
                funcs = [f for _, f in manager._iter_hooks(addon, event)]
                if funcs:
                    groups.append(funcs)
        except Exception:  # noqa: BLE001
            # A hook name bound to something not callable: mitmproxy's own
            # walk reports it, on every event, as it always did.
            return None
        return groups

    async def trigger_event(event: Any) -> None:
        groups = table.get(event.name)
        if groups is None:
            groups = handlers(event)
            if groups is None:
                await orig_trigger(event)
                return
            table[event.name] = groups
        if not groups:
            return
        args = event.args()
        for funcs in groups:
            try:
                with addonmanager.safecall():
                    for func in funcs:
                        res = func(*args)
                        if res is not None and inspect.isawaitable(res):
                            await res
            except mitm_exceptions.AddonHalt:
                return

    manager.trigger_event = trigger_event


class LoopShare:
    """Who used mitmdump's event loop lately, and who must wait for it.

    Keys are WireGuard listen ports (one per sandbox; at most 65,535, and an
    entry idle for 10 * LOOP_ACTIVE is dropped). Pure bookkeeping with an
    injectable clock; `_share_the_loop` feeds it and applies its waits."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self._usage: dict[Any, tuple[float, float]] = {}  # key -> (average, at)
        self._seen: dict[Any, float] = {}
        self._ready: dict[Any, float] = {}
        self._pruned = 0.0

    def _avg(self, key: Any, now: float) -> float:
        u = self._usage.get(key)
        if u is None:
            return 0.0
        value, at = u
        return value * math.exp(-(now - at) / LOOP_TAU)

    def _hog(self, key: Any, now: float) -> bool:
        """Whether another sandbox is active and `key` used more than any
        active other."""
        others = [k for k, t in self._seen.items() if k != key and now - t <= LOOP_ACTIVE]
        if not others:
            return False
        return self._avg(key, now) > max(self._avg(k, now) for k in others)

    def charge(self, key: Any, cost: float, now: float | None = None) -> None:
        """`key`'s work just took `cost` seconds of the loop, up to `now`
        (read from the clock when not given). It runs for every event and
        hook, so the common case, one sandbox, is kept to a few operations:
        `_avg` inlined, no pruning, no waits."""
        if now is None:
            now = self.clock()
        if cost > LOOP_MAX_CHARGE:
            cost = LOOP_MAX_CHARGE
        usage = self._usage
        u = usage.get(key)
        usage[key] = ((u[0] * math.exp((u[1] - now) / LOOP_TAU) if u is not None else 0.0) + cost, now)
        seen = self._seen
        seen[key] = now
        if len(seen) == 1:
            # One sandbox (the usual case): nobody to share with, and no
            # entry to prune.
            if self._ready:
                self._ready.clear()
            return
        if self._hog(key, now):
            self._ready[key] = max(self._ready.get(key, now), now) + cost * LOOP_YIELD
        else:
            self._ready.pop(key, None)
        if now - self._pruned > LOOP_ACTIVE:
            self._pruned = now
            for k in [k for k, t in self._seen.items() if now - t > 10 * LOOP_ACTIVE]:
                self._seen.pop(k, None)
                self._usage.pop(k, None)
                self._ready.pop(k, None)

    def wait(self, key: Any) -> float:
        """How long `key`'s connections should wait before reading again."""
        if not self._ready:
            return 0.0
        ready = self._ready.get(key)
        if ready is None:
            return 0.0
        now = self.clock()
        if ready <= now or not self._hog(key, now):
            self._ready.pop(key, None)
            return 0.0
        return min(ready - now, LOOP_MAX_WAIT)


LOOP_SHARE = LoopShare()

# Client connections with a request held for approval, by client id: [an
# event set on release, how many requests of it are held]. Their read loop
# (drain_writers) waits for the event, so a guest cannot stream a body into
# mitmproxy's queue of a paused layer while the user decides.
HELD_CLIENTS: dict[str, list[Any]] = {}
# Seconds each client spent held inside a hook: waiting, not loop time.
HELD_WAITED: dict[str, float] = {}


@contextlib.contextmanager
def _paused(cid: str) -> Iterator[None]:
    """While a hook of client `cid` waits (for the user, or for the daemon
    in a worker thread): its read loop waits too (HELD_CLIENTS), and the
    wait is not charged to its sandbox as loop time (HELD_WAITED)."""
    held = HELD_CLIENTS.get(cid)
    if held is None:
        held = HELD_CLIENTS[cid] = [asyncio.Event(), 0]
    held[1] += 1
    started = time.perf_counter()
    try:
        yield
    finally:
        HELD_WAITED[cid] = HELD_WAITED.get(cid, 0.0) + time.perf_counter() - started
        held[1] -= 1
        if held[1] <= 0:
            held[0].set()
            HELD_CLIENTS.pop(cid, None)


def _share_key(handler: Any) -> Any:
    """The sandbox of a connection handler: its WireGuard listen port, or
    None (not shared) for any other mode."""
    key = getattr(handler, "ppp_share_key", False)
    if key is False:
        mode = handler.client.proxy_mode
        key = mode.listen_port() if isinstance(mode, mode_specs.WireGuardMode) else None
        handler.ppp_share_key = key
    return key


def _share_the_loop() -> None:
    """Time each sandbox's work on the event loop and hold back a flood.

    mitmproxy 12.2.3 runs every connection of every WireGuard server on one
    asyncio loop (proxy/server.py `ConnectionHandler`), first come first
    served: a sandbox streaming at full speed always has its next chunk
    ready, so each step of another sandbox's request waits behind one. The
    handler is wrapped once: `server_event` (the layers' work on data, the
    stream callbacks included) and `handle_hook` (addon hooks) are timed
    and charged to the handler's sandbox, and `drain_writers`, which the
    read loop awaits after every read, waits as LoopShare says. A held
    connection stops reading, so TCP backpressure slows the flood at its
    source, in the guest. Alone, a sandbox never waits."""
    cls = proxy_server.ConnectionHandler
    if getattr(cls.server_event, "ppp_shared", False):
        return
    orig_event, orig_drain = cls.server_event, cls.drain_writers
    handler_cls = mode_servers.ProxyConnectionHandler
    orig_hook = handler_cls.handle_hook

    def charged(orig: Any) -> Any:
        """`orig(self, arg)`, timed and charged to the handler's sandbox."""

        async def run(self: Any, arg: Any, _orig: Any = orig) -> None:
            share = LOOP_SHARE
            t = share.clock()
            try:
                await _orig(self, arg)
            finally:
                if (key := _share_key(self)) is not None:
                    now = share.clock()
                    cost = now - t
                    if HELD_WAITED:
                        # A hook held for approval waited; it did not work.
                        cost = max(0.0, cost - HELD_WAITED.pop(self.client.id, 0.0))
                    share.charge(key, cost, now)

        return run

    server_event, handle_hook = charged(orig_event), charged(orig_hook)

    async def drain_writers(self: Any, _orig: Any = orig_drain) -> None:
        await _orig(self)
        if HELD_CLIENTS and (held := HELD_CLIENTS.get(self.client.id)) is not None:
            await held[0].wait()
        # No wait is owed by anyone (always so with one sandbox): skip the
        # lookups.
        if LOOP_SHARE._ready and (key := _share_key(self)) is not None:
            while (d := LOOP_SHARE.wait(key)) > 0:
                await asyncio.sleep(d)

    server_event.ppp_shared = True  # type: ignore[attr-defined]
    cls.server_event = server_event
    cls.drain_writers = drain_writers
    handler_cls.handle_hook = handle_hook


# json.dumps builds a new encoder on every call that passes separators.
_JSON = json.JSONEncoder(separators=(",", ":"))


class PppAddon:
    def __init__(self) -> None:
        self.daemon: Daemon | None = None
        self.state_dir = ""
        self.generation: int | None = None
        self._gen_stamp: tuple[int, int, int] | None = None
        # The stamp of `$PPP_DATA/secrets-index.json` the secret cache was
        # filled under (see `_poll`).
        self._index_stamp: tuple[int, int, int] | None = None
        self._index_path = ""
        self._last_poll = 0.0
        # Keyed by what the guest chose (names, addresses): bounded.
        self._decisions: Lru = Lru(CACHE_MAX)
        self._gen_path = ""
        self._flow_path = ""
        self._registry_path = ""
        # Secrets are never injected when upstream certificates go unchecked.
        self._ssl_insecure = False
        # flow.id -> the secret values injected into its request, scrubbed
        # from its response; dropped when the flow ends (bounded all the
        # same: an entry outlives a flow only if mitmproxy never ends it).
        self._scrub: Lru = Lru(CACHE_MAX)
        self._secrets: Lru = Lru(CACHE_MAX)
        self._registry: dict[int, str] = {}
        self._registry_stamp: tuple[int, int] | None = None
        # Client connections denied at TLS/TCP/UDP level, by client id:
        # server_connect refuses any upstream connection for them.
        self._denied: Lru = Lru(DENIED_MAX)
        # DNS client connections whose questions go to the host's name
        # server (`_forward_dns`), by client id: that server.
        self._forwarded: Lru = Lru(DENIED_MAX)
        # The generation stamp whose `modes` list was last applied.
        self._modes_stamp: tuple[int, int, int] | None = None
        # WireGuard listen port -> wall-clock time of its latest connection.
        self._seen: Lru = Lru(CACHE_MAX)
        self._seen_saved: dict[int, float] = {}
        self._seen_saved_at = 0.0
        self._watcher: asyncio.Task[None] | None = None
        # Open TCP/UDP streams and WebSockets the policy allowed, by flow id:
        # (flow, sandbox, host, ip, port, protocol). A reload re-decides them
        # and cuts the ones it now denies. Entries leave when flows end, so
        # this is bounded by the connections mitmproxy holds.
        self._live: dict[str, tuple[Any, str, str | None, str | None, int, str]] = {}
        self._live_generation: int | None = None
        # flows.jsonl: open descriptor and when its path was last checked.
        self._flow_log: tuple[int, float] | None = None
        # Bytes in the open flows.jsonl, as far as this process knows.
        self._flow_log_size = 0
        # Log throttles: (sandbox, kind, name, port) -> window start, and
        # sandbox -> [window start, lines logged, lines suppressed].
        self._logged: Lru = Lru(CACHE_MAX)
        self._log_budget: Lru = Lru(CACHE_MAX)
        # Client connections whose TLS ClientHello the user approved, by
        # client id: the SNI approved. Requests inside, for that name, are
        # not held again.
        self._approved: Lru = Lru(DENIED_MAX)
        # Requests held now, per sandbox, and the tasks that hold them.
        self._holding: dict[str, int] = {}
        # Open client connections per (WireGuard port, transport), and the
        # ids counted there (bounded: MAX_CONNECTIONS per key).
        self._open: dict[tuple[int, str], int] = {}
        self._counted: dict[str, tuple[int, str]] = {}
        # TCP client connections with no upstream connection open, per
        # WireGuard port, in the order they became so (bounded: HELD_MAX
        # per port), and the upstream connections open per client id.
        self._held: dict[int, collections.OrderedDict[str, connection.Client]] = {}
        self._upstreams: dict[str, int] = {}
        # Held connections closed for HELD_MAX and not yet gone: client id
        # -> WireGuard port, and how many per port.
        self._evicted: dict[str, int] = {}
        self._closing: dict[int, int] = {}
        self._hold_tasks: set[asyncio.Task[None]] = set()
        # Decisions asked in worker threads now (`_asked`), per sandbox:
        # [a semaphore of DECIDE_RUNNING, how many wait or run]; and in all.
        self._asking: dict[str, list[Any]] = {}
        self._asking_total = 0
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # Bumped whenever the caches are dropped: an answer from a thread
        # that crossed a bump may be the old policy's.
        self._epoch = 0

    # ---- options -------------------------------------------------------

    def load(self, loader: Any) -> None:
        _cap_http1_headers()
        _cap_websocket_messages()
        _cap_buffered_request_bodies()
        _forget_answered_dns()
        _frame_converted_bodies()
        _share_the_loop()
        _quiet_streaming_notes()
        _cache_hook_dispatch(ctx.master.addons)
        loader.add_option("ppp_state_dir", str, "", "ppp's data directory ($PPP_DATA)")

    def configure(self, updated: set[str]) -> None:
        # Read here, not per request: an option lookup costs a few µs.
        self._ssl_insecure = bool(getattr(ctx.options, "ssl_insecure", False))
        if "ppp_state_dir" in updated or self.daemon is None:
            self.state_dir = ctx.options.ppp_state_dir or os.environ.get("PPP_DATA", "")
            self._gen_path = os.path.join(self.state_dir, "generation")
            self._index_path = os.path.join(self.state_dir, "secrets-index.json")
            self._flow_path = os.path.join(self.state_dir, "flows.jsonl")
            self._registry_path = os.path.join(self.state_dir, "port-registry.json")
            if self.daemon is not None:
                self.daemon.close()
            self.daemon = Daemon(os.path.join(self.state_dir, "secret.sock")) if self.state_dir else None
            self._invalidate(None)
            self._registry_stamp = None
            self._close_flow_log()

    def running(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    def done(self) -> None:
        self._close_flow_log()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._pool is not None:
            # A thread still waiting on the daemon ends with its socket
            # timeout; nobody awaits its answer any more.
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self.daemon is not None:
            self.daemon.close()

    # ---- WireGuard servers and tunnel activity -------------------------

    async def _watch(self) -> None:
        while True:
            try:
                self.sync_modes()
            except Exception as e:  # noqa: BLE001
                # Retried on the next tick: the stamp is only recorded once
                # a list was applied.
                log.warning("ppp: could not update the WireGuard servers: %s", e)
            try:
                self.save_tunnels()
            except Exception as e:  # noqa: BLE001
                log.warning("ppp: could not save tunnel activity: %s", e)
            try:
                await self.poll_in_background()
            except Exception:  # noqa: BLE001
                self._invalidate(None)  # the next hook asks, and denies if it fails
            try:
                await self.recheck_live()
            except Exception:  # noqa: BLE001
                log.exception("ppp: could not re-check open connections")
            await asyncio.sleep(WATCH_INTERVAL)

    async def poll_in_background(self) -> None:
        """Ask the daemon's generation once a second, in a thread: a round
        trip on the event loop stalls every request in flight, and a busy
        daemon host makes that the p99 latency. A failure or an error reply
        drops every cache, so the next hook asks itself and fails closed."""
        daemon = self.daemon
        now = time.monotonic()
        if daemon is None or now - self._last_poll < GENERATION_POLL:
            return
        try:
            r = await asyncio.to_thread(daemon.ask, {"op": "generation"})
        except DaemonError:
            self._invalidate(None)
            return
        if daemon is not self.daemon:
            return  # reconfigured meanwhile
        if not r.get("ok"):
            self._invalidate(None)
            return
        self._last_poll = now
        self._saw_generation(r.get("generation"))

    def sync_modes(self) -> None:
        """Apply the daemon's `modes` list once per generation.

        mitmproxy starts a server for each new spec and stops each dropped
        one; servers whose spec is unchanged keep running, with their
        tunnels. The daemon builds the specs exactly as it built mitmdump's
        command line, so an unchanged port always compares equal.
        """
        stamp = self._read_stamp()
        if stamp is None or stamp == self._modes_stamp:
            return
        r = self._ask({"op": "modes"})
        modes = r.get("modes")
        if not r.get("ok") or not isinstance(modes, list) or not modes:
            raise DaemonError(f"modes: {r.get('reason')} {r.get('detail') or ''}".strip())
        modes = [str(m) for m in modes]
        if modes != list(ctx.options.mode):
            log.info("ppp: WireGuard servers now %s", ", ".join(m.rsplit("@", 1)[-1] for m in modes))
            ctx.options.update(mode=modes)
        self._modes_stamp = stamp

    async def recheck_live(self) -> None:
        """Once per new generation, re-decide every open stream and cut the
        ones the new policy denies: a rule removed must not leave a tunnel
        the guest opened earlier. A verdict not cached is asked off the
        loop, as for a new flow (the daemon may look the name up again)."""
        gen = self.generation
        if gen is None or gen == self._live_generation:
            return
        self._live_generation = gen
        for fid, (flow, sandbox, host, ip, port, protocol) in list(self._live.items()):
            if fid not in self._live:
                continue  # ended while an earlier one was asked
            v = self._cached(sandbox, host, ip, port, protocol)
            if v is None:
                v = await self._asked(None, sandbox, host, ip, port, protocol)
            if fid not in self._live:
                continue
            if v.allow:
                continue
            if v.kind == "ask" and (flow.metadata.get("ppp") or {}).get("approval") == "allowed":
                # Still the user's to decide, and the user said yes.
                continue
            self._live.pop(fid, None)
            log.info("ppp: [%s] cut an open %s connection to %s (%s:%s): %s", sandbox, protocol, host, ip, port, v.reason)
            meta = flow.metadata.get("ppp")
            if meta is not None:
                meta["decision"] = "deny"
                meta["matched_rule"] = v.rule_id
            self._cut(flow)

    @staticmethod
    def _cut(flow: Any) -> None:
        """Close a live connection now. `flow.kill()` alone waits for the
        next message (mitmproxy issue 4711), so cancel the connection's
        handler task the way mitmproxy's own inactivity timeout does
        (`ConnectionHandler.on_timeout`, proxy/server.py in 12.2.3)."""
        try:
            ps = ctx.master.addons.get("proxyserver")
            handler = ps.connections.get(flow.client_conn.id) if ps is not None else None
            io = handler.transports.get(handler.client) if handler is not None else None
            if io is not None and io.handler is not None:
                io.handler.cancel("ppp: denied by a policy change")
        except Exception:  # noqa: BLE001
            log.exception("ppp: could not close a denied connection")
        if flow.killable:
            flow.kill()

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        meta = flow.metadata.get("ppp") or {}
        if meta.get("decision") == "allow" and meta.get("sandbox"):
            self._live[flow.id] = (flow, meta["sandbox"], meta.get("host"), meta.get("ip"), meta.get("port", 0), "http")

    def client_connected(self, client: connection.Client) -> None:
        port = self._port(client)
        if port is None:
            return
        self._seen[port] = time.time()
        key = (port, client.transport_protocol)
        n = self._open.get(key, 0)
        held = len(self._held.get(port, ())) + self._closing.get(port, 0) if key[1] == "tcp" else 0
        if n < MAX_CONNECTIONS and held < HELD_LIVE_MAX:
            self._open[key] = n + 1
            self._counted[client.id] = key
            if key[1] == "tcp":
                self._count_held(port, client)
            return
        # mitmproxy closes a connection whose client_connected sets an error.
        if n < MAX_CONNECTIONS:
            what = f"more than {HELD_LIVE_MAX} TCP connections with no upstream from this sandbox, open or being closed"
        else:
            what = f"more than {MAX_CONNECTIONS} open {key[1].upper()} connections from this sandbox"
        client.error = f"ppp: {what}"
        try:
            sandbox = self.sandbox_of(client)
            ip, dport = (client.sockname[0], client.sockname[1]) if client.sockname else (None, None)
            log.info("ppp: [%s] closed a new %s connection: %s", sandbox, key[1].upper(), what)
            self.log_flow(
                sandbox=sandbox, kind=key[1], ip=ip, port=dport, decision="deny", reason=what, duration_ms=None
            )
        except Exception:  # noqa: BLE001
            log.exception("ppp: could not log a refused connection")

    def _count_held(self, port: int, client: connection.Client) -> None:
        """`client` has no upstream connection now: count it among its
        sandbox's held connections, and close the one held longest past
        HELD_MAX."""
        held = self._held.setdefault(port, collections.OrderedDict())
        held[client.id] = client
        while len(held) > HELD_MAX:
            _, oldest = held.popitem(last=False)
            self._evicted[oldest.id] = port
            self._closing[port] = self._closing.get(port, 0) + 1
            self._close_held(oldest)

    def _close_held(self, client: connection.Client) -> None:
        what = f"more than {HELD_MAX} TCP connections with no upstream held by this sandbox; the oldest is closed"
        try:
            handler = ctx.master.addons.get("proxyserver").connections.get(client.id)
        except Exception:  # noqa: BLE001
            handler = None
        if handler is not None:

            def close() -> None:
                try:
                    handler.close_connection(client)
                except Exception:  # noqa: BLE001
                    pass  # already gone

            # Not from inside the hook of the connection that pushed it out.
            asyncio.get_running_loop().call_soon(close)
        try:
            sandbox = self.sandbox_of(client)
            ip, dport = (client.sockname[0], client.sockname[1]) if client.sockname else (None, None)
            log.info("ppp: [%s] closed a held TCP connection: %s", sandbox, what)
            self.log_flow(sandbox=sandbox, kind="tcp", ip=ip, port=dport, decision="deny", reason=what, duration_ms=None)
        except Exception:  # noqa: BLE001
            log.exception("ppp: could not log a closed held connection")

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        cid = data.client.id
        if cid not in self._counted:
            return
        self._upstreams[cid] = self._upstreams.get(cid, 0) + 1
        port = self._counted[cid][0]
        held = self._held.get(port)
        if held is not None:
            held.pop(cid, None)

    def server_disconnected(self, data: server_hooks.ServerConnectionHookData) -> None:
        cid = data.client.id
        n = self._upstreams.pop(cid, 0) - 1
        if n > 0:
            self._upstreams[cid] = n
        elif (key := self._counted.get(cid)) is not None and key[1] == "tcp" and data.client.connected:
            # Its last upstream went (an idle keep-alive the service
            # closed): held again, as the newest.
            self._count_held(key[0], data.client)

    def save_tunnels(self, force: bool = False) -> None:
        """Write `tunnels.json` when activity changed, at most once a second."""
        now = time.monotonic()
        if not self.state_dir or self._seen == self._seen_saved:
            return
        if not force and now - self._seen_saved_at < TUNNELS_WRITE_EVERY:
            return
        path = os.path.join(self.state_dir, "tunnels.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        body = json.dumps({"last_seen": {str(p): round(t, 3) for p, t in sorted(self._seen.items())}})
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body + "\n")
        os.replace(tmp, path)
        self._seen_saved = dict(self._seen)
        self._seen_saved_at = now

    # ---- daemon, caches ------------------------------------------------

    def _ask(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.daemon is None:
            raise DaemonError("ppp_state_dir is not set")
        return self.daemon.ask(req)

    def _invalidate(self, generation: int | None) -> None:
        self._epoch += 1
        self._decisions.clear()
        self._secrets.clear()
        Scrubber._tables.clear()  # no secret outlives its generation here
        self._registry_stamp = None
        self.generation = generation

    def _saw_generation(self, g: Any) -> None:
        if isinstance(g, int) and g != self.generation:
            self._invalidate(g)

    def _read_stamp(self, path: str | None = None) -> tuple[int, int, int] | None:
        # The daemon replaces the file (temp file + rename) on every reload,
        # so its inode and mtime change each time. A stat is a fifth of the
        # cost of opening and reading it, and it runs twice per request.
        try:
            st = os.stat(self._gen_path if path is None else path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _poll(self) -> None:
        """Drop every cache when the daemon's generation moved.

        The daemon rewrites `$PPP_DATA/generation` on every reload before it
        acknowledges it, so reading that small file first makes a policy
        change apply to the next request. The socket is asked here only
        when the generation is unknown (first use, after a change or a
        failure) or no answer is newer than GENERATION_POLL_HOOK; the
        background task asks it once a second besides.
        """
        stamp = self._read_stamp()
        if stamp != self._gen_stamp:
            self._gen_stamp = stamp
            self._invalidate(None)
        # Every change to the secret store (set, set-custom, rm, a sandbox
        # removed) rewrites its index, atomically and under state.lock,
        # before the command returns: the store's own commit point, whether
        # or not the daemon then reloads (a policy it cannot parse keeps the
        # generation where it was). A revoked key is never served from the
        # cache after that (docs/adr/0040).
        index = self._read_stamp(self._index_path)
        if index != self._index_stamp:
            self._index_stamp = index
            self._secrets.clear()
            Scrubber._tables.clear()
        now = time.monotonic()
        if self.generation is not None and now - self._last_poll < GENERATION_POLL_HOOK:
            return
        try:
            r = self._ask({"op": "generation"})
        except DaemonError:
            self._invalidate(None)
            raise
        if not r.get("ok"):
            self._invalidate(None)
            raise DaemonError(f"generation: {r.get('reason')}")
        self._last_poll = now
        self._saw_generation(r.get("generation"))

    def _load_registry(self) -> None:
        path = self._registry_path
        try:
            st = os.stat(path)
        except OSError:
            self._registry, self._registry_stamp = {}, None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._registry_stamp:
            return
        try:
            with open(path, encoding="utf-8") as f:
                ports = json.load(f).get("ports", {})
            self._registry = {int(p): str(n) for p, n in ports.items()}
            self._registry_stamp = stamp
        except (OSError, ValueError, AttributeError) as e:
            log.warning("ppp: unreadable %s: %s; denying every sandbox", path, e)
            self._registry, self._registry_stamp = {}, None

    def sandbox_of(self, client: connection.Client) -> str | None:
        """The sandbox behind a client connection: its WireGuard server's port."""
        mode = client.proxy_mode
        if not isinstance(mode, mode_specs.WireGuardMode):
            return None
        port = mode.listen_port()
        if port is None:
            return None
        self._load_registry()
        return self._registry.get(port)

    def decide(
        self, sandbox: str, host: str | None, ip: str | None, port: int, protocol: str, chain: tuple[str, ...] = ()
    ) -> Verdict:
        """The daemon's verdict, cached per (sandbox, host, ip, port) for one
        generation. `host` is what the guest named, `ip` where the bytes go;
        the daemon judges both (the name must resolve to the address, an
        address literal does not replace the destination, internal addresses
        need their own rule). A daemon failure denies and is never cached."""
        try:
            self._poll()
            return self._verdict(sandbox, host, ip, port, protocol, chain)
        except DaemonError as e:
            log.warning("ppp: policy daemon unavailable, denying: %s", e)
            return DAEMON_DOWN

    def _verdict(
        self, sandbox: str, host: str | None, ip: str | None, port: int, protocol: str, chain: tuple[str, ...] = ()
    ) -> Verdict:
        """decide() without the poll; raises DaemonError."""
        # The daemon answers DNS and UDP differently under an `ask` default
        # (a name is answered, a datagram refused): their verdicts must not
        # stand in for a TCP flow's to the same name, address and port.
        key: tuple[Any, ...] = (sandbox, host, ip, port, protocol if protocol in ("dns", "udp") else "")
        req = {"op": "decide", "sandbox": sandbox, "host": host, "ip": ip, "port": port, "protocol": protocol}
        if chain:
            # A DNS answer's aliases: the same name through other aliases
            # is another decision.
            key = (*key, chain)
            req["chain"] = list(chain)
        if (v := self._decisions.get(key)) is not None:
            return v
        return self._answer(key, self._ask(req), host)

    def _answer(self, key: tuple[Any, ...], r: dict[str, Any], host: str | None) -> Verdict:
        """A `decide` reply as a Verdict, cached under `key` when it may be,
        its generation seen. On the loop only. Raises DaemonError."""
        if not r.get("ok"):
            raise DaemonError(f"decide: {r.get('reason')} {r.get('detail', '')}")
        v, cache = self._from_reply(r, host)
        self._saw_generation(r.get("generation"))
        if cache:
            self._decisions[key] = v
        return v

    def _cached(self, sandbox: str, host: str | None, ip: str | None, port: int, protocol: str) -> Verdict | None:
        """decide() when the answer is cached, or None: then the hook hands
        mitmproxy `_asked` to await. The generation is polled first, as
        decide() does, and a failed poll denies."""
        try:
            self._poll()
        except DaemonError as e:
            log.warning("ppp: policy daemon unavailable, denying: %s", e)
            return DAEMON_DOWN
        return self._decisions.get((sandbox, host, ip, port, protocol if protocol in ("dns", "udp") else ""))

    async def _asked(
        self, client: connection.Client | None, sandbox: str, host: str | None, ip: str | None, port: int, protocol: str
    ) -> Verdict:
        """decide() for a verdict not cached, with the daemon asked in a
        worker thread: the host lookup a `decide` may need (up to the
        daemon's 750 ms for a name that never answers) then waits for this
        flow alone, and the loop goes on with every other. The client's
        read loop waits meanwhile, as for a hold. The answer is used,
        cached and its generation seen here, on the loop; one that crossed
        a policy change is asked again. Bounded per sandbox and in all:
        past either, denied at once. Never raises; a failure denies and is
        never cached."""
        slot = self._asking.get(sandbox)
        if slot is not None and slot[1] >= DECIDE_MAX:
            return deny(f"{slot[1]} decisions of this sandbox already wait for the policy daemon", "policy")
        if self._asking_total >= DECIDE_TOTAL_MAX:
            return deny(f"{self._asking_total} decisions already wait for the policy daemon", "policy")
        if slot is None:
            slot = self._asking[sandbox] = [asyncio.Semaphore(DECIDE_RUNNING), 0]
        slot[1] += 1
        self._asking_total += 1
        try:
            with _paused(client.id) if client is not None else contextlib.nullcontext():
                async with slot[0]:
                    return await self._ask_in_thread(sandbox, host, ip, port, protocol)
        except Exception as e:  # noqa: BLE001 - never crash mitmdump; deny
            log.exception("ppp: a decision asked off the loop failed, denying")
            return deny(f"internal error: {type(e).__name__}")
        finally:
            slot[1] -= 1
            self._asking_total -= 1
            if slot[1] <= 0 and self._asking.get(sandbox) is slot:
                del self._asking[sandbox]

    async def _ask_in_thread(self, sandbox: str, host: str | None, ip: str | None, port: int, protocol: str) -> Verdict:
        key = (sandbox, host, ip, port, protocol if protocol in ("dns", "udp") else "")
        req = {"op": "decide", "sandbox": sandbox, "host": host, "ip": ip, "port": port, "protocol": protocol}
        loop = asyncio.get_running_loop()
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(DECIDE_THREADS, thread_name_prefix="ppp-decide")
        try:
            for _ in range(DECIDE_TRIES):
                # Time passed (a turn, or in the queue): poll again, so that
                # what follows in this hook (a key injected) sees this
                # generation, as on the synchronous path.
                self._poll()
                epoch = self._epoch
                if (v := self._decisions.get(key)) is not None:
                    return v  # another flow's answer came first
                daemon = self.daemon
                if daemon is None:
                    raise DaemonError("ppp_state_dir is not set")
                # The thread touches nothing of the addon's: it only asks,
                # on its own connection (Daemon keeps one per thread).
                r = await loop.run_in_executor(self._pool, daemon.ask, req)
                # A reload while the daemon answered shows in the generation
                # file (written before the reload is acknowledged).
                self._poll()
                if self._epoch == epoch:
                    return self._answer(key, r, host)
        except DaemonError as e:
            log.warning("ppp: policy daemon unavailable, denying: %s", e)
            return DAEMON_DOWN
        return deny(f"the policy changed {DECIDE_TRIES} times while this flow was decided", "internal")

    @staticmethod
    def _from_reply(r: dict[str, Any], host: str | None) -> tuple[Verdict, bool]:
        """A `decide` or `hold` reply as a Verdict, and whether it may be
        cached for its generation. Raises DaemonError on a malformed one."""
        rule = r.get("matched_rule")
        if rule is not None and not isinstance(rule, dict):
            raise DaemonError("decide: malformed matched_rule")
        held = r.get("approval")
        if held is not None and not isinstance(held, dict):
            raise DaemonError("hold: malformed approval")
        allow = r.get("verdict") == "allow"
        cache = True
        chain = r.get("chain")
        chain = tuple(str(n) for n in chain[: CHAIN_MAX + 1]) if isinstance(chain, list) else ()
        if (alias := r.get("alias")) is not None:
            rule_text = f"rule {rule.get('id')} ({rule.get('decision')} {rule.get('resource')}, {rule.get('scope')})" if rule else "a rule"
            v = Verdict(
                allow=False,
                rule_id=rule.get("id") if rule else None,
                resource=rule.get("resource") if rule else None,
                reason=f"{host} is an alias of {alias}, which {rule_text} denies",
                generation=r.get("generation"),
                chain=chain,
                kind="alias",
            )
        elif (n := r.get("long_chain")) is not None:
            v = Verdict(
                allow=False,
                reason=f"{host} resolves through more than {n - 1} aliases",
                generation=r.get("generation"),
                chain=chain,
                kind="alias",
            )
        elif (rebound := r.get("rebinding")) is not None:
            v = Verdict(
                allow=False,
                reason=f"{host} resolves to internal address {rebound}, which no rule allows (DNS rebinding defence)",
                generation=r.get("generation"),
                # Allowing the name would change nothing: the address is
                # what needs a rule of its own.
                allow_target=str(rebound),
                kind="address",
            )
        elif (internal := r.get("internal")) is not None:
            v = Verdict(
                allow=False,
                reason=f"{internal} is an internal address (or the host's own), which needs an explicit rule",
                generation=r.get("generation"),
                allow_target=str(internal),
                kind="address",
            )
        elif (unresolved := r.get("unresolved")) is not None:
            v = Verdict(
                allow=False,
                reason=f"{host} does not resolve to {unresolved}, the address this connection goes to",
                generation=r.get("generation"),
                kind="unresolved",
            )
            # The guest may resolve the name through ppp next: ask again.
            cache = False
        elif r.get("verdict") == "ask":
            # Nothing decided yet: the caller holds the flow for the user.
            v = Verdict(
                allow=False, reason="no rule matches and the default asks", generation=r.get("generation"), kind="ask"
            )
        else:
            if held is not None:
                reason = HELD_REASONS.get(str(held.get("outcome")), "answered")
                if held.get("id"):
                    reason = f"{reason} (approval {held.get('id')})"
            elif rule:
                reason = f"rule {rule.get('id')} ({rule.get('decision')} {rule.get('resource')}, {rule.get('scope')})"
            else:
                reason = f"default {r.get('verdict')}"
            v = Verdict(
                allow=allow,
                rule_id=rule.get("id") if rule else None,
                resource=rule.get("resource") if rule else None,
                reason=reason,
                generation=r.get("generation"),
                limits=r.get("limits"),
                approval=str(held.get("outcome")) if held is not None else None,
                chain=chain,
            )
        if r.get("local") is True:
            v = dataclasses.replace(v, local=True)
        return v, cache

    async def _hold(
        self,
        client: connection.Client,
        sandbox: str,
        host: str | None,
        ip: str | None,
        port: int,
        protocol: str,
        method: str | None = None,
        path: str | None = None,
        size: int | None = None,
    ) -> Verdict:
        """Hold a flow the default leaves to the user until the daemon says
        how its wait ended. Its own connection, so other flows' decisions
        go on meanwhile; the connection closing withdraws the request, so a
        daemon that stops fails every held flow closed."""
        if self.daemon is None:
            return DAEMON_DOWN
        n = self._holding.get(sandbox, 0)
        if n >= HOLD_MAX:
            return deny(f"{n} requests of this sandbox already wait for approval", "policy")
        self._holding[sandbox] = n + 1
        writer = None
        req = {
            "op": "hold",
            "sandbox": sandbox,
            "host": host,
            "ip": ip,
            "port": port,
            "protocol": protocol,
            "method": method,
            "path": path,
            "size": size,
        }
        try:
            with _paused(client.id):
                reader, writer = await asyncio.open_unix_connection(self.daemon.path, limit=HOLD_REPLY_MAX)
                writer.write((_JSON.encode({k: x for k, x in req.items() if x is not None}) + "\n").encode())
                await writer.drain()
                line = await asyncio.wait_for(reader.readline(), HOLD_LIMIT)
            r = json.loads(line) if line else None
            if not isinstance(r, dict):
                raise DaemonError("the daemon ended a held request without an answer")
            if not r.get("ok"):
                raise DaemonError(f"hold: {r.get('reason')} {r.get('detail', '')}")
            v, _ = self._from_reply(r, host)
            if v.kind == "ask":
                raise DaemonError("hold: still undecided")
            return v
        except (OSError, ValueError, DaemonError, asyncio.TimeoutError) as e:
            log.warning("ppp: [%s] a held request to %s failed closed: %s", sandbox, host or ip, e)
            return DAEMON_DOWN
        finally:
            if writer is not None:
                writer.close()
            left = self._holding.get(sandbox, 1) - 1
            if left > 0:
                self._holding[sandbox] = left
            else:
                self._holding.pop(sandbox, None)

    def _spawn_hold(self, coro: Any) -> None:
        """Run a hold in the background; the flow stays intercepted until it
        resumes it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._hold_tasks.add(task)
        task.add_done_callback(self._hold_tasks.discard)

    def secret(self, op: str, sandbox: str, host: str) -> dict[str, Any]:
        """An `inject` (the key for this host) or `secret` (custom
        substitutions) reply, cached for at most SECRET_TTL and one generation.
        Which service's key goes to which host is the daemon's to decide."""
        key = (op, sandbox, host)
        hit = self._secrets.get(key)
        now = time.monotonic()
        if hit is not None and hit[0] > now:
            return hit[1]
        r = self._ask({"op": op, "sandbox": sandbox, "host": host})
        if r.get("ok") or r.get("reason") == "no-secret":
            self._secrets[key] = (now + SECRET_TTL, r)
        return r

    # ---- flow log ------------------------------------------------------

    def log_flow(self, **fields: Any) -> bool:
        """Append one flow to flows.jsonl; whether it was (a denial may be
        throttled, see `_throttle`)."""
        if fields.get("decision") == "deny":
            suppressed = self._throttle(fields)
            if suppressed is None:
                return False
            fields["suppressed"] = suppressed
        g = fields.get
        record = {
            "sandbox": g("sandbox"),
            "timestamp": now_rfc3339(),
            "kind": g("kind"),
            "host": g("host"),
            "ip": g("ip"),
            "port": g("port"),
            "method": g("method"),
            "path": g("path"),
            "status": g("status"),
            "decision": g("decision"),
            "matched_rule": g("matched_rule"),
            "bytes_out": g("bytes_out", 0),
            "bytes_in": g("bytes_in", 0),
            "duration_ms": g("duration_ms"),
        }
        if (resolved := g("resolved")) is not None:
            # false: the name does not resolve to `ip` (and was refused).
            record["resolved"] = resolved
        if chain := g("chain"):
            # The aliases the name resolved through (bounded by CHAIN_MAX).
            record["chain"] = list(chain)
        if reason := g("reason"):
            # Only where a denial has no 403 body to say why (refused DNS
            # queries and answers, bodies cut off mid-stream); never a
            # secret: the addon's own words.
            record["reason"] = reason
        if g("suppressed"):
            # Lines of this sandbox not logged since its previous one (the
            # throttle of `_throttle`).
            record["suppressed"] = fields["suppressed"]
        if g("local"):
            # The destination is one of the host's own addresses: replay
            # must judge it as internal (ADR 0048).
            record["local"] = True
        if g("injected"):
            # A key went into this request: `ppp policy suggest` marks the
            # host (ADR 0048). Whether, never which or what.
            record["injected"] = True
        if not self.state_dir:
            return True
        line = (_JSON.encode(record) + "\n").encode()
        try:
            os.write(self._flow_fd(), line)  # one write: concurrent appenders never interleave
            self._flow_log_size += len(line)
            if self._flow_log_size > FLOW_LOG_MAX:
                self._rotate_flow_log()
        except OSError as e:
            self._close_flow_log()
            log.warning("ppp: could not append to flows.jsonl: %s", e)
        return True

    def _rotate_flow_log(self) -> None:
        """flows.jsonl -> flows.jsonl.1 (replacing the older one): the log
        holds at most twice FLOW_LOG_MAX. Readers (`ppp policy log`, the
        TUI) read the rotated file after the current one."""
        self._close_flow_log()
        os.replace(self._flow_path, self._flow_path + ".1")

    def _flow_fd(self) -> int:
        """The open flows.jsonl, reopened when the file was replaced or
        removed (checked at most once a second): opening it for every flow
        cost 3% of mitmdump's time."""
        path = self._flow_path
        now = time.monotonic()
        if self._flow_log is not None and now - self._flow_log[1] > FLOW_LOG_RECHECK:
            try:
                same = os.stat(path).st_ino == os.fstat(self._flow_log[0]).st_ino
            except OSError:
                same = False
            if same:
                self._flow_log = (self._flow_log[0], now)
            else:
                self._close_flow_log()
        if self._flow_log is None:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._flow_log = (fd, now)
            self._flow_log_size = os.fstat(fd).st_size
        return self._flow_log[0]

    def _close_flow_log(self) -> None:
        if self._flow_log is not None:
            try:
                os.close(self._flow_log[0])
            except OSError:
                pass
            self._flow_log = None

    # ---- helpers -------------------------------------------------------

    @staticmethod
    def _addr(server: connection.Server) -> tuple[str | None, int | None]:
        address = server.address
        if address:
            return ip_text(str(address[0])), int(address[1])
        return None, None

    @staticmethod
    def hint(sandbox: str | None, host: str | None) -> str:
        if sandbox and host:
            return f"ppp policy allow network --sandbox {sandbox} {host}"
        return "ppp policy allow network --sandbox <name> <host>"

    def _deny_http(self, flow: http.HTTPFlow, sandbox: str | None, host: str | None, v: Verdict) -> None:
        """Answer 403 with why, and a fix only where one helps: allowing a
        host again does nothing for a flow refused for another reason."""
        fix: str | None = None
        if v.tls:
            # The ClientHello was refused: what to allow is its SNI, not
            # whatever the request inside names.
            host = v.sni
        if v.kind == "policy" and v.rule_id is not None:
            why = f"blocked by ppp policy rule {v.rule_id} ({v.resource})"
            fix = self.hint(sandbox, host)
        elif v.kind == "policy" and v.reason.startswith("default"):
            why = "blocked by ppp policy: default deny"
            fix = self.hint(sandbox, host)
        elif v.kind == "policy":
            why = f"blocked by ppp: {v.reason}"
            fix = self.hint(sandbox, host)
        elif v.kind == "address":
            why = f"blocked by ppp: {v.reason}"
            fix = self.hint(sandbox, v.allow_target)
        elif v.kind == "unresolved":
            why = f"blocked by ppp: {v.reason}"
            fix = "connect to an address that the sandbox's DNS (10.0.0.53) returns for the name"
        elif v.kind == "alias":
            # Allowing the name changes nothing: the deny on its alias wins.
            why = f"blocked by ppp: {v.reason}"
        elif v.kind == "mismatch":
            why = f"blocked by ppp: {v.reason}"
            fix = "send the same host name in the TLS SNI, the Host header and the request target"
        elif v.kind == "daemon":
            why = f"blocked by ppp: {v.reason}"
            fix = "on the host: ppp daemon status (then ppp daemon start)"
        else:
            why = f"blocked by ppp: {v.reason}"
        if v.tls:
            why = f"{why} (refused at the TLS handshake, by its SNI)"
        body = f"{why}\nhost: {host}\n"
        if v.allow_target is not None:
            body += f"address: {v.allow_target}\n"
        if fix is not None:
            prefix = "to allow" if fix.startswith("ppp policy allow") else "to fix"
            body += f"{prefix}: {fix}\n"
        flow.response = http.Response.make(403, body.encode(), {"content-type": "text/plain; charset=utf-8"})
        self._mark(flow, sandbox, host, v, False)
        if v.kind == "unresolved":
            flow.metadata["ppp"]["resolved"] = False
        log.info("ppp: [%s] denied HTTP %s: %s", sandbox, host, why)

    @staticmethod
    def _mark(flow: Any, sandbox: str | None, host: str | None, v: Verdict, allowed: bool, *addr: Any) -> None:
        """flow.metadata["ppp"]; with `ip, port` when given."""
        meta = {
            "sandbox": sandbox,
            "host": host,
            "decision": "allow" if allowed else "deny",
            "matched_rule": v.rule_id,
        }
        if addr:
            meta["ip"], meta["port"] = addr
        if v.approval is not None:
            meta["approval"] = v.approval
        if v.chain:
            meta["chain"] = v.chain
        if v.local:
            meta["local"] = True
        flow.metadata["ppp"] = meta

    def _limit(self, flow: http.HTTPFlow, direction: str) -> int:
        """The flow's limit for `direction` ("upload" or "download") in
        bytes, 0 for none. The daemon decided it with the policy; only one
        case is the addon's: the default upload limit is an exfiltration
        gate, and a request that carries an injected key goes to the
        service the key is for (LLM APIs take tens of MiB)."""
        meta = flow.metadata.get("ppp") or {}
        applied = (meta.get("limits") or {}).get(direction) or {}
        if direction == "upload" and applied.get("from") == "default" and meta.get("key_injected"):
            return 0
        return int(applied.get("bytes") or 0)

    def _raise_hint(self, flow: http.HTTPFlow, direction: str, limit: int) -> str:
        """The command that raises the limit a flow hit: a rule of its own
        for this host in this sandbox, at twice the limit or more."""
        meta = flow.metadata.get("ppp") or {}
        target = meta.get("host") or meta.get("ip") or flow.request.pretty_host
        size = _size_text(max(limit * 2, 1 << 20))
        return f"ppp policy allow network --sandbox {meta.get('sandbox') or '<name>'} --{direction} {size} {target}"

    def _too_large(self, flow: http.HTTPFlow, direction: str, limit: int) -> None:
        meta = flow.metadata.setdefault("ppp", {})
        applied = (meta.get("limits") or {}).get(direction) or {}
        where = {
            "rule": "the rule that allows this host",
            "sandbox": "this sandbox's policy",
            "global": "the global policy",
        }.get(applied.get("from"), "ppp's default")
        what = "request" if direction == "upload" else "response"
        body = (
            f"blocked by ppp: the {what} body is larger than the {direction} limit of {_size_text(limit)} "
            f"({where})\nto raise it: {self._raise_hint(flow, direction, limit)}\n"
        )
        flow.response = http.Response.make(413, body.encode(), {"content-type": "text/plain; charset=utf-8"})
        meta["decision"] = "deny"
        log.info("ppp: %s body over %d bytes refused for %s", what, limit, flow.request.pretty_host)

    # ---- TLS and connections -------------------------------------------

    # A hook may return an awaitable, which mitmproxy awaits with the layer
    # paused (addonmanager.async_invoke_addon): a request held for approval
    # costs a coroutine, every other one stays a plain call.

    def tls_clienthello(self, data: tls.ClientHelloData) -> Any:
        client = data.context.client
        sandbox = host = ip = port = None
        try:
            host = canonical_host(data.client_hello.sni)
            ip, port = self._addr(data.context.server)
            sandbox = self.sandbox_of(client)
            if sandbox is None:
                v = deny(f"unknown WireGuard port {self._port(client)}")
            elif port is None:
                v = deny("no destination address")
            elif host == LOCAL_HOST:
                v = LOCAL
            elif (cached := self._cached(sandbox, host, ip, port, "tls")) is None:
                return self._tls_asked(client, sandbox, host, ip, port)
            else:
                v = cached
        except Exception as e:  # noqa: BLE001 - never crash mitmdump; deny
            log.exception("ppp: tls_clienthello failed, denying")
            v = deny(f"internal error: {type(e).__name__}")
        if v.kind == "ask" and sandbox is not None and port is not None:
            return self._tls_held(client, sandbox, host, ip, port)
        self._tls_decided(client, sandbox, host, ip, port, v)
        return None

    async def _tls_asked(self, client: connection.Client, sandbox: str, host: str | None, ip: str | None, port: int) -> None:
        v = await self._asked(client, sandbox, host, ip, port, "tls")
        if v.kind == "ask":
            await self._tls_held(client, sandbox, host, ip, port)
        else:
            self._tls_decided(client, sandbox, host, ip, port, v)

    async def _tls_held(self, client: connection.Client, sandbox: str, host: str | None, ip: str | None, port: int) -> None:
        v = await self._hold(client, sandbox, host, ip, port, "tls")
        if v.allow:
            # Approved for this connection and this name: the requests
            # inside (the Host must equal the SNI) are not held again.
            self._approved[client.id] = (host, v)
        self._tls_decided(client, sandbox, host, ip, port, v)

    def _tls_decided(
        self, client: connection.Client, sandbox: str | None, host: str | None, ip: str | None, port: int | None, v: Verdict
    ) -> None:
        # Allowed ClientHellos are logged too: the SNI decision is a flow
        # of its own (a connection may carry no request, or one mitmproxy
        # passes through), and `ppp policy replay` re-decides it.
        self.log_flow(
            sandbox=sandbox,
            kind="tls",
            host=host,
            ip=ip,
            port=port,
            decision="allow" if v.allow else "deny",
            matched_rule=v.rule_id,
            resolved=False if v.kind == "unresolved" else None,
            chain=v.chain,
            local=v.local,
        )
        if not v.allow:
            self._denied[client.id] = dataclasses.replace(v, tls=True, sni=host)
            log.info("ppp: [%s] denied TLS %s (%s:%s): %s", sandbox, host, ip, port, v.reason)

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        try:
            v = self._denied.get(data.client.id)
            if v is None and self.sandbox_of(data.client) is None:
                v = deny(f"unknown WireGuard port {self._port(data.client)}")
        except Exception:  # noqa: BLE001
            log.exception("ppp: server_connect failed, refusing")
            v = deny("internal error")
        if v is not None:
            data.server.error = f"ppp: denied by policy: {v.reason}"

    def client_disconnected(self, client: connection.Client) -> None:
        if (key := self._counted.pop(client.id, None)) is not None:
            n = self._open.get(key, 1) - 1
            if n > 0:
                self._open[key] = n
            else:
                self._open.pop(key, None)
            held = self._held.get(key[0])
            if held is not None:
                held.pop(client.id, None)
                if not held:
                    del self._held[key[0]]
        self._upstreams.pop(client.id, None)
        if (port := self._evicted.pop(client.id, None)) is not None:
            n = self._closing.get(port, 1) - 1
            if n > 0:
                self._closing[port] = n
            else:
                self._closing.pop(port, None)
        self._denied.pop(client.id, None)
        self._approved.pop(client.id, None)
        HELD_WAITED.pop(client.id, None)

    def _approved_for(self, client: connection.Client, host: str | None) -> Verdict | None:
        """The approval of this connection's ClientHello, if it was for
        `host`."""
        a = self._approved.get(client.id)
        return a[1] if a is not None and a[0] == host else None

    @staticmethod
    def _port(client: connection.Client) -> int | None:
        mode = client.proxy_mode
        return mode.listen_port() if isinstance(mode, mode_specs.WireGuardMode) else None

    def _start_stream(self, flow: tcp.TCPFlow | udp.UDPFlow, kind: str) -> Any:
        sandbox = host = ip = port = None
        try:
            ip, port = self._addr(flow.server_conn)
            host = canonical_host(flow.client_conn.sni)
            sandbox = self.sandbox_of(flow.client_conn)
            prior = self._denied.get(flow.client_conn.id)
            if sandbox is None:
                v = deny(f"unknown WireGuard port {self._port(flow.client_conn)}")
            elif prior is not None:
                v = prior
            elif port is None:
                v = deny("no destination address")
            elif (v := self._cached(sandbox, host, ip, port, kind)) is None:
                return self._stream_asked(flow, kind, sandbox, host, ip, port)
            elif v.kind == "ask" and (approved := self._approved_for(flow.client_conn, host)) is not None:
                v = approved
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: %s_start failed, denying", kind)
            v = deny(f"internal error: {type(e).__name__}")
        if v.kind == "ask" and sandbox is not None and port is not None:
            return self._stream_held(flow, kind, sandbox, host, ip, port)
        self._stream_decided(flow, kind, sandbox, host, ip, port, v)
        return None

    async def _stream_asked(
        self, flow: tcp.TCPFlow | udp.UDPFlow, kind: str, sandbox: str, host: str | None, ip: str | None, port: int
    ) -> None:
        v = await self._asked(flow.client_conn, sandbox, host, ip, port, kind)
        if v.kind == "ask" and (approved := self._approved_for(flow.client_conn, host)) is not None:
            v = approved
        if v.kind == "ask":
            await self._stream_held(flow, kind, sandbox, host, ip, port)
        else:
            self._stream_decided(flow, kind, sandbox, host, ip, port, v)

    async def _stream_held(
        self, flow: tcp.TCPFlow | udp.UDPFlow, kind: str, sandbox: str, host: str | None, ip: str | None, port: int
    ) -> None:
        v = await self._hold(flow.client_conn, sandbox, host, ip, port, kind)
        self._stream_decided(flow, kind, sandbox, host, ip, port, v)

    def _stream_decided(
        self,
        flow: tcp.TCPFlow | udp.UDPFlow,
        kind: str,
        sandbox: str | None,
        host: str | None,
        ip: str | None,
        port: int | None,
        v: Verdict,
    ) -> None:
        self._mark(flow, sandbox, host or ip, v, v.allow)
        flow.metadata["ppp"].update(kind=kind, ip=ip, port=port)
        if v.allow and sandbox is not None and port is not None:
            self._live[flow.id] = (flow, sandbox, host, ip, port, kind)
        if not v.allow:
            self._denied[flow.client_conn.id] = v
            if flow.killable:
                flow.kill()
            log.info("ppp: [%s] denied %s %s:%s: %s", sandbox, kind.upper(), ip, port, v.reason)
            try:
                self._log_stream(flow)
            except Exception:  # noqa: BLE001
                log.exception("ppp: could not log a denied %s flow", kind)

    def tcp_start(self, flow: tcp.TCPFlow) -> Any:
        return self._start_stream(flow, "tcp")

    def udp_start(self, flow: udp.UDPFlow) -> Any:
        return self._start_stream(flow, "udp")

    def _log_stream(self, flow: tcp.TCPFlow | udp.UDPFlow) -> None:
        meta = flow.metadata.get("ppp")
        if not meta or meta.get("logged"):
            return
        meta["logged"] = True
        # Counted by the message hooks, which drop each message once relayed.
        out = meta.get("bytes_out", 0) + sum(len(m.content) for m in flow.messages if m.from_client)
        inn = meta.get("bytes_in", 0) + sum(len(m.content) for m in flow.messages if not m.from_client)
        self.log_flow(
            sandbox=meta.get("sandbox"),
            kind=meta.get("kind"),
            host=meta.get("host"),
            ip=meta.get("ip"),
            port=meta.get("port"),
            decision=meta.get("decision"),
            matched_rule=meta.get("matched_rule"),
            bytes_out=out,
            bytes_in=inn,
            chain=meta.get("chain"),
            local=meta.get("local"),
            duration_ms=duration_ms(flow.timestamp_created),
        )

    def tcp_end(self, flow: tcp.TCPFlow) -> None:
        self._live.pop(flow.id, None)
        self._log_stream(flow)

    def tcp_error(self, flow: tcp.TCPFlow) -> None:
        self._live.pop(flow.id, None)
        self._log_stream(flow)

    def udp_end(self, flow: udp.UDPFlow) -> None:
        self._live.pop(flow.id, None)
        self._log_stream(flow)

    def udp_error(self, flow: udp.UDPFlow) -> None:
        self._live.pop(flow.id, None)
        self._log_stream(flow)

    # ---- DNS -----------------------------------------------------------

    def dns_request(self, flow: dns.DNSFlow) -> None:
        sandbox = None
        name = None
        try:
            sandbox = self.sandbox_of(flow.client_conn)
            q = flow.request.question
            name = canonical_host(q.name) if q is not None else None
            server = flow.server_conn.address
            dest = (ip_text(str(server[0])), int(server[1])) if server is not None else None
            if sandbox is None:
                v = deny(f"unknown WireGuard port {self._port(flow.client_conn)}")
            elif dest is None or (dest != TUNNEL_DNS and self._forwarded.get(flow.client_conn.id) != dest):
                # Only ppp's resolver answers: a query to any other server
                # would carry the guest's bytes to the guest's choice.
                v = deny("DNS goes only to ppp's resolver at 10.0.0.53", "policy")
            elif name is None:
                v = deny("a DNS query without a question")
            else:
                v = self.decide(sandbox, name, None, 53, "dns")
                # Forward the question alone: EDNS options and additional or
                # authority records are the guest's own bytes.
                flow.request.additionals = []
                flow.request.authorities = []
                if v.allow:
                    self._forward_dns(flow, q)
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: dns_request failed, refusing")
            v = deny(f"internal error: {type(e).__name__}")
        if not v.allow:
            self._refuse_dns(flow, sandbox, name, v, "query")
        else:
            try:
                self._log_dns(flow, sandbox, name, v, allowed=True)
            except Exception:  # noqa: BLE001
                log.exception("ppp: could not log an allowed DNS query")

    def _forward_dns(self, flow: dns.DNSFlow, q: Any) -> None:
        """Send an allowed address question to the host's name server
        rather than let mitmproxy's resolver answer it: that resolver hands
        back bare addresses under the name asked, so the aliases (CNAME,
        DNAME) that led to them, which `dns_response` must judge, would be
        lost. Other questions mitmproxy forwards already. Without a name
        server known, mitmproxy's resolver answers (getaddrinfo: no aliases
        to judge; docs/addon.md says so)."""
        if (
            q.type not in (dns.types.A, dns.types.AAAA)
            or q.class_ != dns.classes.IN
            or flow.request.op_code != dns.op_codes.QUERY
        ):
            return
        resolver = ctx.master.addons.get("dnsresolver")
        servers = resolver.name_servers() if resolver is not None else []
        if not servers:
            return
        dest = (ip_text(servers[0]), 53)
        flow.server_conn.address = (servers[0], 53)
        # The guest's next question on this socket (glibc asks A and AAAA
        # on one) finds the server already pointed there.
        self._forwarded[flow.client_conn.id] = dest

    def dns_response(self, flow: dns.DNSFlow) -> None:
        """The DNS-rebinding defence, applied to answers.

        `dns_request` only sees the name. When the answer for an allowed name
        holds an internal address, the whole answer is refused unless a rule
        for that address allows it: the same `check` the HTTP, TLS and TCP
        paths make once the guest connects. Refusing here as well matters for
        what never reaches the tunnel: a name rebound to 127.0.0.1 makes the
        guest talk to its own loopback, where no connection check can see it.
        The port asked is 53, like `dns_request`'s: which port the guest will
        use is unknown here, so an address rule limited to another port does
        not open the name (the connection checks still judge that port).
        """
        sandbox = None
        name = None
        v: Verdict | None = None
        addrs: list[str] = []
        ttl = 0
        try:
            resp = flow.response
            if resp is not None:
                # The guest gets the answers alone: additional and authority
                # records are a channel the policy never looked at.
                resp.additionals = []
                resp.authorities = []
            # Nothing to check: no answer, or our own refusal coming back.
            if resp is None or not resp.answers:
                return
            q = flow.request.question
            name = canonical_host(q.name) if q is not None else None
            sandbox = self.sandbox_of(flow.client_conn)
            chain = self._dns_chain(name, resp.answers)
            if sandbox is None:
                v = deny(f"unknown WireGuard port {self._port(flow.client_conn)}")
            elif chain is None:
                v = deny(f"{name} resolves through more than {CHAIN_MAX} aliases", "alias")
            elif chain and not (v := self.decide(sandbox, name, None, 53, "dns", chain)).allow:
                pass
            else:
                for rr in resp.answers:
                    if rr.type == dns.types.A:
                        addr = parse_ip(str(rr.ipv4_address))
                    elif rr.type == dns.types.AAAA:
                        addr = parse_ip(str(rr.ipv6_address))
                    else:
                        continue  # CNAME and the like carry no address
                    if addr is None:
                        v = deny("an address record that does not parse")
                        break
                    v = self.decide(sandbox, name, str(addr), 53, "dns", chain)
                    if not v.allow:
                        break
                    addrs.append(str(addr))
                    ttl = rr.ttl if not ttl else min(ttl, rr.ttl)
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: dns_response failed, refusing")
            v = deny(f"internal error: {type(e).__name__}")
        if v is not None and not v.allow:
            self._refuse_dns(flow, sandbox, name, v, "answer")
        elif sandbox is not None and name is not None and addrs:
            self._record_answer(sandbox, name, addrs, ttl, chain or ())

    @staticmethod
    def _dns_chain(name: str | None, answers: list[Any]) -> tuple[str, ...] | None:
        """Every other name in an answer section: each record's owner and
        each CNAME or DNAME target, canonical, in order, without repeats.
        A record for a name the chain never reached is in too: a guest's
        resolver may use it. None past CHAIN_MAX names."""
        out: list[str] = []
        for rr in answers:
            names = [rr.name]
            if rr.type in (dns.types.CNAME, dns.types.DNAME):
                names.append(rr.domain_name)
            for n in names:
                c = canonical_host(n)
                if c and c != name and c not in out:
                    out.append(c)
                    if len(out) > CHAIN_MAX:
                        return None
        return tuple(out)

    def _record_answer(self, sandbox: str, name: str, addrs: list[str], ttl: int, chain: tuple[str, ...] = ()) -> None:
        """Tell the daemon which addresses ppp's resolver gave this sandbox
        for `name`: a flow named `name` may go to these. Before the answer
        reaches the guest, so its connection never races the record. A
        failure is logged; the daemon then falls back to the host's own
        resolution."""
        try:
            req: dict[str, Any] = {"op": "resolved", "sandbox": sandbox, "name": name, "addrs": addrs, "ttl": int(ttl)}
            if chain:
                req["chain"] = list(chain)
            self._ask(req)
        except DaemonError as e:
            log.warning("ppp: [%s] could not record the DNS answer for %s: %s", sandbox, name, e)

    def _refuse_dns(self, flow: dns.DNSFlow, sandbox: str | None, name: str | None, v: Verdict, what: str) -> None:
        """Answer REFUSED (for a denied query, or an answer the rebinding
        defence refuses) and log it."""
        flow.response = flow.request.fail(response_codes.REFUSED)
        try:
            # proxy.log gets a line only when flows.jsonl does (throttled).
            if self._log_dns(flow, sandbox, name, v):
                log.info("ppp: [%s] refused the DNS %s for %s: %s", sandbox, what, name, v.reason)
        except Exception:  # noqa: BLE001
            log.exception("ppp: could not log a refused DNS %s", what)

    def _log_dns(
        self, flow: dns.DNSFlow, sandbox: str | None, name: str | None, v: Verdict, allowed: bool = False
    ) -> bool:
        """Log a refused query or answer unless throttled, or an allowed
        query (the question's decision, which `ppp policy suggest` and
        `replay` need: by name, on port 53); whether it was logged."""
        ip, port = self._addr(flow.server_conn)
        if allowed:
            # Only ppp's resolver gets an allowed question (dns_request);
            # the address it is forwarded to is ppp's choice, not the guest's.
            ip, port = TUNNEL_DNS
        return self.log_flow(
            sandbox=sandbox,
            kind="dns",
            chain=v.chain,
            host=name,
            ip=ip,
            # The port the guest sent to (5353 stays 5353).
            port=port if port is not None else 53,
            status=None if allowed else "REFUSED",
            decision="allow" if allowed else "deny",
            matched_rule=v.rule_id,
            bytes_out=len(flow.request.packed),
            reason=None if allowed else v.reason,
        )

    def _throttle(self, fields: dict[str, Any]) -> int | None:
        """Whether a denial is logged: None when it is not, else how many of
        this sandbox's denials were not logged since its last logged one.
        A guest chooses how many refused queries and connections it makes,
        and to which names, so each (sandbox, kind, name, port) of a DNS,
        TLS, TCP or UDP denial is logged once per LOG_WINDOW, and each
        sandbox's denials at most LOG_BUDGET times per LOG_WINDOW. Allowed
        flows are always logged."""
        now = time.monotonic()
        sandbox = fields.get("sandbox")
        key = (sandbox, fields.get("kind"), fields.get("host") or fields.get("ip"), fields.get("port"))
        budget = self._log_budget.get(sandbox)
        if budget is None or now - budget[0] >= LOG_WINDOW:
            budget = [now, 0, budget[2] if budget is not None else 0]
            self._log_budget[sandbox] = budget
        # HTTP denials are each worth a line (each is a request, each got a
        # response that says why), within the sandbox's budget.
        last = self._logged.get(key) if fields.get("kind") != "http" else None
        if (last is not None and now - last < LOG_WINDOW) or budget[1] >= LOG_BUDGET:
            budget[2] += 1
            return None
        self._logged[key] = now
        budget[1] += 1
        suppressed, budget[2] = budget[2], 0
        return suppressed

    # ---- HTTP ----------------------------------------------------------

    def _http_decide(
        self, flow: http.HTTPFlow, off_loop: bool = True
    ) -> tuple[str, str | None, str | None, int, Verdict | None] | None:
        """Decide a request and mark it; or return what to go on with
        (sandbox, host, ip, port, and the verdict): when the default leaves
        it to the user (an `ask` verdict), or, with `off_loop`, when the
        daemon must be asked (None: `_asked` does)."""
        sandbox = None
        host = None
        try:
            sandbox = self.sandbox_of(flow.client_conn)
            ip, port = self._addr(flow.server_conn)
            if ip is None:
                ip = ip_text(flow.request.host)
            if port is None:
                port = flow.request.port
            host, mismatch = request_name(flow)
            prior = self._denied.get(flow.client_conn.id)
            if sandbox is None:
                v = deny(f"unknown WireGuard port {self._port(flow.client_conn)}")
            elif prior is not None:
                v = prior
            elif mismatch is not None:
                v = deny(mismatch, "mismatch")
            elif host == LOCAL_HOST:
                self._mark(flow, sandbox, host, LOCAL, True, ip, port)
                self._serve_local(flow)
                return
            else:
                if off_loop:
                    if (cached := self._cached(sandbox, host, ip, port, "http")) is None:
                        return (sandbox, host, ip, port, None)
                    v = cached
                else:
                    v = self.decide(sandbox, host, ip, port, "http")
                if v.kind == "ask" and (approved := self._approved_for(flow.client_conn, host)) is not None:
                    v = approved
            if v.kind == "ask" and sandbox is not None and port is not None:
                return (sandbox, host, ip, port, v)
            self._http_decided(flow, sandbox, host, ip, port, v)
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: HTTP policy check failed, denying")
            self._deny_http(flow, sandbox, host, deny(f"internal error: {type(e).__name__}"))
        return None

    def _http_decided(
        self, flow: http.HTTPFlow, sandbox: str | None, host: str | None, ip: str | None, port: int | None, v: Verdict
    ) -> None:
        try:
            if not v.allow:
                self._deny_http(flow, sandbox, host, v)
                return
            self._mark(flow, sandbox, host, v, True, ip, port)
            meta = flow.metadata["ppp"]
            named = host is not None and ip_text(host) is None
            # The daemon refused every name that does not resolve to `ip`.
            meta["resolved"] = True if named and ip is not None else None
            # A secret goes only where the guest cannot redirect it: TLS on
            # both legs (the upstream's certificate verified for the name,
            # which mitmproxy does against the SNI it sends: the client's),
            # and SNI, Host and target all naming the service's host.
            client = flow.client_conn
            meta["secret_ok"] = (
                named
                and client.tls_established
                and flow.request.scheme == "https"
                and canonical_host(client.sni) == host
                and not self._ssl_insecure
            )
            meta["limits"] = v.limits
            if flow.request.authority and flow.request.http_version.startswith("HTTP/1"):
                # Absolute-form: forward origin-form, so an upstream that
                # routes by the target sees the name that was decided.
                flow.request.authority = ""
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: HTTP policy check failed, denying")
            self._deny_http(flow, sandbox, host, deny(f"internal error: {type(e).__name__}"))

    @staticmethod
    def _serve_local(flow: http.HTTPFlow) -> None:
        """Answer mitm.it: the CA certificate at /cert/pem, 404 otherwise."""
        path = flow.request.path.split("?", 1)[0]
        if flow.request.method in ("GET", "HEAD") and path == "/cert/pem":
            confdir = os.path.expanduser(ctx.options.confdir)
            with open(os.path.join(confdir, "mitmproxy-ca-cert.pem"), "rb") as f:
                pem = f.read()
            flow.response = http.Response.make(200, pem, {"content-type": "application/x-x509-ca-cert"})
        else:
            flow.response = http.Response.make(
                404, b"ppp serves only /cert/pem on mitm.it\n", {"content-type": "text/plain; charset=utf-8"}
            )

    def requestheaders(self, flow: http.HTTPFlow) -> Any:
        held = self._http_decide(flow)
        if held is not None:
            return self._http_held(flow, *held)
        self._after_headers(flow)
        return None

    async def _http_held(
        self, flow: http.HTTPFlow, sandbox: str, host: str | None, ip: str | None, port: int, v: Verdict | None
    ) -> None:
        if v is None:
            v = await self._asked(flow.client_conn, sandbox, host, ip, port, "http")
            if v.kind == "ask" and (approved := self._approved_for(flow.client_conn, host)) is not None:
                v = approved
            if v.kind != "ask":
                self._http_decided(flow, sandbox, host, ip, port, v)
                self._after_headers(flow)
                return
        req = flow.request
        # The path without its query, which can carry secrets; bounded.
        path = req.path.split("?", 1)[0][:1024]
        cl = header_text(req.headers, b"content-length").strip()
        v = await self._hold(
            flow.client_conn, sandbox, host, ip, port, "http", req.method[:16], path, int(cl) if cl.isdigit() else None
        )
        self._http_decided(flow, sandbox, host, ip, port, v)
        self._after_headers(flow)

    def _after_headers(self, flow: http.HTTPFlow) -> None:
        try:
            meta = flow.metadata.get("ppp", {})
            if flow.response is None and meta.get("decision") == "allow":
                if self._header_bytes(flow.request) > MAX_HEADER_BYTES:
                    self._refuse_headers(flow)
                else:
                    # Headers only (placeholders are substituted in headers,
                    # never in bodies), so the body can be streamed: the key
                    # goes in now, before mitmproxy sends the headers on.
                    meta["injected"] = True
                    if meta.get("secret_ok"):
                        self._inject(flow, meta["sandbox"], meta["host"])
            if flow.response is None:
                # The limit is known once the key is in: the default upload
                # limit does not apply to a request that carries one.
                limit = self._limit(flow, "upload")
                cl = header_text(flow.request.headers, b"content-length")
                if limit and cl and cl.strip().isdigit() and int(cl) > limit:
                    self._too_large(flow, "upload", limit)
            if flow.response is None:
                # Streamed as it arrives, counted against the limit; never
                # held whole in memory.
                flow.request.stream = self._counter(flow, "request", self._limit(flow, "upload"))
            else:
                self._refused_body(flow)
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: requestheaders failed, denying")
            self._deny_http(flow, meta.get("sandbox"), meta.get("host"), deny(f"internal error: {type(e).__name__}"))
            self._refused_body(flow)

    def request(self, flow: http.HTTPFlow) -> None:
        if "ppp" not in flow.metadata and (held := self._http_decide(flow, off_loop=False)) is not None:
            # requestheaders did not run (e.g. a replayed flow), and nobody
            # is asked about a flow that is not the guest's own.
            self._http_decided(flow, *held[:4], deny("only a request from the guest is held for approval", "policy"))
        meta = flow.metadata.get("ppp", {})
        if flow.response is not None or meta.get("decision") != "allow":
            return
        try:
            limit = self._limit(flow, "upload")
            raw = flow.request.raw_content
            if raw is not None and limit and len(raw) > limit:
                # A body that was buffered after all (a replayed flow).
                self._too_large(flow, "upload", limit)
                return
            if meta.get("secret_ok") and not meta.get("injected"):
                self._inject(flow, meta["sandbox"], meta["host"])
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: secret injection failed, denying")
            self._deny_http(flow, meta.get("sandbox"), meta.get("host"), deny(f"internal error: {type(e).__name__}"))

    def _inject(self, flow: http.HTTPFlow, sandbox: str, host: str | None) -> None:
        """Inject the key and substitute placeholders. Polled here, never
        trusted from the decision: a hold for approval, or a turn in the
        decision queue, may lie between the two, and a key revoked
        meanwhile must not be served from the cache (two stats)."""
        if not host:
            return
        try:
            self._poll()
            subs = self.secret("secret", sandbox, host)
            if not subs.get("ok"):
                raise DaemonError(f"substitutions: {subs.get('reason')}")
            pairs = [
                (s["placeholder"], s["value"])
                for s in subs.get("substitutions") or []
                if isinstance(s, dict) and s.get("placeholder") and isinstance(s.get("value"), str)
            ]
            headers = flow.request.headers
            # A placeholder of the user's in an authentication header is this
            # request's key, put there by the agent the user configured: the
            # service key stored for the host must not overwrite it (it would
            # strip that header). Either value goes only to a host it is
            # stored for; the daemon decided both (docs/adr/0041).
            own_key = bool(pairs) and any(
                p in v for name in AUTH_HEADERS for v in headers.get_all(name) for p, _ in pairs
            )
            if not own_key:
                fresh = ("inject", sandbox, host) not in self._secrets
                r = self.secret("inject", sandbox, host)
                if r.get("ok") and isinstance(r.get("header"), str) and isinstance(r.get("value"), str):
                    # An uncompressed answer, so that a key echoed back can
                    # be found and scrubbed.
                    headers.fields = _with_key(headers.fields, r["header"], r["value"], "accept-encoding", "identity")
                    flow.metadata["ppp"]["key_injected"] = True
                    self._scrub[flow.id] = [*self._scrub.get(flow.id, []), r["value"].encode()]
                    if fresh:
                        # Once per daemon answer, not per request: every log
                        # record, debug included, is formatted and dispatched
                        # to all addons by mitmproxy's handlers.
                        log.debug("ppp: [%s] injecting a key for %s", sandbox, host)
                elif r.get("reason") != "no-secret":
                    raise DaemonError(f"inject: {r.get('reason')}")
            if pairs:
                self._scrub[flow.id] = [*self._scrub.get(flow.id, []), *(v.encode() for _, v in pairs if v)]
                if own_key:
                    # Uncompressed, as for an injected key: the value must be
                    # found if echoed back.
                    headers["accept-encoding"] = "identity"
                for name in set(headers.keys()):
                    vals = headers.get_all(name)
                    new = [self._sub(v, pairs) for v in vals]
                    if new != vals:
                        headers.set_all(name, new)
        except DaemonError as e:
            log.warning("ppp: [%s] secrets unavailable for %s: %s", sandbox, host, e)
            # The daemon's error names host paths: the log has it, the
            # guest gets only what to do.
            body = f"ppp could not fetch the secret for {host}\nto fix: check `ppp daemon status` and `ppp secret ls` on the host\n"
            flow.response = http.Response.make(503, body.encode(), {"content-type": "text/plain; charset=utf-8"})

    @staticmethod
    def _sub(value: str, pairs: list[tuple[str, str]]) -> str:
        for p, secret in pairs:
            value = value.replace(p, secret)
        return value

    def _scrub_response(self, flow: http.HTTPFlow) -> None:
        """Keep the secret values this request carried out of the response
        (spec 5.4): an upstream that echoes a key back would hand it to the
        guest. Headers are scrubbed here, the body as it streams."""
        values = self._scrub.get(flow.id)
        if not values or flow.response is None:
            return
        scrubber = Scrubber(values)
        fields = flow.response.headers.fields
        # One search per secret in all values at once; a hit (perhaps only
        # across two values) scrubs each value.
        joined = b"\n".join([v for _, v in fields])
        if any(s in joined for s in scrubber.values):
            flow.response.headers.fields = tuple((k, scrubber.scrub(v)) for k, v in fields)
        previous = flow.response.stream
        if not callable(previous):
            flow.response.stream = scrubber
            return

        def scrub_then(chunk: bytes) -> bytes | list[bytes]:
            out = scrubber(chunk)
            if not out:
                return [] if chunk else b""
            assert isinstance(out, bytes)
            return previous(out)

        flow.response.stream = scrub_then

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        try:
            if flow.response is None or flow.metadata.get("ppp", {}).get("decision") != "allow":
                return
            limit = self._limit(flow, "download")
            cl = header_text(flow.response.headers, b"content-length")
            if limit and cl and cl.strip().isdigit() and int(cl) > limit:
                # Declared too large: answer 413 now and stream the upstream
                # body into the void, so it is never buffered. mitmproxy sends
                # these headers at once, then what `stream` returns per chunk;
                # the final call (with b"") emits the 413's body.
                self._too_large(flow, "download", limit)
                assert flow.response is not None
                body = flow.response.raw_content or b""
                sent = False

                def discard(chunk: bytes) -> bytes | list[bytes]:
                    nonlocal sent
                    if chunk == b"" and not sent:
                        sent = True
                        return body
                    # Not b"": an empty chunk would end a chunked body.
                    return []

                flow.response.stream = discard
                flow.metadata["ppp_too_large"] = "streamed"
            else:
                flow.response.stream = self._counter(flow, "response", limit)
                # Scrubbed before it is counted and passed on.
                self._scrub_response(flow)
        except Exception:  # noqa: BLE001
            log.exception("ppp: responseheaders failed")
            flow.kill()

    def response(self, flow: http.HTTPFlow) -> None:
        self._scrub.pop(flow.id, None)
        try:
            meta = flow.metadata.get("ppp", {})
            limit = self._limit(flow, "download")
            if (
                limit
                and meta.get("decision") == "allow"
                and flow.response is not None
                and flow.metadata.get("ppp_too_large") != "streamed"
                and len(flow.response.raw_content or b"") > limit
            ):
                # A body that was buffered after all (set by another addon).
                self._too_large(flow, "download", limit)
            self._log_http(flow)
        except Exception:  # noqa: BLE001
            log.exception("ppp: response hook failed")

    def error(self, flow: http.HTTPFlow) -> None:
        self._scrub.pop(flow.id, None)
        try:
            self._log_http(flow)
        except Exception:  # noqa: BLE001
            log.exception("ppp: error hook failed")

    # ---- bounded memory: bodies, headers, messages -----------------------

    def _counter(self, flow: http.HTTPFlow, what: str, limit: int) -> Any:
        """A `stream` callable that passes each chunk on and counts it into
        the flow's metadata (for the flow log); past `limit` (0: none) it
        drops the rest and aborts the flow. mitmproxy stores nothing of a
        streamed body (`store_streamed_bodies` is off)."""
        meta = flow.metadata.setdefault("ppp", {})
        key = "bytes_out" if what == "request" else "bytes_in"
        meta[key] = 0

        def count(chunk: bytes) -> bytes | list[bytes]:
            n = meta[key] + len(chunk)
            meta[key] = n
            if limit and n > limit:
                if not meta.get("aborted"):
                    direction = "upload" if what == "request" else "download"
                    meta["aborted"] = (
                        f"the {what} body exceeds the {direction} limit of {_size_text(limit)}; "
                        f"to raise it: {self._raise_hint(flow, direction, limit)}"
                    )
                    meta["decision"] = "deny"
                    meta["status"] = 413
                    log.info(
                        "ppp: [%s] %s body over %d bytes for %s: closing the connection",
                        meta.get("sandbox"),
                        what,
                        limit,
                        meta.get("host"),
                    )
                    self._abort(flow)
                # Not b"": an empty chunk would end a chunked body, and the
                # upstream would take the truncated body as complete.
                return []
            return chunk

        return count

    @staticmethod
    def _abort(flow: http.HTTPFlow) -> None:
        """Close the guest's connection now. `flow.kill()` does not stop a
        flow in transit (mitmproxy issue 4711), so the connection handler is
        asked to close the client: mitmproxy then closes the upstream
        connection too, mid-body, so the upstream never sees a complete
        request."""
        client = flow.client_conn
        try:
            proxyserver = ctx.master.addons.get("proxyserver")
            handler = proxyserver.connections.get(client.id) if proxyserver is not None else None
        except Exception:  # noqa: BLE001
            handler = None
        if handler is None:
            log.warning("ppp: no live connection to close for %s; dropping the rest of its body", client.id)
            return

        def close() -> None:
            try:
                handler.close_connection(client)
            except Exception:  # noqa: BLE001
                pass  # already gone

        # Not from inside the layer that is calling us.
        asyncio.get_running_loop().call_soon(close)

    def _refused_body(self, flow: http.HTTPFlow) -> None:
        """A request ppp answered at requestheaders: mitmproxy reads its whole
        body before sending the answer. A small declared body is let through
        (the guest then reads why); anything larger, chunked or of unknown
        length gets the connection closed instead of buffered."""
        req = flow.request
        cl = header_text(req.headers, b"content-length").strip()
        te = header_text(req.headers, b"transfer-encoding")
        if not te and cl.isdigit() and int(cl) <= REFUSED_BODY_DRAIN:
            return
        if not te and not cl:
            if req.http_version.startswith("HTTP/1"):
                return  # HTTP/1 without either has no body
            if req.method.upper() in ("GET", "HEAD", "OPTIONS", "DELETE", "TRACE"):
                # HTTP/2 and 3 mark the end of a request in a frame this hook
                # cannot see: a request that usually has no body is assumed
                # to have none (a gap: docs/addon.md, Known gaps).
                return
        if flow.killable:
            flow.kill()

    @staticmethod
    def _header_bytes(msg: http.Message) -> int:
        return sum(len(k) + len(v) + 4 for k, v in msg.headers.fields)

    def _refuse_headers(self, flow: http.HTTPFlow) -> None:
        body = f"blocked by ppp: the request header block exceeds {MAX_HEADER_BYTES} bytes\n"
        flow.response = http.Response.make(431, body.encode(), {"content-type": "text/plain; charset=utf-8"})
        meta = flow.metadata.setdefault("ppp", {})
        meta["decision"] = "deny"
        log.info("ppp: [%s] request headers over %d bytes refused", meta.get("sandbox"), MAX_HEADER_BYTES)

    @staticmethod
    def _count_message(flow: Any, messages: list[Any], from_client: bool, size: int, prefix: str = "bytes_") -> None:
        """Count a relayed TCP/UDP/WebSocket message for the flow log and
        drop it from the flow: mitmproxy appends every message to the flow
        for as long as the connection lives."""
        meta = flow.metadata.setdefault("ppp", {})
        key = prefix + ("out" if from_client else "in")
        meta[key] = meta.get(key, 0) + size
        # The hook is given the list with this message last; mitmproxy
        # sends the message from its own reference, so clearing is safe.
        messages.clear()

    def tcp_message(self, flow: tcp.TCPFlow) -> None:
        if flow.messages:
            m = flow.messages[-1]
            self._count_message(flow, flow.messages, m.from_client, len(m.content))

    def udp_message(self, flow: udp.UDPFlow) -> None:
        if flow.messages:
            m = flow.messages[-1]
            self._count_message(flow, flow.messages, m.from_client, len(m.content))

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        ws = flow.websocket
        if ws is not None and ws.messages:
            m = ws.messages[-1]
            self._count_message(flow, ws.messages, m.from_client, len(m.content), "ws_")

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        self._live.pop(flow.id, None)
        meta = flow.metadata.get("ppp")
        if meta is not None and meta.get("decision") == "allow":
            # The HTTP flow was logged at its 101; the stream gets a line
            # of its own with what it carried.
            self.log_flow(
                sandbox=meta.get("sandbox"),
                kind="websocket",
                host=meta.get("host"),
                ip=meta.get("ip"),
                port=meta.get("port"),
                decision="allow",
                matched_rule=meta.get("matched_rule"),
                bytes_out=meta.get("ws_out", 0),
                bytes_in=meta.get("ws_in", 0),
                duration_ms=duration_ms(flow.timestamp_created),
            )

    def _log_http(self, flow: http.HTTPFlow) -> None:
        meta = flow.metadata.get("ppp", {})
        if meta.get("logged"):
            return
        meta["logged"] = True
        if "ip" in meta and "port" in meta:
            ip, port = meta["ip"], meta["port"]
        else:
            ip, port = self._addr(flow.server_conn)
            ip, port = meta.get("ip", ip), meta.get("port", port)
        # Streamed bodies were counted as they passed; buffered ones are here.
        out = meta.get("bytes_out") or len(flow.request.raw_content or b"")
        inn = meta.get("bytes_in") or (len(flow.response.raw_content or b"") if flow.response else 0)
        status = flow.response.status_code if flow.response else None
        if meta.get("aborted"):
            status = meta.get("status", status)
        self.log_flow(
            sandbox=meta.get("sandbox"),
            kind="http",
            host=meta.get("host") or canonical_host(flow.request.pretty_host),
            ip=ip,
            port=port,
            method=flow.request.method,
            path=logged_path(flow.request.path),
            status=status,
            decision=meta.get("decision", "deny"),
            matched_rule=meta.get("matched_rule"),
            bytes_out=out,
            bytes_in=inn,
            reason=meta.get("aborted"),
            resolved=meta.get("resolved"),
            chain=meta.get("chain"),
            injected=meta.get("key_injected"),
            local=meta.get("local"),
            duration_ms=duration_ms(flow.request.timestamp_start),
        )


addons = [PppAddon()]
