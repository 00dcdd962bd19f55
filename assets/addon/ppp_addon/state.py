"""The state every part of the addon shares, and the base of its mixins.

`PppAddon` (the entry file) is one object assembled from one class per
concern (`flowlog.FlowLog`, `decisions.Decisions`, `holds.Holds`, ...),
each with its own state; what more than one of them reads lives here: the
daemon client, the data directory, the client connections denied, the open
streams re-checked on a policy change, and tunnel activity. Bounds: each
map keyed by a guest's connections is an LRU or emptied when they end.
Decides nothing. The sandbox of a connection is its WireGuard listen port
(`_port`), never an address the guest sent.
"""

from typing import Any

from mitmproxy import connection
from mitmproxy.proxy import mode_specs

from .common import CACHE_MAX, Lru
from .daemon import Daemon
from .names import ip_text
from .verdict import Verdict

# Client connections remembered as denied (dropped on disconnect anyway).
DENIED_MAX = 16384


class State:
    """The shared state; every concern's class derives from it."""

    def __init__(self) -> None:
        self.daemon: Daemon | None = None
        self.state_dir = ""
        # Secrets are never injected when upstream certificates go unchecked.
        self._ssl_insecure = False
        # Client connections denied at TLS/TCP/UDP level, by client id:
        # server_connect refuses any upstream connection for them.
        self._denied: Lru[str, Verdict] = Lru(DENIED_MAX)
        # Open TCP/UDP streams and WebSockets the policy allowed, by flow id:
        # (flow, sandbox, host, ip, port, protocol). A reload re-decides them
        # and cuts the ones it now denies. Entries leave when flows end, so
        # this is bounded by the connections mitmproxy holds.
        self._live: dict[str, tuple[Any, str, str | None, str | None, int, str]] = {}
        # WireGuard listen port -> wall-clock time of its latest connection.
        self._seen: Lru[int, float] = Lru(CACHE_MAX)

    @staticmethod
    def _addr(server: connection.Server) -> tuple[str | None, int | None]:
        address = server.address
        if address:
            return ip_text(str(address[0])), int(address[1])
        return None, None

    @staticmethod
    def _port(client: connection.Client) -> int | None:
        mode = client.proxy_mode
        return mode.listen_port() if isinstance(mode, mode_specs.WireGuardMode) else None
