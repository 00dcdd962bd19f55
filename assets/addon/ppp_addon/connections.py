"""Connections: TLS ClientHellos, TCP and UDP streams, and who may connect.

Decides, through `decisions`, whether a TLS connection (by its SNI and
destination), a TCP or UDP stream (by destination) may go on; a denied
client connection stays denied for every flow inside it (`_denied`), and
server_connect refuses its upstream. Bounds open connections per sandbox
and transport (MAX_CONNECTIONS), the TCP connections a sandbox holds with
no upstream behind them (HELD_MAX, the oldest closed first; HELD_LIVE_MAX
with those closing; ADR 0042), and the messages a stream keeps (each is
counted and dropped once relayed). Must never trust the SNI to be the
destination (the daemon checks that the name resolves to the address), a
guest to close what it opened, nor let an unknown WireGuard port through.
"""

import collections
import dataclasses
import time
from typing import Any

from mitmproxy import connection, tcp, tls, udp
from mitmproxy.proxy import server_hooks

from .common import close_soon, kill, log
from .flowlog import FlowLog
from .holds import Holds
from .limits import MAX_CONNECTIONS, Limits
from .names import canonical_host
from .scheduler import HELD_WAITED
from .verdict import LOCAL, LOCAL_HOST, Verdict, deny

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


class Connections(Holds, FlowLog, Limits):
    """The connection-level hooks.

    A hook may return an awaitable, which mitmproxy awaits with the layer
    paused (addonmanager.async_invoke_addon): a request held for approval
    costs a coroutine, every other one stays a plain call."""

    def __init__(self) -> None:
        super().__init__()
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
                return self._tls_asked(data, sandbox, host, ip, port)
            else:
                v = cached
        except Exception as e:  # noqa: BLE001 - never crash mitmdump; deny
            log.exception("ppp: tls_clienthello failed, denying")
            v = deny(f"internal error: {type(e).__name__}")
        if v.kind == "ask" and sandbox is not None and port is not None:
            return self._tls_held(data, sandbox, host, ip, port)
        self._tls_decided(data, sandbox, host, ip, port, v)
        return None

    async def _tls_asked(
        self, data: tls.ClientHelloData, sandbox: str, host: str | None, ip: str | None, port: int
    ) -> None:
        v = await self._asked(data.context.client, sandbox, host, ip, port, "tls")
        if v.kind == "ask":
            await self._tls_held(data, sandbox, host, ip, port)
        else:
            self._tls_decided(data, sandbox, host, ip, port, v)

    async def _tls_held(
        self, data: tls.ClientHelloData, sandbox: str, host: str | None, ip: str | None, port: int
    ) -> None:
        client = data.context.client
        v = await self._hold(client, sandbox, host, ip, port, "tls")
        if v.allow:
            # Approved for this connection and this name: the requests
            # inside (the Host must equal the SNI) are not held again.
            self._approved[client.id] = (host, v)
        self._tls_decided(data, sandbox, host, ip, port, v)

    def _tls_decided(
        self,
        data: tls.ClientHelloData,
        sandbox: str | None,
        host: str | None,
        ip: str | None,
        port: int | None,
        v: Verdict,
    ) -> None:
        client = data.context.client
        # Pass through unread (ADR 0051) only what the daemon allowed and
        # said not to inspect, for this ClientHello's own SNI (the daemon
        # judged that name and found it resolves to this destination), over
        # TCP: mitmproxy then relays the bytes as they are, with no HTTP
        # hooks, so nothing is injected and no request is seen. Without an
        # SNI, or refused, the connection is intercepted or refused as
        # before. The destination stays the one decided on: server_connect
        # still refuses a denied one, and the held-connection bounds count
        # it like any other (its upstream opens at once).
        passed = (
            v.allow
            and not v.inspect
            and host is not None
            and host == canonical_host(data.client_hello.sni)
            and client.transport_protocol == "tcp"
        )
        if passed:
            data.ignore_connection = True
        # Allowed ClientHellos are logged too: the SNI decision is a flow
        # of its own (a connection may carry no request, or one mitmproxy
        # passes through), and `ppp policy replay` re-decides it. A passed
        # connection has no other line: this one says `inspected: false`.
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
            inspected=False if passed else None,
        )
        if passed:
            log.info("ppp: [%s] passed TLS %s (%s:%s) through unread: %s", sandbox, host, ip, port, v.reason)
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
        close_soon(client)
        try:
            sandbox = self.sandbox_of(client)
            ip, dport = (client.sockname[0], client.sockname[1]) if client.sockname else (None, None)
            log.info("ppp: [%s] closed a held TCP connection: %s", sandbox, what)
            self.log_flow(
                sandbox=sandbox, kind="tcp", ip=ip, port=dport, decision="deny", reason=what, duration_ms=None
            )
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
            elif (cached := self._cached(sandbox, host, ip, port, kind)) is None:
                return self._stream_asked(flow, kind, sandbox, host, ip, port)
            elif cached.kind == "ask" and (approved := self._approved_for(flow.client_conn, host)) is not None:
                v = approved
            else:
                v = cached
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
        if v.allow and v.http_rules:
            # ADR 0050: the host's HTTP rules decide its requests, and this
            # stream's are not visible (TLS mitmproxy did not open, or bytes
            # it cannot read as HTTP, or UDP): refused.
            v = deny(
                f"{host or ip} has HTTP rules, and ppp cannot inspect the requests of this {kind.upper()} connection",
                "http",
            )
        self._mark(flow, sandbox, host or ip, v, v.allow)
        flow.metadata["ppp"].update(kind=kind, ip=ip, port=port)
        if v.allow and sandbox is not None and port is not None:
            self._live[flow.id] = (flow, sandbox, host, ip, port, kind)
        if not v.allow:
            self._denied[flow.client_conn.id] = v
            if flow.killable:
                kill(flow)
            log.info("ppp: [%s] denied %s %s:%s: %s", sandbox, kind.upper(), ip, port, v.reason)
            try:
                self._log_stream(flow)
            except Exception:  # noqa: BLE001
                log.exception("ppp: could not log a denied %s flow", kind)

    def tcp_start(self, flow: tcp.TCPFlow) -> Any:
        return self._start_stream(flow, "tcp")

    def udp_start(self, flow: udp.UDPFlow) -> Any:
        return self._start_stream(flow, "udp")

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

    def tcp_message(self, flow: tcp.TCPFlow) -> None:
        if flow.messages:
            m = flow.messages[-1]
            self._count_message(flow, flow.messages, m.from_client, len(m.content))

    def udp_message(self, flow: udp.UDPFlow) -> None:
        if flow.messages:
            m = flow.messages[-1]
            self._count_message(flow, flow.messages, m.from_client, len(m.content))
