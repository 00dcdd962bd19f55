"""Every change ppp makes to mitmproxy's own code, in one place.

mitmproxy 12.2.3 has no option for several bounds ppp needs; each function
here wraps one mitmproxy method once (a flag on the wrapper keeps a second
load from wrapping it again) and says which file and which method, so an
upgrade of mitmproxy is checked here first. Bounds: HTTP/1 header blocks,
the body buffered for a refused request, WebSocket messages, the DNS
layer's answered flows; besides, the framing of converted request bodies,
the per-flow streaming notes and the hook lookup. Decides no policy. Must
never trust the guest's framing: every bound holds whatever the bytes
claim. `install` applies them all, from the entry file's `load`.
"""

import asyncio
import inspect
import logging
from typing import Any

# Imported from where mitmproxy defines them (its own modules import them
# without re-exporting): the same objects the patched methods use.
from h11._receivebuffer import ReceiveBuffer
from mitmproxy import addonmanager
from mitmproxy import exceptions as mitm_exceptions
from mitmproxy import flow as mitm_flow
from mitmproxy.proxy import commands
from mitmproxy.proxy import events as proxy_events
from mitmproxy.proxy import server as proxy_server
from mitmproxy.proxy.layers import dns as dns_layer
from mitmproxy.proxy.layers import http as http_layer
from mitmproxy.proxy.layers import websocket as ws_layer
from mitmproxy.proxy.layers.http import _http1
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import ErrorCode, RequestData, RequestHeaders, ResponseProtocolError
from mitmproxy.proxy.layers.http._hooks import HttpErrorHook

from .common import addon_named, log, patch
from .limits import DNS_PENDING_MAX, DNS_UDP_LINGER, MAX_HEADER_BYTES, MAX_WS_MESSAGE, REFUSED_BODY_DRAIN
from .scheduler import _share_the_loop


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
                self.buf = ReceiveBuffer()
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
                        yield ReceiveHttp(
                            ResponseProtocolError(self.stream_id, f"response {why}", ErrorCode.GENERIC_SERVER_ERROR)
                        )

        read_headers.ppp_capped = True  # type: ignore[attr-defined]
        patch(cls, "read_headers", read_headers)


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
        if isinstance(event, RequestData) and len(self.request_body_buf) + len(event.data) > REFUSED_BODY_DRAIN:
            self.request_body_buf.clear()
            why = f"ppp: the body of a refused request is over {REFUSED_BODY_DRAIN} bytes"
            log.info("%s; failing the stream", why)
            self.flow.error = mitm_flow.Error(why)
            yield HttpErrorHook(self.flow)
            yield http_layer.SendHttp(
                ResponseProtocolError(self.stream_id, why, ErrorCode.REQUEST_TOO_LARGE),
                self.context.client,
            )
            self.client_state = self.state_errored
            self.flow.live = False
            return
        yield from _orig(self, event)

    state_consume_request_body.ppp_capped = True  # type: ignore[attr-defined]
    patch(cls, "state_consume_request_body", state_consume_request_body)


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
    patch(ws_layer.WebsocketLayer, "relay_messages", relay_messages)


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
    patch(cls, "handle_response", handle_response)
    patch(cls, "handle_error", handle_error)
    # state_start binds `self.state_query` by name: the wrapper.
    patch(cls, "state_query", state_query)


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
        handler = addon_named("proxyserver").connections.get(client.id)
        if handler is not None and client in handler.transports:
            handler.close_connection(client)
    except Exception:  # noqa: BLE001
        pass  # already gone


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
        if isinstance(event, RequestHeaders) and not event.end_stream:
            req = event.request
            if (
                (req.is_http2 or req.is_http3)
                and "content-length" not in req.headers
                and "transfer-encoding" not in req.headers
            ):
                req.headers["transfer-encoding"] = "chunked"
        yield from _orig(self, event)

    send.ppp_framed = True  # type: ignore[attr-defined]
    patch(_http1.Http1Client, "send", send)


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
    patch(cls, "log", log)


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


def install(manager: Any) -> None:
    """Apply every patch once; from the entry file's `load`. The loop
    sharing of `scheduler` is one of them."""
    _cap_http1_headers()
    _cap_websocket_messages()
    _cap_buffered_request_bodies()
    _forget_answered_dns()
    _frame_converted_bodies()
    _share_the_loop()
    _quiet_streaming_notes()
    _cache_hook_dispatch(manager)
