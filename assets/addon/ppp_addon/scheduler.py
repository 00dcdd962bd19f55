"""Sharing mitmdump's one event loop between sandboxes (docs/adr/0020).

Bounds how much of the loop one sandbox gets while another is active: its
work is timed and charged to it (`LoopShare`), and a sandbox that used the
most lately waits before its connections read again, so a flood gets at
most 1 / (1 + LOOP_YIELD) of the loop. Also where a client with a request
held (for the user, or for the daemon in a worker thread) stops reading
(`HELD_CLIENTS`, `_paused`), so a guest cannot stream into mitmproxy's
queues meanwhile. Keys are WireGuard listen ports, never anything the guest
says; an idle key is dropped. Wraps mitmproxy's ConnectionHandler once.
"""

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from mitmproxy.proxy import mode_servers, mode_specs
from mitmproxy.proxy import server as proxy_server

from .common import patch

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


class LoopShare:
    """Who used mitmdump's event loop lately, and who must wait for it.

    Keys are WireGuard listen ports (one per sandbox; at most 65,535, and an
    entry idle for 10 * LOOP_ACTIVE is dropped). Pure bookkeeping with an
    injectable clock; `_share_the_loop` feeds it and applies its waits."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
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

    server_event.ppp_shared = True
    patch(cls, "server_event", server_event)
    patch(cls, "drain_writers", drain_writers)
    patch(handler_cls, "handle_hook", handle_hook)
