"""The client of the ppp daemon's socket (`$PPP_DATA/secret.sock`, NDJSON).

Decides nothing: every policy answer comes from the daemon, and an answer
that cannot be had is a `DaemonError`, which every caller turns into a
denial (fail closed). Bounds each round trip by DAEMON_TIMEOUT and keeps one
connection per thread, so a slow answer to one never delays another. Must
never trust a reply to be well formed or to answer this request: a reply
that is not an object is an error, one with another id is skipped.
"""

import itertools
import json
import socket
import threading
from typing import Any

# Timeout of one daemon round trip (seconds).
DAEMON_TIMEOUT = 2.0


class DaemonError(Exception):
    """The daemon could not be asked, or answered with an error."""


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
