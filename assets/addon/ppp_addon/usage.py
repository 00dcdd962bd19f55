"""LLM usage metering: the tokens each metered response reports.

Decides nothing about which flow is metered: for a request whose upstream
TLS was verified for its host (`secret_ok`) to a host the daemon says a
provider answers on (`Verdict.metered`), the daemon is asked `meter`, and
its reply names the provider and where its responses put the usage. This
module only reads those fields, from the upstream's response as it
streams past (`Meter.feed`, composed in front of the limits and the
scrubber; every chunk goes on unchanged and at once), and at the end
reports op `usage` to the daemon, which writes usage.jsonl once per flow.

Bounds what an upstream can make it hold: one SSE event (MAX_EVENT), one
JSON body (MAX_JSON), decoded bytes per chunk step (DECODE_STEP); past one,
parsing stops and the record is marked estimated. Never trusts the
request: the request body is never parsed, only counted for an estimate.
A response that reports no usage (an error, a cut stream, a stream
without usage) is never zero: output is estimated from the response bytes
seen and, when the upstream accepted the request (2xx), input from the
request body bytes forwarded upstream, about BYTES_PER_TOKEN each
(docs/user-guide/usage.md).
"""

import concurrent.futures
import json
import re
import threading
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from mitmproxy import http

from .common import header_text, log
from .daemon import DaemonError
from .state import State

# The largest SSE event kept while it arrives; a longer one is skipped.
MAX_EVENT = 1024 * 1024
# The largest non-SSE body kept to be parsed at its end; past it, estimated.
MAX_JSON = 8 * 1024 * 1024
# Decoded bytes produced per step from a compressed chunk, so a small
# chunk that inflates hugely is parsed piecewise, never held whole.
DECODE_STEP = 256 * 1024
# The estimate when a response reports no usage: about this many bytes of
# text per token (English prose and code with common tokenizers).
BYTES_PER_TOKEN = 4
# Reports the daemon could not take (restarting), retried with the next
# report; past it the oldest is dropped (and logged). Also the most reports
# waiting for the sender thread.
PENDING_MAX = 256
# The fields of a record, besides the model.
COUNTS = ("input", "output", "cache_read", "cache_write")

# What a request to a provider's host gets when the daemon could not say
# whether a budget stops it: refused, in the shape `over` has.
UNCHECKED: dict[str, Any] = {
    "status": 503,
    "headers": [["content-type", "application/json"]],
    "body": json.dumps(
        {"error": {"type": "ppp_unavailable", "message": "ppp could not check this request against its budgets"}}
    ),
    "message": "the daemon did not answer the budget check",
    "ask": False,
}

_LINE_END = re.compile(rb"\r\n|\r|\n")


def read_path(obj: Any, dotted: str) -> Any:
    """The value at `a.b.c` in parsed JSON, or None."""
    for key in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def read_count(obj: Any, alternatives: list[str]) -> int | None:
    """The first alternative present: each a dotted path, or paths joined
    by `+` whose present values are summed. Only non-negative integers
    count (a bool is not one)."""
    for alt in alternatives:
        total, found = 0, False
        for path in alt.split("+"):
            v = read_path(obj, path)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
                total, found = total + v, True
        if found:
            return total
    return None


class Fields:
    """The usage one response reported, merged over its SSE events: per
    count the largest value seen (providers report cumulative counts), the
    first model named."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = {k: [str(a) for a in spec.get(k) or [] if isinstance(a, str)] for k in ("model", *COUNTS)}
        self.counts: dict[str, int] = {}
        self.model = ""

    def feed(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        for k in COUNTS:
            n = read_count(obj, self.spec[k])
            if n is not None and n > self.counts.get(k, -1):
                self.counts[k] = n
        if not self.model:
            for alt in self.spec["model"]:
                m = read_path(obj, alt)
                if isinstance(m, str) and m:
                    self.model = m[:128]
                    break

    @property
    def reported(self) -> bool:
        return "input" in self.counts or "output" in self.counts


class SseSplitter:
    """Splits a text/event-stream into events, chunk by chunk: lines end in
    CRLF, LF or CR (a CR at a chunk's end waits for the next byte), an
    empty line ends an event, and its `data:` lines joined by LF are its
    payload. One event is held at most MAX_EVENT bytes; a longer one is
    skipped to its end, and `overflowed` says so."""

    def __init__(self, max_event: int = MAX_EVENT) -> None:
        self.max_event = max_event
        self.buf = b""
        self.data: list[bytes] = []
        self.size = 0
        self.skipping = False
        self.overflowed = False

    def feed(self, chunk: bytes) -> list[bytes]:
        out: list[bytes] = []
        buf = self.buf + chunk
        # A CR at the end may be the first half of a CRLF.
        hold = buf.endswith(b"\r")
        lines = _LINE_END.split(buf[:-1] if hold else buf)
        rest = lines.pop()
        for line in lines:
            self._line(line, out)
        if hold:
            rest += b"\r"
        if len(rest) + self.size > self.max_event:
            # A line (or event) longer than any usage event: drop it.
            self._overflow()
            rest = b""
        self.buf = rest
        return out

    def _overflow(self) -> None:
        self.overflowed = True
        self.skipping = True
        self.data, self.size = [], 0

    def _line(self, line: bytes, out: list[bytes]) -> None:
        if not line:
            if self.data and not self.skipping:
                out.append(b"\n".join(self.data))
            self.data, self.size, self.skipping = [], 0, False
            return
        if self.skipping:
            return
        if line.startswith(b"data:"):
            value = line[5:]
            if value.startswith(b" "):
                value = value[1:]
            self.size += len(value) + 1
            if self.size > self.max_event:
                self._overflow()
                return
            self.data.append(value)

    def end(self) -> list[bytes]:
        """The last event, when the stream ended without its empty line."""
        out: list[bytes] = []
        if self.buf:
            self._line(self.buf.rstrip(b"\r"), out)
            self.buf = b""
        self._line(b"", out)
        return out


class Decoder:
    """Undoes a response's Content-Encoding incrementally (gzip, deflate,
    br, zstd; identity passes through). `ok` is False for an encoding it
    cannot undo: the response is then estimated."""

    def __init__(self, encoding: str) -> None:
        self.ok = True
        self._step: Callable[[bytes], Iterable[bytes]] | None = None
        enc = encoding.strip().lower()
        if enc in ("", "identity"):
            return
        if enc in ("gzip", "x-gzip", "deflate"):
            # 32 + 15: a gzip or zlib header, detected.
            z = zlib.decompressobj(32 + 15)
            self._step = lambda data: _inflate(z, data)
        elif enc == "br":
            try:
                import brotli  # type: ignore[import-untyped]  # mitmproxy's own dependency

                d = brotli.Decompressor()
                self._step = lambda data: [d.process(data)]
            except ImportError:
                self.ok = False
        elif enc == "zstd":
            try:
                import zstandard  # mitmproxy's own dependency

                zd = zstandard.ZstdDecompressor().decompressobj()
                self._step = lambda data: [zd.decompress(data)]
            except ImportError:
                self.ok = False
        else:
            self.ok = False

    def decode(self, data: bytes) -> Iterable[bytes]:
        if not self.ok:
            return []
        if self._step is None:
            return [data]
        try:
            return list(self._step(data))
        except Exception:  # noqa: BLE001 - a corrupt body is estimated, never a crash
            self.ok = False
            return []


def _inflate(z: Any, data: bytes) -> Iterable[bytes]:
    while data:
        out = z.decompress(data, DECODE_STEP)
        yield out
        data = z.unconsumed_tail


class Meter:
    """One metered response: fed each raw chunk as it passes, it keeps
    what it needs to read the usage and nothing else."""

    def __init__(self, spec: dict[str, Any], sse: bool, encoding: str) -> None:
        self.fields = Fields(spec.get("usage") or {})
        self.includes_cache = spec.get("input_includes_cache_read") is True
        self.sse = SseSplitter() if sse else None
        self.body: list[bytes] | None = None if sse else []
        self.body_size = 0
        self.decoder = Decoder(encoding)
        self.seen = 0
        self.estimated = not self.decoder.ok

    def feed(self, chunk: bytes) -> None:
        try:
            for data in self.decoder.decode(chunk):
                self.seen += len(data)
                if self.sse is not None:
                    for event in self.sse.feed(data):
                        self._event(event)
                elif self.body is not None:
                    self.body_size += len(data)
                    if self.body_size > MAX_JSON:
                        self.body, self.estimated = None, True
                    else:
                        self.body.append(data)
            if not self.decoder.ok:
                self.estimated = True
        except Exception:  # noqa: BLE001 - metering never breaks the stream
            log.exception("ppp: usage parser failed; the record is estimated")
            self.estimated = True

    def _event(self, data: bytes) -> None:
        try:
            self.fields.feed(json.loads(data))
        except ValueError:
            pass  # `[DONE]`, a comment, or not JSON: no usage in it

    def finish(self, bytes_out: int, cut: bool, accepted: bool = True) -> dict[str, Any]:
        """The report: the counts read (input less the cached part where
        the provider includes it), or, when the response reported none,
        was cut or outgrew a bound, an estimate marked so.

        `accepted`: the upstream answered 2xx, so it took the request and
        bills its input. Only then is input estimated from the request's
        bytes: an upstream that refused it (401, 400, 413, 529) billed no
        input, and a guest must not inflate its count, or exhaust a
        budget other sandboxes share, with large bodies the provider
        rejects."""
        if self.sse is not None:
            for event in self.sse.end():
                self._event(event)
            if self.sse.overflowed:
                self.estimated = True
        elif self.body is not None:
            try:
                self.fields.feed(json.loads(b"".join(self.body)))
            except ValueError:
                pass
            self.body = None
        c = dict(self.fields.counts)
        if self.includes_cache and "input" in c:
            c["input"] = max(0, c["input"] - c.get("cache_read", 0))
        estimated = self.estimated or cut or not self.fields.reported
        if estimated:
            guess_in = -(-bytes_out // BYTES_PER_TOKEN)
            guess_out = -(-self.seen // BYTES_PER_TOKEN)
            if "input" not in c:
                c["input"] = max(0, guess_in - c.get("cache_read", 0)) if accepted else 0
            c["output"] = max(c.get("output", 0), guess_out)
        report: dict[str, Any] = {k: int(c.get(k, 0)) for k in COUNTS}
        report["model"] = self.fields.model
        report["estimated"] = estimated
        return report


class Usage(State):
    """The metering hooks' work, called from `http_flow`."""

    def __init__(self) -> None:
        super().__init__()
        # Touched by the sender thread alone.
        self._pending_usage: list[dict[str, Any]] = []
        # Reports are sent from one thread of their own: the daemon may be
        # compacting usage.jsonl, or restarting, and the event loop that
        # carries every sandbox's traffic must not wait for it.
        self._usage_sender: concurrent.futures.ThreadPoolExecutor | None = None
        self._usage_queued = 0
        self._usage_lock = threading.Lock()

    def _meter_request(self, flow: http.HTTPFlow, method: str, path: str) -> dict[str, Any] | None:
        """Ask whether this request's response is metered; called once its
        headers are decided and allowed, before any key goes in. The
        reply's `over` (a budget this request would go past, ADR 0055) is
        returned: the caller answers it instead of sending the request on,
        or holds it when the budget asks. A failure to ask is a refusal
        (`UNCHECKED`, a 503): a request to a provider's host that no budget
        could be checked for must not go on uncounted and unchecked."""
        meta = flow.metadata.get("ppp") or {}
        if not (meta.get("metered_host") and meta.get("secret_ok") and self.daemon is not None):
            return None
        req = {
            "op": "meter",
            "sandbox": meta.get("sandbox"),
            "host": meta.get("host"),
            "port": meta.get("port") or 0,
            "method": method,
            "path": path,
        }
        try:
            r = self.daemon.ask(req)
        except DaemonError as e:
            log.warning("ppp: could not ask whether %s is metered, refusing: %s", meta.get("host"), e)
            return dict(UNCHECKED)
        if not r.get("ok"):
            log.warning("ppp: the daemon refused to meter %s, refusing: %s", meta.get("host"), r.get("reason"))
            return dict(UNCHECKED)
        m = r.get("meter")
        if isinstance(m, dict) and isinstance(m.get("provider"), str):
            meta["meter"] = m
            over = m.get("over")
            if isinstance(over, dict):
                return over
        return None

    @staticmethod
    def _over_budget(flow: http.HTTPFlow, over: dict[str, Any]) -> None:
        """Answer a request past a budget with the daemon's 429 in the
        provider's own error shape: nothing goes upstream, no key goes in,
        and the flow log line says which budget (`reason`)."""
        meta = flow.metadata.get("ppp") or {}
        headers = {str(k): str(v) for k, v in over.get("headers") or [] if isinstance(k, str)}
        status = over.get("status")
        flow.response = http.Response.make(
            status if isinstance(status, int) else 429, str(over.get("body", "")).encode(), headers
        )
        message = str(over.get("message") or "a budget is used up")
        meta["decision"] = "deny"
        meta["aborted"] = f"budget: {message}"[:1024]
        # The request is refused, not metered: no response of the provider's.
        meta.pop("meter", None)
        log.info("ppp: [%s] refused HTTP %s: %s", meta.get("sandbox"), meta.get("host"), message)

    def _meter_response(self, flow: http.HTTPFlow) -> None:
        """Put the meter in front of the response's stream: it sees each
        chunk as the upstream sent it, then the rest of the chain (the
        scrubber, the limits) gets it unchanged."""
        meta = flow.metadata.get("ppp") or {}
        spec = meta.get("meter")
        if spec is None or flow.response is None:
            return
        ctype = header_text(flow.response.headers, b"content-type").lower()
        meter = Meter(spec, "text/event-stream" in ctype, header_text(flow.response.headers, b"content-encoding"))
        meta["meter_state"] = meter
        inner = flow.response.stream

        def metered(chunk: bytes) -> Iterable[bytes] | bytes:
            if chunk:
                meter.feed(chunk)
            if callable(inner):
                return inner(chunk)
            return chunk

        flow.response.stream = metered

    def _meter_end(self, flow: http.HTTPFlow, cut: bool) -> None:
        """Report a metered response once, at its end (`response`) or when
        it broke off (`error`)."""
        meta = flow.metadata.get("ppp") or {}
        spec = meta.get("meter")
        meter = meta.pop("meter_state", None)
        if spec is None or meta.get("usage_reported"):
            return
        if meter is None:
            # No response began (ppp answered it, or the upstream never
            # did): nothing of the provider's to read or estimate.
            return
        meta["usage_reported"] = True
        accepted = flow.response is not None and 200 <= flow.response.status_code < 300
        report = meter.finish(int(meta.get("bytes_out") or 0), cut, accepted)
        report.update(op="usage", sandbox=meta.get("sandbox"), provider=spec["provider"], flow=flow.id)
        with self._usage_lock:
            if self._usage_queued >= PENDING_MAX:
                log.warning("ppp: %d usage reports wait for the daemon; one dropped", self._usage_queued)
                return
            self._usage_queued += 1
        if self._usage_sender is None:
            self._usage_sender = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ppp-usage")
        self._usage_sender.submit(self._send_queued, report)

    def _send_queued(self, report: dict[str, Any]) -> None:
        with self._usage_lock:
            self._usage_queued -= 1
        try:
            self._send_usage(report)
        except Exception:  # noqa: BLE001 - a report is never worth the thread
            log.exception("ppp: usage report failed")

    def _send_usage(self, report: dict[str, Any]) -> None:
        """Send `report`, and any the daemon missed before; a report the
        daemon cannot take now waits for the next (it writes each flow
        once, so a retry never counts twice)."""
        queue = [*self._pending_usage, report]
        self._pending_usage = []
        for i, r in enumerate(queue):
            try:
                if self.daemon is None:
                    raise DaemonError("ppp_state_dir is not set")
                reply = self.daemon.ask(r)
                if not reply.get("ok"):
                    log.warning("ppp: the daemon refused a usage report: %s", reply.get("detail"))
            except DaemonError as e:
                log.warning("ppp: usage report deferred: %s", e)
                self._pending_usage = queue[i:][-PENDING_MAX:]
                if len(queue) - i > PENDING_MAX:
                    log.warning("ppp: %d usage reports dropped", len(queue) - i - PENDING_MAX)
                return
