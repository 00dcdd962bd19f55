"""Requests held for approval (docs/adr/0021).

Decides nothing: a flow whose verdict is `ask` waits, on its own daemon
connection, until the daemon says how its wait ended (the user allowed or
denied it, a timeout, a full queue, a policy change). Bounds the requests
one sandbox may have held (HOLD_MAX), the wait (HOLD_LIMIT) and the reply
read (HOLD_REPLY_MAX); the held client stops reading meanwhile
(`scheduler._paused`). Remembers a TLS approval only for that connection
and that SNI. Must never trust a hold that ends without an answer, or
still undecided: both deny.
"""

import asyncio
import json
from typing import Any

from mitmproxy import connection

from .common import _JSON, Lru, log
from .daemon import DaemonError
from .decisions import Decisions
from .scheduler import _paused
from .state import DENIED_MAX
from .verdict import DAEMON_DOWN, Verdict, deny

# A request held for approval waits on its own daemon connection; the daemon
# ends the wait first (its approval timeout is at most an hour).
HOLD_LIMIT = 3700.0
# Requests one sandbox may have held at once; the daemon bounds its queue
# too, this keeps the connections to it bounded.
HOLD_MAX = 512


# The longest hold reply read (a decision is a few hundred bytes).
HOLD_REPLY_MAX = 64 * 1024


class Holds(Decisions):
    """Flows held for the user's approval."""

    def __init__(self) -> None:
        super().__init__()
        # Client connections whose TLS ClientHello the user approved, by
        # client id: the SNI approved. Requests inside, for that name, are
        # not held again.
        self._approved: Lru[str, tuple[str | None, Verdict]] = Lru(DENIED_MAX)
        # Requests held now, per sandbox, and the tasks that hold them.
        self._holding: dict[str, int] = {}
        self._hold_tasks: set[asyncio.Task[None]] = set()

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
        if self._holding.get(sandbox, 0) >= HOLD_MAX:
            return deny(f"{self._holding[sandbox]} requests of this sandbox already wait for approval", "policy")
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
            r = await self._wait(client, sandbox, req)
            if not r.get("ok"):
                raise DaemonError(f"hold: {r.get('reason')} {r.get('detail', '')}")
            v, _ = self._from_reply(r, host)
            if v.kind == "ask":
                raise DaemonError("hold: still undecided")
            return v
        except (TimeoutError, OSError, ValueError, DaemonError) as e:
            log.warning("ppp: [%s] a held request to %s failed closed: %s", sandbox, host or ip, e)
            return DAEMON_DOWN

    async def _wait(self, client: connection.Client, sandbox: str, req: dict[str, Any]) -> dict[str, Any]:
        """Send one held request on a daemon connection of its own and wait
        for its one reply line, the client paused meanwhile; counted
        against HOLD_MAX for the sandbox while it waits. Raises on a reply
        that is not an object, on a timeout and on a socket error."""
        if self.daemon is None:
            raise DaemonError("no daemon to wait on")
        self._holding[sandbox] = self._holding.get(sandbox, 0) + 1
        writer = None
        try:
            with _paused(client.id):
                reader, writer = await asyncio.open_unix_connection(self.daemon.path, limit=HOLD_REPLY_MAX)
                writer.write((_JSON.encode({k: x for k, x in req.items() if x is not None}) + "\n").encode())
                await writer.drain()
                line = await asyncio.wait_for(reader.readline(), HOLD_LIMIT)
            r = json.loads(line) if line else None
            if not isinstance(r, dict):
                raise DaemonError("the daemon ended a held request without an answer")
            return r
        finally:
            if writer is not None:
                writer.close()
            left = self._holding.get(sandbox, 1) - 1
            if left > 0:
                self._holding[sandbox] = left
            else:
                self._holding.pop(sandbox, None)

    async def _budget_hold(
        self,
        client: connection.Client,
        meta: dict[str, Any],
        over: dict[str, Any],
        method: str,
        path: str,
        size: int | None,
    ) -> dict[str, Any] | None:
        """Hold a request past a budget that asks (ADR 0055) until the
        daemon says how the wait ended: None when it may go on (the user
        allowed it, and the daemon raised the budget once), else the
        refusal to answer. Its own connection, as `_hold`; any failure
        refuses (the `over` the daemon first gave, as a plain deny)."""
        refused = {**over, "ask": False}
        sandbox = meta.get("sandbox")
        if self.daemon is None or not isinstance(sandbox, str):
            return refused
        if self._holding.get(sandbox, 0) >= HOLD_MAX:
            return refused
        req = {
            "op": "budget_hold",
            "sandbox": sandbox,
            "host": meta.get("host"),
            "port": meta.get("port") or 0,
            "method": method,
            "path": path,
            "size": size,
        }
        try:
            r = await self._wait(client, sandbox, req)
            if not r.get("ok"):
                raise DaemonError("the daemon ended a budget hold without an answer")
            m = r.get("meter")
            if not isinstance(m, dict):
                # No provider answers there now: nothing to count it against.
                return None
            now = m.get("over")
            if now is None:
                return None
            if not isinstance(now, dict) or now.get("ask") is not False:
                raise DaemonError("budget hold: still undecided")
            return now
        except (TimeoutError, OSError, ValueError, DaemonError) as e:
            log.warning("ppp: [%s] a budget hold for %s failed closed: %s", sandbox, meta.get("host"), e)
            return refused

    def _spawn_hold(self, coro: Any) -> None:
        """Run a hold in the background; the flow stays intercepted until it
        resumes it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._hold_tasks.add(task)
        task.add_done_callback(self._hold_tasks.discard)

    def _approved_for(self, client: connection.Client, host: str | None) -> Verdict | None:
        """The approval of this connection's ClientHello, if it was for
        `host`."""
        a = self._approved.get(client.id)
        return a[1] if a is not None and a[0] == host else None
