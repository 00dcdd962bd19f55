"""The flow log: one JSON line per flow in `$PPP_DATA/flows.jsonl`, and its
rotation.

Decides what a line says and whether a denial is logged at all (the
throttle: once per (sandbox, kind, name, port) per LOG_WINDOW, at most
LOG_BUDGET per sandbox per window; the rest are counted). Bounds the file
(rotated at FLOW_LOG_MAX, one old file kept) and each line (paths cut at
MAX_LOGGED_PATH, query strings dropped). Must never write a secret value,
nor trust a guest's path or name to be short or free of tokens; a guest
chooses how many denials it causes, so never one line per denial.
"""

import os
import time
from typing import Any

from mitmproxy import dns, http, tcp, udp

from .common import _JSON, CACHE_MAX, Lru, log, now_rfc3339
from .names import TUNNEL_DNS, canonical_host
from .state import State
from .verdict import Verdict

# How often the open flows.jsonl is checked against its path (seconds).
FLOW_LOG_RECHECK = 1.0


# Size at which flows.jsonl is rotated to flows.jsonl.1 (one old file kept).
FLOW_LOG_MAX = 32 * 1024 * 1024
# The longest request path written to flows.jsonl, in characters: a guest
# chooses its paths, and one line must stay small enough for a reader to
# hold whole (`ppp policy log -f`, the TUI).
MAX_LOGGED_PATH = 1024
# A denial (a refused DNS query, a refused connection or request) is logged
# once per (sandbox, kind, name, port) per window, and at most LOG_BUDGET
# denials per sandbox per window; the rest are counted, and the count is
# carried by the sandbox's next line that is logged.
LOG_WINDOW = 60.0
LOG_BUDGET = 120


def logged_path(path: str) -> str | None:
    """A request path as flows.jsonl records it: without the query string,
    which often carries tokens or signatures (`?access_token=…`,
    `X-Amz-Signature=…`) that must never reach a log, and at most
    MAX_LOGGED_PATH characters (a cut path ends in `…`). None for a request
    with no path (CONNECT's authority form)."""
    path = path.split("?", 1)[0].split("#", 1)[0]
    if not path:
        return None
    if len(path) > MAX_LOGGED_PATH:
        path = path[: MAX_LOGGED_PATH - 1] + "\u2026"
    return path


def duration_ms(start: float | None) -> int | None:
    """Milliseconds from `start` (a mitmproxy wall-clock timestamp) to now,
    when a flow is logged at its end; None when mitmproxy set no start."""
    if not start:
        return None
    return max(0, round((time.time() - start) * 1000))


class FlowLog(State):
    """Writes flows.jsonl (see the module's docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._flow_path = ""
        # flows.jsonl: open descriptor and when its path was last checked.
        self._flow_log: tuple[int, float] | None = None
        # Bytes in the open flows.jsonl, as far as this process knows.
        self._flow_log_size = 0
        # Log throttles: (sandbox, kind, name, port) -> window start, and
        # sandbox -> [window start, lines logged, lines suppressed].
        self._logged: Lru[tuple[Any, ...], float] = Lru(CACHE_MAX)
        self._log_budget: Lru[str | None, list[Any]] = Lru(CACHE_MAX)

    def log_flow(self, **fields: Any) -> bool:
        """Append one flow to flows.jsonl; whether it was (a denial may be
        throttled, see `_throttle`)."""
        if fields.get("decision") == "deny":
            suppressed = self._throttle(fields)
            if suppressed is None:
                return False
            fields["suppressed"] = suppressed
        g = fields.get
        record = {
            "sandbox": g("sandbox"),
            "timestamp": now_rfc3339(),
            "kind": g("kind"),
            "host": g("host"),
            "ip": g("ip"),
            "port": g("port"),
            "method": g("method"),
            "path": g("path"),
            "status": g("status"),
            "decision": g("decision"),
            "matched_rule": g("matched_rule"),
            "bytes_out": g("bytes_out", 0),
            "bytes_in": g("bytes_in", 0),
            "duration_ms": g("duration_ms"),
        }
        if (resolved := g("resolved")) is not None:
            # false: the name does not resolve to `ip` (and was refused).
            record["resolved"] = resolved
        if chain := g("chain"):
            # The aliases the name resolved through (bounded by CHAIN_MAX).
            record["chain"] = list(chain)
        if reason := g("reason"):
            # Only where a denial has no 403 body to say why (refused DNS
            # queries and answers, bodies cut off mid-stream); never a
            # secret: the addon's own words.
            record["reason"] = reason
        if g("suppressed"):
            # Lines of this sandbox not logged since its previous one (the
            # throttle of `_throttle`).
            record["suppressed"] = fields["suppressed"]
        if g("local"):
            # The destination is one of the host's own addresses: replay
            # must judge it as internal (ADR 0048).
            record["local"] = True
        if g("inspected") is False:
            # A TLS connection passed through unread (an `inspect: false`
            # rule, ADR 0051): no request inside it is seen or logged, and
            # nothing was injected. Absent means inspected.
            record["inspected"] = False
        if g("injected"):
            # A key went into this request: `ppp policy suggest` marks the
            # host (ADR 0048). Whether, never which or what.
            record["injected"] = True
        if not self.state_dir:
            return True
        line = (_JSON.encode(record) + "\n").encode()
        try:
            os.write(self._flow_fd(), line)  # one write: concurrent appenders never interleave
            self._flow_log_size += len(line)
            if self._flow_log_size > FLOW_LOG_MAX:
                self._rotate_flow_log()
        except OSError as e:
            self._close_flow_log()
            log.warning("ppp: could not append to flows.jsonl: %s", e)
        return True

    def _throttle(self, fields: dict[str, Any]) -> int | None:
        """Whether a denial is logged: None when it is not, else how many of
        this sandbox's denials were not logged since its last logged one.
        A guest chooses how many refused queries and connections it makes,
        and to which names, so each (sandbox, kind, name, port) of a DNS,
        TLS, TCP or UDP denial is logged once per LOG_WINDOW, and each
        sandbox's denials at most LOG_BUDGET times per LOG_WINDOW. Allowed
        flows are always logged."""
        now = time.monotonic()
        sandbox = fields.get("sandbox")
        key = (sandbox, fields.get("kind"), fields.get("host") or fields.get("ip"), fields.get("port"))
        budget = self._log_budget.get(sandbox)
        if budget is None or now - budget[0] >= LOG_WINDOW:
            budget = [now, 0, budget[2] if budget is not None else 0]
            self._log_budget[sandbox] = budget
        # HTTP denials are each worth a line (each is a request, each got a
        # response that says why), within the sandbox's budget.
        last = self._logged.get(key) if fields.get("kind") != "http" else None
        if (last is not None and now - last < LOG_WINDOW) or budget[1] >= LOG_BUDGET:
            budget[2] += 1
            return None
        self._logged[key] = now
        budget[1] += 1
        suppressed: int = budget[2]
        budget[2] = 0
        return suppressed

    def _rotate_flow_log(self) -> None:
        """flows.jsonl -> flows.jsonl.1 (replacing the older one): the log
        holds at most twice FLOW_LOG_MAX. Readers (`ppp policy log`, the
        TUI) read the rotated file after the current one."""
        self._close_flow_log()
        os.replace(self._flow_path, self._flow_path + ".1")

    def _flow_fd(self) -> int:
        """The open flows.jsonl, reopened when the file was replaced or
        removed (checked at most once a second): opening it for every flow
        cost 3% of mitmdump's time."""
        path = self._flow_path
        now = time.monotonic()
        if self._flow_log is not None and now - self._flow_log[1] > FLOW_LOG_RECHECK:
            try:
                same = os.stat(path).st_ino == os.fstat(self._flow_log[0]).st_ino
            except OSError:
                same = False
            if same:
                self._flow_log = (self._flow_log[0], now)
            else:
                self._close_flow_log()
        if self._flow_log is None:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._flow_log = (fd, now)
            self._flow_log_size = os.fstat(fd).st_size
        return self._flow_log[0]

    def _close_flow_log(self) -> None:
        if self._flow_log is not None:
            try:
                os.close(self._flow_log[0])
            except OSError:
                pass
            self._flow_log = None

    def _log_stream(self, flow: tcp.TCPFlow | udp.UDPFlow) -> None:
        meta = flow.metadata.get("ppp")
        if not meta or meta.get("logged"):
            return
        meta["logged"] = True
        # Counted by the message hooks, which drop each message once relayed.
        out = meta.get("bytes_out", 0) + sum(len(m.content) for m in flow.messages if m.from_client)
        inn = meta.get("bytes_in", 0) + sum(len(m.content) for m in flow.messages if not m.from_client)
        self.log_flow(
            sandbox=meta.get("sandbox"),
            kind=meta.get("kind"),
            host=meta.get("host"),
            ip=meta.get("ip"),
            port=meta.get("port"),
            decision=meta.get("decision"),
            matched_rule=meta.get("matched_rule"),
            bytes_out=out,
            bytes_in=inn,
            chain=meta.get("chain"),
            local=meta.get("local"),
            duration_ms=duration_ms(flow.timestamp_created),
        )

    def _log_dns(
        self, flow: dns.DNSFlow, sandbox: str | None, name: str | None, v: Verdict, allowed: bool = False
    ) -> bool:
        """Log a refused query or answer unless throttled, or an allowed
        query (the question's decision, which `ppp policy suggest` and
        `replay` need: by name, on port 53); whether it was logged."""
        ip, port = self._addr(flow.server_conn)
        if allowed:
            # Only ppp's resolver gets an allowed question (dns_request);
            # the address it is forwarded to is ppp's choice, not the guest's.
            ip, port = TUNNEL_DNS
        return self.log_flow(
            sandbox=sandbox,
            kind="dns",
            chain=v.chain,
            host=name,
            ip=ip,
            # The port the guest sent to (5353 stays 5353).
            port=port if port is not None else 53,
            status=None if allowed else "REFUSED",
            decision="allow" if allowed else "deny",
            matched_rule=v.rule_id,
            bytes_out=len(flow.request.packed),
            reason=None if allowed else v.reason,
        )

    def _log_http(self, flow: http.HTTPFlow) -> None:
        meta = flow.metadata.get("ppp", {})
        if meta.get("logged"):
            return
        meta["logged"] = True
        if "ip" in meta and "port" in meta:
            ip, port = meta["ip"], meta["port"]
        else:
            ip, port = self._addr(flow.server_conn)
            ip, port = meta.get("ip", ip), meta.get("port", port)
        # Streamed bodies were counted as they passed; buffered ones are here.
        out = meta.get("bytes_out") or len(flow.request.raw_content or b"")
        inn = meta.get("bytes_in") or (len(flow.response.raw_content or b"") if flow.response else 0)
        status = flow.response.status_code if flow.response else None
        if meta.get("aborted"):
            status = meta.get("status", status)
        self.log_flow(
            sandbox=meta.get("sandbox"),
            kind="http",
            host=meta.get("host") or canonical_host(flow.request.pretty_host),
            ip=ip,
            port=port,
            method=flow.request.method[:32],
            # Under HTTP rules, the canonical path the daemon matched (None
            # for one it could not canonicalise), never the guest's text.
            path=meta.get("http_path") if meta.get("http") else logged_path(flow.request.path),
            status=status,
            decision=meta.get("decision", "deny"),
            matched_rule=meta.get("matched_rule"),
            bytes_out=out,
            bytes_in=inn,
            reason=meta.get("aborted"),
            resolved=meta.get("resolved"),
            chain=meta.get("chain"),
            injected=meta.get("key_injected"),
            local=meta.get("local"),
            duration_ms=duration_ms(flow.request.timestamp_start),
        )
