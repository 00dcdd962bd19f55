"""The background task: WireGuard servers, tunnel activity, and open
streams re-checked.

Decides nothing itself: once per new generation it applies the daemon's
`modes` list (a sandbox gains or loses its server without a restart) and
re-asks the verdict of every open stream, cutting the ones the new policy
denies. Bounds its own pace (WATCH_INTERVAL, TUNNELS_WRITE_EVERY) and
writes `tunnels.json` atomically. Must never trust that a connection
allowed once stays allowed: a rule removed must not leave a tunnel open.
"""

import asyncio
import json
import os
import time
from typing import Any

from mitmproxy import ctx

from .common import addon_named, kill, log
from .daemon import DaemonError
from .decisions import Decisions

# How often the background task checks for new WireGuard servers and saves
# tunnel activity (seconds).
WATCH_INTERVAL = 0.2


# Tunnel activity is saved at most this often (seconds).
TUNNELS_WRITE_EVERY = 1.0


class Watch(Decisions):
    """What the background task does, once per WATCH_INTERVAL."""

    def __init__(self) -> None:
        super().__init__()
        # The generation stamp whose `modes` list was last applied.
        self._modes_stamp: tuple[int, int, int] | None = None
        self._seen_saved: dict[int, float] = {}
        self._seen_saved_at = 0.0
        self._watcher: asyncio.Task[None] | None = None
        self._live_generation: int | None = None

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
            # mitmproxy 12.2.3's OptManager.update has no annotations.
            ctx.options.update(mode=modes)  # type: ignore[no-untyped-call]
        self._modes_stamp = stamp

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
            log.info(
                "ppp: [%s] cut an open %s connection to %s (%s:%s): %s", sandbox, protocol, host, ip, port, v.reason
            )
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
            ps = addon_named("proxyserver")
            handler = ps.connections.get(flow.client_conn.id) if ps is not None else None
            io = handler.transports.get(handler.client) if handler is not None else None
            if io is not None and io.handler is not None:
                io.handler.cancel("ppp: denied by a policy change")
        except Exception:  # noqa: BLE001
            log.exception("ppp: could not close a denied connection")
        if flow.killable:
            kill(flow)
