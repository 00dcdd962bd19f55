"""Decisions and their caches: the daemon's verdicts, per sandbox.

Decides nothing itself: it asks the daemon (`decide`, `_asked` in a worker
thread), turns its reply into a `Verdict` (`_from_reply`) and caches it per
(sandbox, host, ip, port) for one generation. Bounds: the caches (LRU),
the decisions waiting per sandbox (DECIDE_MAX, DECIDE_RUNNING at once) and
in all (DECIDE_TOTAL_MAX); past either a new one is denied at once. Drops
every cache when the generation file or the secret index changes, so a
policy change or a revoked key applies to the next request. Must never
trust a cached answer across a generation, an answer that crossed a reload
(asked again, DECIDE_TRIES), or the guest's claim of its sandbox: that is
the WireGuard listen port, looked up in the port registry.
"""

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import time
from typing import Any

from mitmproxy import connection
from mitmproxy.proxy import mode_specs

from .common import CACHE_MAX, Lru, log
from .daemon import DaemonError
from .scheduler import _paused
from .scrubber import Scrubber
from .state import State
from .verdict import DAEMON_DOWN, HELD_REASONS, Verdict, deny

# How often the daemon's generation is asked over the socket (seconds). The
# background task does it, off the request path; a hook only asks itself
# when no answer is newer than GENERATION_POLL_HOOK (no task running, as in
# tests, or a daemon that did not answer). Either way the generation file
# is checked before every cached answer.
GENERATION_POLL = 1.0
GENERATION_POLL_HOOK = 3.0


# Names a DNS answer may go through (CNAME, DNAME) besides the one asked;
# past it the answer is refused. The daemon's MAX_CHAIN.
CHAIN_MAX = 16


# A decision not in the cache is asked in a worker thread, so that a host
# lookup in the daemon (up to 750 ms for a name that does not answer) stalls
# only the flow that needs it, not every sandbox's traffic on the loop.
# Threads (each with its own daemon connection):
DECIDE_THREADS = 16
# Decisions one sandbox may have in those threads at once: fewer than the
# threads, so one sandbox's slow names never take every thread; its others
# wait their turn on the loop (a coroutine each).
DECIDE_RUNNING = 4
# Decisions one sandbox, and all together, may have waiting at once; past
# either, a new one is denied at once, as HOLD_MAX denies a hold.
DECIDE_MAX = 512
DECIDE_TOTAL_MAX = 4096
# Times a decision is asked again when the policy changed while it was
# asked (its answer may be the old policy's); then it is denied.
DECIDE_TRIES = 3


class Decisions(State):
    """The daemon's verdicts, cached per generation."""

    def __init__(self) -> None:
        super().__init__()
        self.generation: int | None = None
        self._gen_stamp: tuple[int, int, int] | None = None
        # The stamp of `$PPP_DATA/secrets-index.json` the secret cache was
        # filled under (see `_poll`).
        self._index_stamp: tuple[int, int, int] | None = None
        self._index_path = ""
        self._last_poll = 0.0
        # Keyed by what the guest chose (names, addresses): bounded.
        self._decisions: Lru[tuple[Any, ...], Verdict] = Lru(CACHE_MAX)
        self._gen_path = ""
        self._registry_path = ""
        self._secrets: Lru[tuple[str, str, str], tuple[float, dict[str, Any]]] = Lru(CACHE_MAX)
        self._registry: dict[int, str] = {}
        self._registry_stamp: tuple[int, int] | None = None
        # Decisions asked in worker threads now (`_asked`), per sandbox:
        # [a semaphore of DECIDE_RUNNING, how many wait or run]; and in all.
        self._asking: dict[str, list[Any]] = {}
        self._asking_total = 0
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # Bumped whenever the caches are dropped: an answer from a thread
        # that crossed a bump may be the old policy's.
        self._epoch = 0

    def _ask(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.daemon is None:
            raise DaemonError("ppp_state_dir is not set")
        return self.daemon.ask(req)

    def _invalidate(self, generation: int | None) -> None:
        self._epoch += 1
        self._decisions.clear()
        self._secrets.clear()
        Scrubber._tables.clear()  # no secret outlives its generation here
        self._registry_stamp = None
        self.generation = generation

    def _saw_generation(self, g: Any) -> None:
        if isinstance(g, int) and g != self.generation:
            self._invalidate(g)

    def _read_stamp(self, path: str | None = None) -> tuple[int, int, int] | None:
        # The daemon replaces the file (temp file + rename) on every reload,
        # so its inode and mtime change each time. A stat is a fifth of the
        # cost of opening and reading it, and it runs twice per request.
        try:
            st = os.stat(self._gen_path if path is None else path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _poll(self) -> None:
        """Drop every cache when the daemon's generation moved.

        The daemon rewrites `$PPP_DATA/generation` on every reload before it
        acknowledges it, so reading that small file first makes a policy
        change apply to the next request. The socket is asked here only
        when the generation is unknown (first use, after a change or a
        failure) or no answer is newer than GENERATION_POLL_HOOK; the
        background task asks it once a second besides.
        """
        stamp = self._read_stamp()
        if stamp != self._gen_stamp:
            self._gen_stamp = stamp
            self._invalidate(None)
        # Every change to the secret store (set, set-custom, rm, a sandbox
        # removed) rewrites its index, atomically and under state.lock,
        # before the command returns: the store's own commit point, whether
        # or not the daemon then reloads (a policy it cannot parse keeps the
        # generation where it was). A revoked key is never served from the
        # cache after that (docs/adr/0040).
        index = self._read_stamp(self._index_path)
        if index != self._index_stamp:
            self._index_stamp = index
            self._secrets.clear()
            Scrubber._tables.clear()
            # A decision to pass a host through unread holds only while no
            # secret covers it (the daemon checks the index): a secret
            # stored without a reload must not meet a cached pass-through,
            # nor one asked meanwhile (the epoch). Other decisions stay.
            self._epoch += 1
            for key in [k for k, v in self._decisions.items() if not v.inspect]:
                del self._decisions[key]
        now = time.monotonic()
        if self.generation is not None and now - self._last_poll < GENERATION_POLL_HOOK:
            return
        try:
            r = self._ask({"op": "generation"})
        except DaemonError:
            self._invalidate(None)
            raise
        if not r.get("ok"):
            self._invalidate(None)
            raise DaemonError(f"generation: {r.get('reason')}")
        self._last_poll = now
        self._saw_generation(r.get("generation"))

    async def poll_in_background(self) -> None:
        """Ask the daemon's generation once a second, in a thread: a round
        trip on the event loop stalls every request in flight, and a busy
        daemon host makes that the p99 latency. A failure or an error reply
        drops every cache, so the next hook asks itself and fails closed."""
        daemon = self.daemon
        now = time.monotonic()
        if daemon is None or now - self._last_poll < GENERATION_POLL:
            return
        try:
            r = await asyncio.to_thread(daemon.ask, {"op": "generation"})
        except DaemonError:
            self._invalidate(None)
            return
        if daemon is not self.daemon:
            return  # reconfigured meanwhile
        if not r.get("ok"):
            self._invalidate(None)
            return
        self._last_poll = now
        self._saw_generation(r.get("generation"))

    def _load_registry(self) -> None:
        path = self._registry_path
        try:
            st = os.stat(path)
        except OSError:
            self._registry, self._registry_stamp = {}, None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._registry_stamp:
            return
        try:
            with open(path, encoding="utf-8") as f:
                ports = json.load(f).get("ports", {})
            self._registry = {int(p): str(n) for p, n in ports.items()}
            self._registry_stamp = stamp
        except (OSError, ValueError, AttributeError) as e:
            log.warning("ppp: unreadable %s: %s; denying every sandbox", path, e)
            self._registry, self._registry_stamp = {}, None

    def sandbox_of(self, client: connection.Client) -> str | None:
        """The sandbox behind a client connection: its WireGuard server's port."""
        mode = client.proxy_mode
        if not isinstance(mode, mode_specs.WireGuardMode):
            return None
        port = mode.listen_port()
        if port is None:
            return None
        self._load_registry()
        return self._registry.get(port)

    def decide(
        self,
        sandbox: str,
        host: str | None,
        ip: str | None,
        port: int,
        protocol: str,
        chain: tuple[str, ...] = (),
        request: tuple[str, str, bool] | None = None,
    ) -> Verdict:
        """The daemon's verdict, cached per (sandbox, host, ip, port) for one
        generation. `host` is what the guest named, `ip` where the bytes go;
        the daemon judges both (the name must resolve to the address, an
        address literal does not replace the destination, internal addresses
        need their own rule). `request` is an HTTP request's (method, raw
        path, has a method-override header), for the host's HTTP rules. A
        daemon failure denies and is never cached."""
        try:
            self._poll()
            return self._verdict(sandbox, host, ip, port, protocol, chain, request)
        except DaemonError as e:
            log.warning("ppp: policy daemon unavailable, denying: %s", e)
            return DAEMON_DOWN

    def _verdict(
        self,
        sandbox: str,
        host: str | None,
        ip: str | None,
        port: int,
        protocol: str,
        chain: tuple[str, ...] = (),
        request: tuple[str, str, bool] | None = None,
    ) -> Verdict:
        """decide() without the poll; raises DaemonError."""
        # The daemon answers DNS and UDP differently under an `ask` default
        # (a name is answered, a datagram refused): their verdicts must not
        # stand in for a TCP flow's to the same name, address and port.
        key: tuple[Any, ...] = (sandbox, host, ip, port, protocol if protocol in ("dns", "udp") else "")
        req: dict[str, Any] = {
            "op": "decide",
            "sandbox": sandbox,
            "host": host,
            "ip": ip,
            "port": port,
            "protocol": protocol,
        }
        if chain:
            # A DNS answer's aliases: the same name through other aliases
            # is another decision.
            key = (*key, chain)
            req["chain"] = list(chain)
        if request is not None:
            _with_request(req, request)
        if (v := self._lookup(key, request)) is not None:
            return v
        return self._answer(key, self._ask(req), host, request)

    def _lookup(self, key: tuple[Any, ...], request: tuple[str, str, bool] | None) -> Verdict | None:
        """The cached answer for `key`; for an HTTP request to a host with
        HTTP rules, the answer for that very request (method, path,
        override), since the host's answer does not decide it."""
        v = self._decisions.get(key)
        if request is not None and (v is None or v.http_rules):
            # Only answers for a host with HTTP rules are kept per request.
            return self._decisions.get((*key, request))
        return v

    def _answer(
        self, key: tuple[Any, ...], r: dict[str, Any], host: str | None, request: tuple[str, str, bool] | None = None
    ) -> Verdict:
        """A `decide` reply as a Verdict, cached under `key` when it may be,
        its generation seen. On the loop only. Raises DaemonError. An
        answer the HTTP rules gave (the host has some) is cached for its
        request alone: another path of the host is another decision."""
        if not r.get("ok"):
            raise DaemonError(f"decide: {r.get('reason')} {r.get('detail', '')}")
        v, cache = self._from_reply(r, host)
        self._saw_generation(r.get("generation"))
        if cache:
            if v.http_rules and request is not None:
                self._decisions[(*key, request)] = v
            else:
                self._decisions[key] = v
        return v

    def _cached(
        self,
        sandbox: str,
        host: str | None,
        ip: str | None,
        port: int,
        protocol: str,
        request: tuple[str, str, bool] | None = None,
    ) -> Verdict | None:
        """decide() when the answer is cached, or None: then the hook hands
        mitmproxy `_asked` to await. The generation is polled first, as
        decide() does, and a failed poll denies."""
        try:
            self._poll()
        except DaemonError as e:
            log.warning("ppp: policy daemon unavailable, denying: %s", e)
            return DAEMON_DOWN
        return self._lookup((sandbox, host, ip, port, protocol if protocol in ("dns", "udp") else ""), request)

    async def _asked(
        self,
        client: connection.Client | None,
        sandbox: str,
        host: str | None,
        ip: str | None,
        port: int,
        protocol: str,
        request: tuple[str, str, bool] | None = None,
    ) -> Verdict:
        """decide() for a verdict not cached, with the daemon asked in a
        worker thread: the host lookup a `decide` may need (up to the
        daemon's 750 ms for a name that never answers) then waits for this
        flow alone, and the loop goes on with every other. The client's
        read loop waits meanwhile, as for a hold. The answer is used,
        cached and its generation seen here, on the loop; one that crossed
        a policy change is asked again. Bounded per sandbox and in all:
        past either, denied at once. Never raises; a failure denies and is
        never cached."""
        slot = self._asking.get(sandbox)
        if slot is not None and slot[1] >= DECIDE_MAX:
            return deny(f"{slot[1]} decisions of this sandbox already wait for the policy daemon", "policy")
        if self._asking_total >= DECIDE_TOTAL_MAX:
            return deny(f"{self._asking_total} decisions already wait for the policy daemon", "policy")
        if slot is None:
            slot = self._asking[sandbox] = [asyncio.Semaphore(DECIDE_RUNNING), 0]
        slot[1] += 1
        self._asking_total += 1
        try:
            with _paused(client.id) if client is not None else contextlib.nullcontext():
                async with slot[0]:
                    return await self._ask_in_thread(sandbox, host, ip, port, protocol, request)
        except Exception as e:  # noqa: BLE001 - never crash mitmdump; deny
            log.exception("ppp: a decision asked off the loop failed, denying")
            return deny(f"internal error: {type(e).__name__}")
        finally:
            slot[1] -= 1
            self._asking_total -= 1
            if slot[1] <= 0 and self._asking.get(sandbox) is slot:
                del self._asking[sandbox]

    async def _ask_in_thread(
        self,
        sandbox: str,
        host: str | None,
        ip: str | None,
        port: int,
        protocol: str,
        request: tuple[str, str, bool] | None = None,
    ) -> Verdict:
        key = (sandbox, host, ip, port, protocol if protocol in ("dns", "udp") else "")
        req: dict[str, Any] = {"op": "decide", "sandbox": sandbox, "host": host, "ip": ip, "port": port}
        req["protocol"] = protocol
        if request is not None:
            _with_request(req, request)
        loop = asyncio.get_running_loop()
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(DECIDE_THREADS, thread_name_prefix="ppp-decide")
        try:
            for _ in range(DECIDE_TRIES):
                # Time passed (a turn, or in the queue): poll again, so that
                # what follows in this hook (a key injected) sees this
                # generation, as on the synchronous path.
                self._poll()
                epoch = self._epoch
                if (v := self._lookup(key, request)) is not None:
                    return v  # another flow's answer came first
                daemon = self.daemon
                if daemon is None:
                    raise DaemonError("ppp_state_dir is not set")
                # The thread touches nothing of the addon's: it only asks,
                # on its own connection (Daemon keeps one per thread).
                r = await loop.run_in_executor(self._pool, daemon.ask, req)
                # A reload while the daemon answered shows in the generation
                # file (written before the reload is acknowledged).
                self._poll()
                if self._epoch == epoch:
                    return self._answer(key, r, host, request)
        except DaemonError as e:
            log.warning("ppp: policy daemon unavailable, denying: %s", e)
            return DAEMON_DOWN
        return deny(f"the policy changed {DECIDE_TRIES} times while this flow was decided", "internal")

    @staticmethod
    def _from_reply(r: dict[str, Any], host: str | None) -> tuple[Verdict, bool]:
        """A `decide` or `hold` reply as a Verdict, and whether it may be
        cached for its generation. Raises DaemonError on a malformed one."""
        rule = r.get("matched_rule")
        if rule is not None and not isinstance(rule, dict):
            raise DaemonError("decide: malformed matched_rule")
        held = r.get("approval")
        if held is not None and not isinstance(held, dict):
            raise DaemonError("hold: malformed approval")
        allow = r.get("verdict") == "allow"
        cache = True
        chain = r.get("chain")
        chain = tuple(str(n) for n in chain[: CHAIN_MAX + 1]) if isinstance(chain, list) else ()
        if (alias := r.get("alias")) is not None:
            rule_text = _rule_text(rule) if rule else "a rule"
            v = Verdict(
                allow=False,
                rule_id=rule.get("id") if rule else None,
                resource=rule.get("resource") if rule else None,
                reason=f"{host} is an alias of {alias}, which {rule_text} denies",
                generation=r.get("generation"),
                chain=chain,
                kind="alias",
            )
        elif (n := r.get("long_chain")) is not None:
            v = Verdict(
                allow=False,
                reason=f"{host} resolves through more than {n - 1} aliases",
                generation=r.get("generation"),
                chain=chain,
                kind="alias",
            )
        elif (rebound := r.get("rebinding")) is not None:
            v = Verdict(
                allow=False,
                reason=f"{host} resolves to internal address {rebound}, which no rule allows (DNS rebinding defence)",
                generation=r.get("generation"),
                # Allowing the name would change nothing: the address is
                # what needs a rule of its own.
                allow_target=str(rebound),
                kind="address",
            )
        elif (internal := r.get("internal")) is not None:
            v = Verdict(
                allow=False,
                reason=f"{internal} is an internal address (or the host's own), which needs an explicit rule",
                generation=r.get("generation"),
                allow_target=str(internal),
                kind="address",
            )
        elif (unresolved := r.get("unresolved")) is not None:
            v = Verdict(
                allow=False,
                reason=f"{host} does not resolve to {unresolved}, the address this connection goes to",
                generation=r.get("generation"),
                kind="unresolved",
            )
            # The guest may resolve the name through ppp next: ask again.
            cache = False
        elif isinstance(http_out := r.get("http"), dict) and r.get("verdict") == "deny":
            # The host's HTTP rules refused this request (ADR 0050).
            if (refusal := http_out.get("refusal")) is not None:
                reason = f"{refusal}, and HTTP rules apply to {host}"
            elif rule:
                reason = f"HTTP {_rule_text(rule)}"
            else:
                reason = f"no HTTP rule allows this request on {host}"
            v = Verdict(
                allow=False,
                rule_id=rule.get("id") if rule else None,
                resource=rule.get("resource") if rule else None,
                reason=reason,
                generation=r.get("generation"),
                chain=chain,
                kind="http",
                http_rules=True,
                http=True,
                http_path=_text(http_out.get("path")),
            )
        elif r.get("verdict") == "ask":
            # Nothing decided yet: the caller holds the flow for the user.
            v = Verdict(
                allow=False, reason="no rule matches and the default asks", generation=r.get("generation"), kind="ask"
            )
        else:
            if held is not None:
                reason = HELD_REASONS.get(str(held.get("outcome")), "answered")
                if held.get("id"):
                    reason = f"{reason} (approval {held.get('id')})"
            elif rule:
                reason = _rule_text(rule)
            else:
                reason = f"default {r.get('verdict')}"
            v = Verdict(
                allow=allow,
                rule_id=rule.get("id") if rule else None,
                resource=rule.get("resource") if rule else None,
                reason=reason,
                generation=r.get("generation"),
                limits=r.get("limits"),
                approval=str(held.get("outcome")) if held is not None else None,
                chain=chain,
                # Only an explicit `false` on an allowed flow passes through.
                inspect=not (allow and r.get("inspect") is False),
            )
            if isinstance(http_out := r.get("http"), dict):
                v = dataclasses.replace(v, http=True, http_path=_text(http_out.get("path")))
        if r.get("local") is True:
            v = dataclasses.replace(v, local=True)
        if r.get("http_rules") is True:
            v = dataclasses.replace(v, http_rules=True)
        if r.get("metered") is True:
            v = dataclasses.replace(v, metered=True)
        return v, cache

    @staticmethod
    def _mark(flow: Any, sandbox: str | None, host: str | None, v: Verdict, allowed: bool, *addr: Any) -> None:
        """flow.metadata["ppp"]; with `ip, port` when given."""
        meta: dict[str, Any] = {
            "sandbox": sandbox,
            "host": host,
            "decision": "allow" if allowed else "deny",
            "matched_rule": v.rule_id,
        }
        if addr:
            meta["ip"], meta["port"] = addr
        if v.approval is not None:
            meta["approval"] = v.approval
        if v.chain:
            meta["chain"] = v.chain
        if v.local:
            meta["local"] = True
        if v.http:
            meta["http"] = True
            meta["http_path"] = v.http_path
        flow.metadata["ppp"] = meta


def _with_request(req: dict[str, Any], request: tuple[str, str, bool]) -> None:
    """Add an HTTP request's method, raw path and override flag to a
    `decide` request: the daemon decides the host's HTTP rules with them."""
    req["method"], req["path"] = request[0], request[1]
    if request[2]:
        req["overridden"] = True


def _rule_text(rule: dict[str, Any]) -> str:
    """A matched rule in words: `rule ID (DECISION RESOURCE, SCOPE)`."""
    return f"rule {rule.get('id')} ({rule.get('decision')} {rule.get('resource')}, {rule.get('scope')})"


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) else None
