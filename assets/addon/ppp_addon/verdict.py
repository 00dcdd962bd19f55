"""What a decision is: `Verdict`, and the ones the addon makes itself.

Decides only the built-in answers: `DAEMON_DOWN` (fail closed when the
daemon cannot be asked), `deny` for a refusal the addon itself makes
(unknown port, malformed input, an internal error) and `LOCAL` for mitm.it,
the one host ppp answers itself. Everything else in a Verdict is the
daemon's. Trusts nothing from the guest: a Verdict is built only from the
daemon's reply (`decisions`) or from the addon's own words.
"""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    allow: bool
    rule_id: str | None = None
    resource: str | None = None
    # Why, in words, for the 403 body and the log.
    reason: str = ""
    generation: int | None = None
    # What the user would allow to let this flow through, when it is not the
    # host: the internal address of a DNS-rebinding refusal.
    allow_target: str | None = None
    # What kind of refusal, for the 403's words and hint: "policy" (a rule or
    # the default: allowing the host helps), "address" (an internal address
    # needs its own rule), "unresolved" (the name does not resolve to the
    # address), "mismatch" (SNI, Host and target disagree), "daemon" (fail
    # closed), "internal" (an error inside the addon), "http" (the HTTP
    # rules of the host refuse the request, or the connection cannot be
    # inspected).
    kind: str = "policy"
    # Decided at the TLS ClientHello, for every request inside: the SNI it
    # was about, which the 403 names (the request's Host may differ).
    tls: bool = False
    sni: str | None = None
    # The body-size limits of an allowed flow, as the daemon decided them:
    # {"upload": {"bytes": N | None, "from": "rule|sandbox|global|default"},
    #  "download": {...}}.
    limits: Any = None
    # For a flow that was held: how its wait ended ("allowed", "denied",
    # "timeout", "full", "policy").
    approval: str | None = None
    # The names the flow's name resolved through (CNAME, DNAME), as the
    # daemon judged them; logged with the flow.
    chain: tuple[str, ...] = ()
    # The destination is one of the host's own addresses (the daemon's
    # `local`): logged, so `ppp policy replay` re-decides it as internal.
    local: bool = False
    # HTTP rules cover the host (the daemon's `http_rules`, ADR 0050): a
    # connection whose requests ppp cannot see (raw TCP, UDP) is refused.
    http_rules: bool = False
    # Decided by the HTTP rules: the canonical path the daemon matched
    # (bounded; None when the path could not be canonicalised), which
    # flows.jsonl records in place of the guest's.
    http: bool = False
    http_path: str | None = None
    # False: the daemon says an allowed TLS connection is passed through
    # unread (an `inspect: false` rule, and no secret for the host; ADR
    # 0051). Only the daemon's reply sets it; every other Verdict inspects.
    inspect: bool = True
    # A metered LLM provider answers on the host (the daemon's `metered`,
    # issue 27): each request is asked `meter` (usage.py); others cost
    # nothing.
    metered: bool = False


def deny(reason: str, kind: str = "internal") -> Verdict:
    return Verdict(allow=False, reason=reason, kind=kind)


# A daemon that could not be asked: nothing to allow, the fix is on the host.
DAEMON_DOWN = Verdict(allow=False, reason="the ppp daemon did not answer, so ppp fails closed", kind="daemon")


# The one host this addon answers itself: provisioning fetches the CA from
# http://mitm.it/cert/pem through the tunnel, and verification fetches it
# over HTTPS to prove the CA is trusted. Nothing for it ever goes upstream
# (connection_strategy=lazy and a response set here), so it needs no egress
# policy, and it works with no DNS and no internet.
LOCAL_HOST = "mitm.it"


LOCAL = Verdict(allow=True, rule_id="builtin:mitm.it", reason="served by ppp")
# How a held request's wait ended, in words for the 403 and the log.
HELD_REASONS = {
    "allowed": "allowed by you",
    "denied": "denied by you",
    "timeout": "nobody answered the approval request in time",
    "full": "too many requests of this sandbox wait for approval",
    "policy": "decided by a policy change",
}
