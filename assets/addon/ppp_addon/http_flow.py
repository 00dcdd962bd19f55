"""HTTP requests and responses, and WebSockets.

Decides, through `decisions`, whether a request may go on (by the one
name its SNI, Host and target agree on, and its destination), answers a
refusal with a 403 that says why and how to allow it, serves mitm.it
itself, and marks whether a secret may be injected (`secret_ok`). Holds a
request the default leaves to the user (`holds`), injects (`inject`),
streams every body through the limits (`limits`) and the scrubber, and
logs each flow (`flowlog`). Must never trust what the request says about
where it goes: the names must agree, an absolute-form target is
forwarded in origin-form, and the destination address is the daemon's to
check.
"""

import os
from typing import Any

from mitmproxy import ctx, http

from .common import header_text, kill, log
from .flowlog import FlowLog, duration_ms
from .holds import Holds
from .inject import Injection
from .limits import MAX_HEADER_BYTES, Limits
from .names import canonical_host, ip_text, request_name
from .usage import Usage
from .verdict import LOCAL, LOCAL_HOST, Verdict, deny

# Headers that make servers run another method than the request line's: the
# daemon refuses a request carrying one when HTTP rules cover its host
# (policy::http::OVERRIDE_HEADERS).
OVERRIDE_HEADERS = ("x-http-method-override", "x-http-method", "x-method-override")
# The longest raw path sent to the daemon: one past its MAX_PATH (8 KiB),
# so a longer one is still refused there, and the line stays far under the
# socket's 64 KiB.
MAX_SENT_PATH = 8 * 1024 + 1


def http_request(flow: http.HTTPFlow) -> tuple[str, str, bool]:
    """What the HTTP rules judge, as the upstream will get it: the method
    and path bytes mitmproxy forwards (HTTP/1's origin-form, the path of an
    absolute-form target, which is forwarded in origin-form, or HTTP/2's
    `:path`), one char per byte (latin-1: the daemon refuses every byte
    that is not printable ASCII), and whether an override header came.
    Judges nothing: the daemon canonicalises and matches."""
    req = flow.request
    method = req.data.method[:64].decode("latin-1")
    path = req.data.path[:MAX_SENT_PATH].decode("latin-1")
    overridden = any(h in req.headers for h in OVERRIDE_HEADERS)
    return (method, path, overridden)


class Http(Holds, Injection, FlowLog, Limits, Usage):
    """The HTTP and WebSocket hooks."""

    def __init__(self) -> None:
        super().__init__()

    @staticmethod
    def hint(sandbox: str | None, host: str | None) -> str:
        if sandbox and host:
            return f"ppp policy allow network --sandbox {sandbox} {host}"
        return "ppp policy allow network --sandbox <name> <host>"

    def _deny_http(self, flow: http.HTTPFlow, sandbox: str | None, host: str | None, v: Verdict) -> None:
        """Answer 403 with why, and a fix only where one helps: allowing a
        host again does nothing for a flow refused for another reason."""
        fix: str | None = None
        if v.tls:
            # The ClientHello was refused: what to allow is its SNI, not
            # whatever the request inside names.
            host = v.sni
        if v.kind == "policy" and v.rule_id is not None:
            why = f"blocked by ppp policy rule {v.rule_id} ({v.resource})"
            fix = self.hint(sandbox, host)
        elif v.kind == "policy" and v.reason.startswith("default"):
            why = "blocked by ppp policy: default deny"
            fix = self.hint(sandbox, host)
        elif v.kind == "policy":
            why = f"blocked by ppp: {v.reason}"
            fix = self.hint(sandbox, host)
        elif v.kind == "address":
            why = f"blocked by ppp: {v.reason}"
            fix = self.hint(sandbox, v.allow_target)
        elif v.kind == "unresolved":
            why = f"blocked by ppp: {v.reason}"
            fix = "connect to an address that the sandbox's DNS (10.0.0.53) returns for the name"
        elif v.kind == "alias":
            # Allowing the name changes nothing: the deny on its alias wins.
            why = f"blocked by ppp: {v.reason}"
        elif v.kind == "mismatch":
            why = f"blocked by ppp: {v.reason}"
            fix = "send the same host name in the TLS SNI, the Host header and the request target"
        elif v.kind == "http":
            why = f"blocked by ppp: {v.reason}"
            if v.rule_id is None and v.reason.startswith("no HTTP rule"):
                method = flow.request.method[:32]
                path = v.http_path or "/"
                where = f"--sandbox {sandbox} " if sandbox else ""
                fix = f"ppp policy allow http {where}{host} --method {method} --path '{path}'"
        elif v.kind == "daemon":
            why = f"blocked by ppp: {v.reason}"
            fix = "on the host: ppp daemon status (then ppp daemon start)"
        else:
            why = f"blocked by ppp: {v.reason}"
        if v.tls:
            why = f"{why} (refused at the TLS handshake, by its SNI)"
        body = f"{why}\nhost: {host}\n"
        if v.allow_target is not None:
            body += f"address: {v.allow_target}\n"
        if fix is not None:
            prefix = "to allow" if fix.startswith("ppp policy allow") else "to fix"
            body += f"{prefix}: {fix}\n"
        flow.response = http.Response.make(403, body.encode(), {"content-type": "text/plain; charset=utf-8"})
        self._mark(flow, sandbox, host, v, False)
        if v.kind == "unresolved":
            flow.metadata["ppp"]["resolved"] = False
        log.info("ppp: [%s] denied HTTP %s: %s", sandbox, host, why)

    def _http_decide(
        self, flow: http.HTTPFlow, off_loop: bool = True
    ) -> tuple[str, str | None, str | None, int, Verdict | None] | None:
        """Decide a request and mark it; or return what to go on with
        (sandbox, host, ip, port, and the verdict): when the default leaves
        it to the user (an `ask` verdict), or, with `off_loop`, when the
        daemon must be asked (None: `_asked` does)."""
        sandbox = None
        host = None
        try:
            sandbox = self.sandbox_of(flow.client_conn)
            ip, port = self._addr(flow.server_conn)
            if ip is None:
                ip = ip_text(flow.request.host)
            if port is None:
                port = flow.request.port
            host, mismatch = request_name(flow)
            prior = self._denied.get(flow.client_conn.id)
            if sandbox is None:
                v = deny(f"unknown WireGuard port {self._port(flow.client_conn)}")
            elif prior is not None:
                v = prior
            elif mismatch is not None:
                v = deny(mismatch, "mismatch")
            elif host == LOCAL_HOST:
                self._mark(flow, sandbox, host, LOCAL, True, ip, port)
                self._serve_local(flow)
                return None
            else:
                request = http_request(flow)
                if off_loop:
                    if (cached := self._cached(sandbox, host, ip, port, "http", request)) is None:
                        return (sandbox, host, ip, port, None)
                    v = cached
                else:
                    v = self.decide(sandbox, host, ip, port, "http", request=request)
                if v.kind == "ask" and (approved := self._approved_for(flow.client_conn, host)) is not None:
                    v = approved
            if v.kind == "ask" and sandbox is not None and port is not None:
                return (sandbox, host, ip, port, v)
            self._http_decided(flow, sandbox, host, ip, port, v)
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: HTTP policy check failed, denying")
            self._deny_http(flow, sandbox, host, deny(f"internal error: {type(e).__name__}"))
        return None

    def _http_decided(
        self, flow: http.HTTPFlow, sandbox: str | None, host: str | None, ip: str | None, port: int | None, v: Verdict
    ) -> None:
        try:
            if not v.allow:
                self._deny_http(flow, sandbox, host, v)
                return
            self._mark(flow, sandbox, host, v, True, ip, port)
            meta = flow.metadata["ppp"]
            named = host is not None and ip_text(host) is None
            # The daemon refused every name that does not resolve to `ip`.
            meta["resolved"] = True if named and ip is not None else None
            # A secret goes only where the guest cannot redirect it: TLS on
            # both legs (the upstream's certificate verified for the name,
            # which mitmproxy does against the SNI it sends: the client's),
            # and SNI, Host and target all naming the service's host.
            client = flow.client_conn
            meta["secret_ok"] = (
                named
                and client.tls_established
                and flow.request.scheme == "https"
                and canonical_host(client.sni) == host
                and not self._ssl_insecure
            )
            meta["limits"] = v.limits
            meta["metered_host"] = v.metered
            if flow.request.authority and flow.request.http_version.startswith("HTTP/1"):
                # Absolute-form: forward origin-form, so an upstream that
                # routes by the target sees the name that was decided.
                flow.request.authority = ""
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: HTTP policy check failed, denying")
            self._deny_http(flow, sandbox, host, deny(f"internal error: {type(e).__name__}"))

    @staticmethod
    def _serve_local(flow: http.HTTPFlow) -> None:
        """Answer mitm.it: the CA certificate at /cert/pem, 404 otherwise."""
        path = flow.request.path.split("?", 1)[0]
        if flow.request.method in ("GET", "HEAD") and path == "/cert/pem":
            confdir = os.path.expanduser(ctx.options.confdir)
            with open(os.path.join(confdir, "mitmproxy-ca-cert.pem"), "rb") as f:
                pem = f.read()
            flow.response = http.Response.make(200, pem, {"content-type": "application/x-x509-ca-cert"})
        else:
            flow.response = http.Response.make(
                404, b"ppp serves only /cert/pem on mitm.it\n", {"content-type": "text/plain; charset=utf-8"}
            )

    def requestheaders(self, flow: http.HTTPFlow) -> Any:
        held = self._http_decide(flow)
        if held is not None:
            return self._http_held(flow, *held)
        over = self._after_headers(flow)
        if over is not None:
            # A budget that asks: held off the event loop, as `_hold` is.
            return self._budget_held(flow, over)
        return None

    async def _http_held(
        self, flow: http.HTTPFlow, sandbox: str, host: str | None, ip: str | None, port: int, v: Verdict | None
    ) -> None:
        if v is None:
            v = await self._asked(flow.client_conn, sandbox, host, ip, port, "http", http_request(flow))
            if v.kind == "ask" and (approved := self._approved_for(flow.client_conn, host)) is not None:
                v = approved
            if v.kind != "ask":
                self._http_decided(flow, sandbox, host, ip, port, v)
                if (over := self._after_headers(flow)) is not None:
                    await self._budget_held(flow, over)
                return
        req = flow.request
        # The path without its query, which can carry secrets; bounded.
        path = req.path.split("?", 1)[0][:1024]
        cl = header_text(req.headers, b"content-length").strip()
        v = await self._hold(
            flow.client_conn, sandbox, host, ip, port, "http", req.method[:16], path, int(cl) if cl.isdigit() else None
        )
        self._http_decided(flow, sandbox, host, ip, port, v)
        if (over := self._after_headers(flow)) is not None:
            await self._budget_held(flow, over)

    def _after_headers(self, flow: http.HTTPFlow) -> dict[str, Any] | None:
        """Meter, inject and stream an allowed request; or return the
        `over` of a budget that asks (ADR 0055): the caller holds the
        request (`_budget_held`), which then goes on in `_go_on`."""
        meta: dict[str, Any] = {}
        try:
            meta = flow.metadata.get("ppp", {})
            if flow.response is None and meta.get("decision") == "allow":
                if self._header_bytes(flow.request) > MAX_HEADER_BYTES:
                    self._refuse_headers(flow)
                else:
                    # Headers only (placeholders are substituted in headers,
                    # never in bodies), so the body can be streamed: the key
                    # goes in now, before mitmproxy sends the headers on.
                    meta["injected"] = True
                    # The budget first: a request past one gets no key.
                    over = self._meter_request(flow, *http_request(flow)[:2])
                    if over is not None and over.get("ask") is True:
                        return over
                    self._go_on(flow, over)
            self._stream_request(flow)
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: requestheaders failed, denying")
            self._deny_http(flow, meta.get("sandbox"), meta.get("host"), deny(f"internal error: {type(e).__name__}"))
            self._refused_body(flow)
        return None

    def _go_on(self, flow: http.HTTPFlow, over: dict[str, Any] | None) -> None:
        """Answer a request past a budget with its 429, or inject its key."""
        meta = flow.metadata.get("ppp", {})
        if over is not None:
            self._over_budget(flow, over)
        elif meta.get("secret_ok"):
            self._inject(flow, meta["sandbox"], meta["host"])

    async def _budget_held(self, flow: http.HTTPFlow, over: dict[str, Any]) -> None:
        """Hold a request a budget asks about until the user answers;
        then on (the daemon raised the budget once) or the 429."""
        meta: dict[str, Any] = {}
        try:
            meta = flow.metadata.get("ppp", {})
            method, path = http_request(flow)[:2]
            cl = header_text(flow.request.headers, b"content-length").strip()
            size = int(cl) if cl.isdigit() else None
            self._go_on(flow, await self._budget_hold(flow.client_conn, meta, over, method, path, size))
            self._stream_request(flow)
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: a budget hold failed, denying")
            self._deny_http(flow, meta.get("sandbox"), meta.get("host"), deny(f"internal error: {type(e).__name__}"))
            self._refused_body(flow)

    def _stream_request(self, flow: http.HTTPFlow) -> None:
        """The upload limit and the counted stream of a request going on;
        the refused body of one answered here."""
        if flow.response is None:
            # The limit is known once the key is in: the default upload
            # limit does not apply to a request that carries one.
            limit = self._limit(flow, "upload")
            cl = header_text(flow.request.headers, b"content-length")
            if limit and cl and cl.strip().isdigit() and int(cl) > limit:
                self._too_large(flow, "upload", limit)
        if flow.response is None:
            # Streamed as it arrives, counted against the limit; never
            # held whole in memory.
            flow.request.stream = self._counter(flow, "request", self._limit(flow, "upload"))
        else:
            self._refused_body(flow)

    def request(self, flow: http.HTTPFlow) -> None:
        if "ppp" not in flow.metadata and (held := self._http_decide(flow, off_loop=False)) is not None:
            # requestheaders did not run (e.g. a replayed flow), and nobody
            # is asked about a flow that is not the guest's own.
            self._http_decided(flow, *held[:4], deny("only a request from the guest is held for approval", "policy"))
        meta = flow.metadata.get("ppp", {})
        if flow.response is not None or meta.get("decision") != "allow":
            return
        try:
            limit = self._limit(flow, "upload")
            raw = flow.request.raw_content
            if raw is not None and limit and len(raw) > limit:
                # A body that was buffered after all (a replayed flow).
                self._too_large(flow, "upload", limit)
                return
            if meta.get("secret_ok") and not meta.get("injected"):
                self._inject(flow, meta["sandbox"], meta["host"])
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: secret injection failed, denying")
            self._deny_http(flow, meta.get("sandbox"), meta.get("host"), deny(f"internal error: {type(e).__name__}"))

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        try:
            if flow.response is None or flow.metadata.get("ppp", {}).get("decision") != "allow":
                return
            limit = self._limit(flow, "download")
            cl = header_text(flow.response.headers, b"content-length")
            if limit and cl and cl.strip().isdigit() and int(cl) > limit:
                # Declared too large: answer 413 now and stream the upstream
                # body into the void, so it is never buffered. mitmproxy sends
                # these headers at once, then what `stream` returns per chunk;
                # the final call (with b"") emits the 413's body.
                self._too_large(flow, "download", limit)
                assert flow.response is not None
                body = flow.response.raw_content or b""
                sent = False

                def discard(chunk: bytes) -> bytes | list[bytes]:
                    nonlocal sent
                    if chunk == b"" and not sent:
                        sent = True
                        return body
                    # Not b"": an empty chunk would end a chunked body.
                    return []

                flow.response.stream = discard
                flow.metadata["ppp_too_large"] = "streamed"
            else:
                flow.response.stream = self._counter(flow, "response", limit)
                # Scrubbed before it is counted and passed on.
                self._scrub_response(flow)
                # Metered first of all, on the bytes the upstream sent.
                self._meter_response(flow)
        except Exception:  # noqa: BLE001
            log.exception("ppp: responseheaders failed")
            kill(flow)

    def response(self, flow: http.HTTPFlow) -> None:
        self._scrub.pop(flow.id, None)
        try:
            meta = flow.metadata.get("ppp", {})
            limit = self._limit(flow, "download")
            if (
                limit
                and meta.get("decision") == "allow"
                and flow.response is not None
                and flow.metadata.get("ppp_too_large") != "streamed"
                and len(flow.response.raw_content or b"") > limit
            ):
                # A body that was buffered after all (set by another addon).
                self._too_large(flow, "download", limit)
            self._log_http(flow)
            self._meter_end(flow, cut=False)
        except Exception:  # noqa: BLE001
            log.exception("ppp: response hook failed")

    def error(self, flow: http.HTTPFlow) -> None:
        self._scrub.pop(flow.id, None)
        try:
            self._log_http(flow)
            self._meter_end(flow, cut=True)
        except Exception:  # noqa: BLE001
            log.exception("ppp: error hook failed")

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        meta = flow.metadata.get("ppp") or {}
        if meta.get("decision") == "allow" and meta.get("sandbox"):
            self._live[flow.id] = (flow, meta["sandbox"], meta.get("host"), meta.get("ip"), meta.get("port", 0), "http")

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        ws = flow.websocket
        if ws is not None and ws.messages:
            m = ws.messages[-1]
            self._count_message(flow, ws.messages, m.from_client, len(m.content), "ws_")

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        self._live.pop(flow.id, None)
        meta = flow.metadata.get("ppp")
        if meta is not None and meta.get("decision") == "allow":
            # The HTTP flow was logged at its 101; the stream gets a line
            # of its own with what it carried.
            self.log_flow(
                sandbox=meta.get("sandbox"),
                kind="websocket",
                host=meta.get("host"),
                ip=meta.get("ip"),
                port=meta.get("port"),
                decision="allow",
                matched_rule=meta.get("matched_rule"),
                bytes_out=meta.get("ws_out", 0),
                bytes_in=meta.get("ws_in", 0),
                duration_ms=duration_ms(flow.timestamp_created),
            )
