"""Secret injection: API keys and custom placeholders into allowed requests.

Decides where a key goes: only into a request the policy allowed and that
`http_flow` marked `secret_ok` (TLS both ways, SNI, Host and target naming
the host, upstream certificates checked); which key for which host is the
daemon's (`inject`, `secret` replies). Removes the guest's own credential
headers first, and asks for an uncompressed answer so an echoed key can
be scrubbed. Bounds the secrets cache (SECRET_TTL, one generation, LRU).
Must never trust the guest with a key: keys never enter the guest, and a
revoked key is never served from the cache (polled right before use).
"""

import time
from collections.abc import Iterable
from typing import Any

from mitmproxy import http

from .common import CACHE_MAX, Lru, log
from .daemon import DaemonError
from .decisions import Decisions
from .scrubber import Scrubber

# How long a secret may be cached (seconds); dropped earlier on a new
# generation, and on the daemon's `ttl` for a value from a command.
SECRET_TTL = 60.0


class CommandFailed(DaemonError):
    """A secret's command failed on the host; the text names the secret
    (service and scope), never the command's output."""


def _ttl(r: dict[str, Any]) -> float:
    """How long reply `r` may be cached: SECRET_TTL, or less when it carries
    a value from a command (the daemon's `ttl`, seconds left of its refresh
    interval), so no such value outlives its refresh here."""
    ttls = [r.get("ttl")] + [s.get("ttl") for s in r.get("substitutions") or [] if isinstance(s, dict)]
    ttl = SECRET_TTL
    for t in ttls:
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            ttl = min(ttl, max(0.0, float(t)))
    return ttl


def _from_command(r: dict[str, Any]) -> bool:
    """Whether reply `r` carries a value from a command (it has a `ttl`)."""
    return "ttl" in r or any(isinstance(s, dict) and "ttl" in s for s in r.get("substitutions") or [])


# Headers a client may use to carry its own credentials; removed before ppp
# injects a key so the guest's dummy key never reaches the service.
AUTH_HEADERS = ("authorization", "x-api-key", "x-goog-api-key", "proxy-authorization")
_AUTH_BYTES = frozenset(h.encode() for h in AUTH_HEADERS)


def _with_key(
    fields: tuple[tuple[bytes, bytes], ...], name: str, value: str, name2: str, value2: str
) -> tuple[tuple[bytes, bytes], ...]:
    """`fields` with every AUTH_HEADERS field removed, then `name` set to
    `value` and `name2` to `value2`, as `Headers.__setitem__` sets them (the
    first field of that name keeps its place and spelling, the others go; a
    new one is added at the end), in one pass instead of one per header."""
    # Encoded as mitmproxy encodes str headers.
    n1, n2 = name.encode("utf-8", "surrogateescape"), name2.encode("utf-8", "surrogateescape")
    sets: list[list[Any]] = [
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


class Injection(Decisions):
    """Keys and placeholders into allowed requests; scrubbed from responses."""

    def __init__(self) -> None:
        super().__init__()
        # flow.id -> the secret values injected into its request, scrubbed
        # from its response; dropped when the flow ends (bounded all the
        # same: an entry outlives a flow only if mitmproxy never ends it).
        self._scrub: Lru[str, list[bytes]] = Lru(CACHE_MAX)

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
        if r.get("reason") == "command-failed":
            # Not cached: the daemon remembers a failure for a while itself.
            raise CommandFailed(str(r.get("detail") or "a secret"))
        if r.get("ok") or r.get("reason") == "no-secret":
            self._secrets[key] = (now + _ttl(r), r)
        return r

    def _stale(self, flow: http.HTTPFlow) -> None:
        """The service answered 401 to a request that carried a value from a
        command: tell the daemon (which runs it again on the next request,
        at most once per 30 s per secret whatever the guest provokes) and
        drop this host's cached replies."""
        where = flow.metadata.get("ppp", {}).get("from_command")
        if not where or flow.response is None or flow.response.status_code != 401:
            return
        sandbox, host = where
        for op in ("inject", "secret"):
            self._secrets.pop((op, sandbox, host), None)
        try:
            self._ask({"op": "stale", "sandbox": sandbox, "host": host})
        except DaemonError as e:
            log.warning("ppp: [%s] could not report a rejected key for %s: %s", sandbox, host, e)

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
            if _from_command(subs):
                flow.metadata["ppp"]["from_command"] = (sandbox, host)
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
                    if _from_command(r):
                        flow.metadata["ppp"]["from_command"] = (sandbox, host)
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
        except CommandFailed as e:
            log.warning("ppp: [%s] the command of secret %s failed, for %s", sandbox, e, host)
            # Names the secret and how its command failed; the daemon never
            # sends the command's output or stderr, which may hold a token.
            body = (
                f"ppp could not get the secret for {host} from its command on the host: {e}\n"
                "to fix: check `ppp secret ls` and `ppp diagnose` on the host\n"
            )
            flow.response = http.Response.make(503, body.encode(), {"content-type": "text/plain; charset=utf-8"})
        except DaemonError as e:
            log.warning("ppp: [%s] secrets unavailable for %s: %s", sandbox, host, e)
            # The daemon's error names host paths: the log has it, the
            # guest gets only what to do.
            body = (
                f"ppp could not fetch the secret for {host}\n"
                "to fix: check `ppp daemon status` and `ppp secret ls` on the host\n"
            )
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
        self._stale(flow)
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

        def scrub_then(chunk: bytes) -> Iterable[bytes] | bytes:
            out = scrubber(chunk)
            if not out:
                return [] if chunk else b""
            assert isinstance(out, bytes)
            return previous(out)

        flow.response.stream = scrub_then
