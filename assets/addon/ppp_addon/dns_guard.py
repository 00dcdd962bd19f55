"""DNS: queries only to ppp's resolver, answers checked for rebinding.

Decides, through `decisions`, whether a name may be asked (`dns_request`)
and whether its answer may reach the guest (`dns_response`): every alias
(CNAME, DNAME) and every address in it is judged, an internal address
needs its own rule. Tells the daemon which addresses it gave the sandbox,
so a later connection to them is known to come from that name. Bounds the
alias chain (CHAIN_MAX) and what is forwarded: the question alone, no EDNS
or extra records. Must never trust the guest's choice of resolver (only
10.0.0.53), its extra records, or an upstream's additional records.
"""

from typing import Any

from mitmproxy import dns
from mitmproxy.net.dns import classes as dns_classes
from mitmproxy.net.dns import op_codes as dns_op_codes
from mitmproxy.net.dns import response_codes
from mitmproxy.net.dns import types as dns_types

from .common import Lru, addon_named, log
from .daemon import DaemonError
from .decisions import CHAIN_MAX, Decisions
from .flowlog import FlowLog
from .names import TUNNEL_DNS, canonical_host, ip_text, parse_ip
from .state import DENIED_MAX
from .verdict import Verdict, deny


class Dns(Decisions, FlowLog):
    """The DNS hooks."""

    def __init__(self) -> None:
        super().__init__()
        # DNS client connections whose questions go to the host's name
        # server (`_forward_dns`), by client id: that server.
        self._forwarded: Lru[str, tuple[str | None, int]] = Lru(DENIED_MAX)

    def dns_request(self, flow: dns.DNSFlow) -> None:
        sandbox = None
        name = None
        try:
            sandbox = self.sandbox_of(flow.client_conn)
            q = flow.request.question
            name = canonical_host(q.name) if q is not None else None
            server = flow.server_conn.address
            dest = (ip_text(str(server[0])), int(server[1])) if server is not None else None
            if sandbox is None:
                v = deny(f"unknown WireGuard port {self._port(flow.client_conn)}")
            elif dest is None or (dest != TUNNEL_DNS and self._forwarded.get(flow.client_conn.id) != dest):
                # Only ppp's resolver answers: a query to any other server
                # would carry the guest's bytes to the guest's choice.
                v = deny("DNS goes only to ppp's resolver at 10.0.0.53", "policy")
            elif name is None:
                v = deny("a DNS query without a question")
            else:
                v = self.decide(sandbox, name, None, 53, "dns")
                # Forward the question alone: EDNS options and additional or
                # authority records are the guest's own bytes.
                flow.request.additionals = []
                flow.request.authorities = []
                if v.allow:
                    self._forward_dns(flow, q)
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: dns_request failed, refusing")
            v = deny(f"internal error: {type(e).__name__}")
        if not v.allow:
            self._refuse_dns(flow, sandbox, name, v, "query")
        else:
            try:
                self._log_dns(flow, sandbox, name, v, allowed=True)
            except Exception:  # noqa: BLE001
                log.exception("ppp: could not log an allowed DNS query")

    def _forward_dns(self, flow: dns.DNSFlow, q: Any) -> None:
        """Send an allowed address question to the host's name server
        rather than let mitmproxy's resolver answer it: that resolver hands
        back bare addresses under the name asked, so the aliases (CNAME,
        DNAME) that led to them, which `dns_response` must judge, would be
        lost. Other questions mitmproxy forwards already. Without a name
        server known, mitmproxy's resolver answers (getaddrinfo: no aliases
        to judge; docs/addon.md says so)."""
        if (
            q.type not in (dns_types.A, dns_types.AAAA)
            or q.class_ != dns_classes.IN
            or flow.request.op_code != dns_op_codes.QUERY
        ):
            return
        resolver = addon_named("dnsresolver")
        servers = resolver.name_servers() if resolver is not None else []
        if not servers:
            return
        dest = (ip_text(servers[0]), 53)
        flow.server_conn.address = (servers[0], 53)
        # The guest's next question on this socket (glibc asks A and AAAA
        # on one) finds the server already pointed there.
        self._forwarded[flow.client_conn.id] = dest

    def dns_response(self, flow: dns.DNSFlow) -> None:
        """The DNS-rebinding defence, applied to answers.

        `dns_request` only sees the name. When the answer for an allowed name
        holds an internal address, the whole answer is refused unless a rule
        for that address allows it: the same `check` the HTTP, TLS and TCP
        paths make once the guest connects. Refusing here as well matters for
        what never reaches the tunnel: a name rebound to 127.0.0.1 makes the
        guest talk to its own loopback, where no connection check can see it.
        The port asked is 53, like `dns_request`'s: which port the guest will
        use is unknown here, so an address rule limited to another port does
        not open the name (the connection checks still judge that port).
        """
        sandbox = None
        name = None
        v: Verdict | None = None
        addrs: list[str] = []
        ttl = 0
        try:
            resp = flow.response
            if resp is not None:
                # The guest gets the answers alone: additional and authority
                # records are a channel the policy never looked at.
                resp.additionals = []
                resp.authorities = []
            # Nothing to check: no answer, or our own refusal coming back.
            if resp is None or not resp.answers:
                return
            q = flow.request.question
            name = canonical_host(q.name) if q is not None else None
            sandbox = self.sandbox_of(flow.client_conn)
            chain = self._dns_chain(name, resp.answers)
            if sandbox is None:
                v = deny(f"unknown WireGuard port {self._port(flow.client_conn)}")
            elif chain is None:
                v = deny(f"{name} resolves through more than {CHAIN_MAX} aliases", "alias")
            elif chain and not (v := self.decide(sandbox, name, None, 53, "dns", chain)).allow:
                pass
            else:
                for rr in resp.answers:
                    if rr.type == dns_types.A:
                        addr = parse_ip(str(rr.ipv4_address))
                    elif rr.type == dns_types.AAAA:
                        addr = parse_ip(str(rr.ipv6_address))
                    else:
                        continue  # CNAME and the like carry no address
                    if addr is None:
                        v = deny("an address record that does not parse")
                        break
                    v = self.decide(sandbox, name, str(addr), 53, "dns", chain)
                    if not v.allow:
                        break
                    addrs.append(str(addr))
                    ttl = rr.ttl if not ttl else min(ttl, rr.ttl)
        except Exception as e:  # noqa: BLE001
            log.exception("ppp: dns_response failed, refusing")
            v = deny(f"internal error: {type(e).__name__}")
        if v is not None and not v.allow:
            self._refuse_dns(flow, sandbox, name, v, "answer")
        elif sandbox is not None and name is not None and addrs:
            self._record_answer(sandbox, name, addrs, ttl, chain or ())

    @staticmethod
    def _dns_chain(name: str | None, answers: list[Any]) -> tuple[str, ...] | None:
        """Every other name in an answer section: each record's owner and
        each CNAME or DNAME target, canonical, in order, without repeats.
        A record for a name the chain never reached is in too: a guest's
        resolver may use it. None past CHAIN_MAX names."""
        out: list[str] = []
        for rr in answers:
            names = [rr.name]
            if rr.type in (dns_types.CNAME, dns_types.DNAME):
                names.append(rr.domain_name)
            for n in names:
                c = canonical_host(n)
                if c and c != name and c not in out:
                    out.append(c)
                    if len(out) > CHAIN_MAX:
                        return None
        return tuple(out)

    def _record_answer(self, sandbox: str, name: str, addrs: list[str], ttl: int, chain: tuple[str, ...] = ()) -> None:
        """Tell the daemon which addresses ppp's resolver gave this sandbox
        for `name`: a flow named `name` may go to these. Before the answer
        reaches the guest, so its connection never races the record. A
        failure is logged; the daemon then falls back to the host's own
        resolution."""
        try:
            req: dict[str, Any] = {"op": "resolved", "sandbox": sandbox, "name": name, "addrs": addrs, "ttl": int(ttl)}
            if chain:
                req["chain"] = list(chain)
            self._ask(req)
        except DaemonError as e:
            log.warning("ppp: [%s] could not record the DNS answer for %s: %s", sandbox, name, e)

    def _refuse_dns(self, flow: dns.DNSFlow, sandbox: str | None, name: str | None, v: Verdict, what: str) -> None:
        """Answer REFUSED (for a denied query, or an answer the rebinding
        defence refuses) and log it."""
        flow.response = flow.request.fail(response_codes.REFUSED)
        try:
            # proxy.log gets a line only when flows.jsonl does (throttled).
            if self._log_dns(flow, sandbox, name, v):
                log.info("ppp: [%s] refused the DNS %s for %s: %s", sandbox, what, name, v.reason)
        except Exception:  # noqa: BLE001
            log.exception("ppp: could not log a refused DNS %s", what)
