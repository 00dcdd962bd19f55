"""Body, header, message and connection limits.

Bounds what a guest (or an upstream) can make mitmdump hold: the upload
and download limits the daemon decided per flow (`Limits._limit`; a body
over it is refused with 413 or cut mid-stream), header blocks
(MAX_HEADER_BYTES), the body of a refused request (REFUSED_BODY_DRAIN),
WebSocket messages, unanswered DNS queries per connection, and open
connections per sandbox (MAX_CONNECTIONS). Must never trust a declared
size: Content-Length only lets ppp refuse early, every streamed byte is
counted, and a body with no declared size is bounded as it arrives.
"""

from typing import Any

from mitmproxy import http

from .common import _size_text, close_soon, header_text, kill, log
from .state import State

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


# Client connections one sandbox may hold open at once, per transport (TCP,
# UDP). mitmproxy keeps an idle TCP connection for 10 minutes
# (`tcp_timeout`) and a UDP one for 20 s, each with its handler, buffers and
# perhaps an upstream socket from mitmdump's one descriptor table: without
# a bound a guest could open connections until mitmdump runs out of memory
# or descriptors for every sandbox. Agents' tools use far fewer (npm 15 per
# registry, pip 10, a browser about 256). Past it, the new connection is
# closed at once and the denial logged.
MAX_CONNECTIONS = 1024


class Limits(State):
    """The per-flow body limits, and the answers past them."""

    def __init__(self) -> None:
        super().__init__()

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
        }.get(str(applied.get("from")), "ppp's default")
        what = "request" if direction == "upload" else "response"
        body = (
            f"blocked by ppp: the {what} body is larger than the {direction} limit of {_size_text(limit)} "
            f"({where})\nto raise it: {self._raise_hint(flow, direction, limit)}\n"
        )
        flow.response = http.Response.make(413, body.encode(), {"content-type": "text/plain; charset=utf-8"})
        meta["decision"] = "deny"
        log.info("ppp: %s body over %d bytes refused for %s", what, limit, flow.request.pretty_host)

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
        if not close_soon(client):
            log.warning("ppp: no live connection to close for %s; dropping the rest of its body", client.id)

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
            kill(flow)

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
