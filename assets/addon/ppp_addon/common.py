"""Shared bottom layer: the addon's log, its bounded map and a few pure
helpers (timestamps, header text, sizes).

Bounds: `Lru` is where every key a guest can choose (host names, DNS names,
connection ids) is kept, so no such map grows past its `maxsize`; the log
never raises into a hook (a failing handler must not turn a denial into a
crash). Decides nothing. Never trusts a header's bytes to be text: they are
decoded with `surrogateescape`, never `strict`.
"""

import asyncio
import collections
import json
import logging
import time
from typing import Any, overload

from mitmproxy import connection, ctx, http
from mitmproxy import flow as mitm_flow

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


# Entries kept in each bounded cache (decisions, secrets, log throttles).
CACHE_MAX = 4096


_MISSING = object()
_od_get = collections.OrderedDict.get


class Lru[K, V](collections.OrderedDict[K, V]):
    """A dict that keeps at most `maxsize` entries, dropping the least
    recently used: every key a guest can choose (host names, DNS names,
    connection ids) lands in one of these, so none may grow without bound."""

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        self.maxsize = maxsize

    # dict.get's signatures, so that a hit is typed as the value.
    @overload
    def get(self, key: K, default: None = None, /) -> V | None: ...
    @overload
    def get(self, key: K, default: V, /) -> V: ...
    @overload
    def get[T](self, key: K, default: T, /) -> V | T: ...
    def get(self, key: K, default: Any = None, /) -> Any:
        # The C lookup, not self[key]: a miss (a client connection that was
        # never denied, on every request) raises no KeyError.
        value = _od_get(self, key, _MISSING)
        if value is _MISSING:
            return default
        self.move_to_end(key)
        return value

    def __setitem__(self, key: K, value: V) -> None:
        super().__setitem__(key, value)
        self.move_to_end(key)
        while len(self) > self.maxsize:
            self.popitem(last=False)


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


def _size_text(n: int) -> str:
    """Bytes as ppp's sizes print them: the largest binary unit that
    divides them (`64MiB`, `1536KiB`, `100B`), as `Size`'s Display does."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


_JSON = json.JSONEncoder(separators=(",", ":"))


def patch(owner: object, name: str, wrapper: object) -> None:
    """Replace `owner.name` by `wrapper`: how ppp changes a mitmproxy method
    (patches, scheduler), each once, each said why where it is done."""
    setattr(owner, name, wrapper)


def addon_named(name: str) -> Any:
    """mitmdump's addon `name` (`proxyserver`, `dnsresolver`), or None."""
    # mitmproxy 12.2.3's AddonManager.get has no annotations.
    return ctx.master.addons.get(name)  # type: ignore[no-untyped-call]


def kill(flow: mitm_flow.Flow) -> None:
    """`flow.kill()`, which mitmproxy 12.2.3 leaves unannotated."""
    flow.kill()  # type: ignore[no-untyped-call]


def close_soon(client: connection.Client) -> bool:
    """Ask mitmproxy's handler of `client` to close it (and its upstream) on
    the loop's next turn, not from inside the hook or layer that is calling:
    `flow.kill()` does not stop a flow in transit (mitmproxy issue 4711).
    False when no live handler has it."""
    try:
        proxyserver = addon_named("proxyserver")
        handler = proxyserver.connections.get(client.id) if proxyserver is not None else None
    except Exception:  # noqa: BLE001
        handler = None
    if handler is None:
        return False

    def close() -> None:
        try:
            handler.close_connection(client)
        except Exception:  # noqa: BLE001
            pass  # already gone

    asyncio.get_running_loop().call_soon(close)
    return True
