"""What host and address a guest's request names, in canonical form.

Decides which one name a request is judged on: the TLS SNI, the Host header
and the request target must all agree (`request_name`), or the request is
refused as a mismatch, since the upstream may route by any of them. Bounds
the parsed-address memo (LRU). Must never trust any one of those names
alone, nor a textual address: `parse_ip` unwraps IPv4-mapped IPv6, drops
zones and brackets, and answers None rather than guess.
"""

import ipaddress

from mitmproxy import http

from .common import Lru


def canonical_host(host: str | None) -> str | None:
    if not host:
        return None
    host = host.strip().rstrip(".").lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or None


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


# parse_ip's answers by input text, with the address's text form: every
# request parses the same few strings (its destination, its Host), and
# `ipaddress` costs several microseconds a call, more when it fails.
_IP_MEMO_MAX = 4096
_IP_MEMO: Lru[str, tuple[ipaddress.IPv4Address | ipaddress.IPv6Address | None, str | None]] = Lru(_IP_MEMO_MAX)


def _ip_entry(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address | None, str | None]:
    hit = _IP_MEMO.get(text)
    if hit is None:
        ip = _parse_ip(text)
        hit = (ip, str(ip) if ip is not None else None)
        _IP_MEMO[text] = hit  # bounded (LRU): a guest can send any Host
    return hit


def parse_ip(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address `text` names (brackets and zone dropped, IPv4-mapped IPv6
    unwrapped), or None."""
    if not text:
        return None
    return _ip_entry(text)[0]


def ip_text(text: str | None) -> str | None:
    """`str(parse_ip(text))`, or None when it is not an address."""
    if not text:
        return None
    return _ip_entry(text)[1]


def _authority_host(text: str) -> str | None:
    """The host of `host[:port]` or `[v6][:port]`, canonical."""
    text = text.strip()
    if text.startswith("["):
        end = text.find("]")
        return canonical_host(text[1:end]) if end > 0 else None
    if text.count(":") == 1:
        text = text.split(":", 1)[0]
    return canonical_host(text)


def request_name(flow: http.HTTPFlow) -> tuple[str | None, str | None]:
    """The one host a request names, or why its names disagree.

    A request can name its host three times: the TLS SNI, the `Host`
    header, and the target (HTTP/1 absolute-form, or HTTP/2 and HTTP/3
    `:authority`). The upstream may route by any of them (RFC 9112 servers
    route by an absolute-form target, TLS terminators by SNI), so a request
    is decided on its name only when they all agree: returns (name, None),
    or (None, reason) when they do not. (None, None): no name at all.
    """
    req = flow.request
    if not (req.path.startswith("/") or (req.path == "*" and req.method == "OPTIONS")):
        # An absolute URI in HTTP/2's :path (or anything but origin-form)
        # would reach an HTTP/1 upstream as an absolute-form target.
        return None, "the request target is not a path"
    hosts = [v for k, v in req.headers.fields if k.lower() == b"host"]
    if len(hosts) > 1:
        return None, "the request has more than one Host header"
    names: list[tuple[str, str | None]] = []
    if hosts:
        names.append(("Host header", _authority_host(hosts[0].decode("utf-8", "surrogateescape"))))
    if req.authority:
        where = "request target" if req.http_version.startswith("HTTP/1") else ":authority"
        names.append((where, _authority_host(req.authority)))
    client = flow.client_conn
    if client.tls_established:
        sni = canonical_host(client.sni)
        if sni is None:
            if any(n is not None and ip_text(n) is None for _, n in names):
                return None, "a TLS connection without SNI names a host only in the request"
        else:
            names.append(("TLS SNI", sni))
    distinct = {n for _, n in names}
    if None in distinct and len(names) > 0:
        return None, "the request names an empty host"
    if len(distinct) > 1:
        said = ", ".join(f"{n} in the {where}" for where, n in names)
        return None, f"the request names different hosts: {said}"
    return (names[0][1] if names else None), None


# ppp's resolver inside the tunnel; DNS to any other server is refused.
TUNNEL_DNS = ("10.0.0.53", 53)
