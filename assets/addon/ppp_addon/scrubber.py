"""The scrubber: secret values echoed back in a response are replaced.

Decides which bytes of a response body and headers are replaced: every
occurrence of a value injected into the request, also across chunk
boundaries, by a redaction of the same length (so a Content-Length stays
true). Bounds what it holds: one chunk plus the longest end that may start
a secret, and a table cache cleared when full. Must never trust the
upstream: whatever it echoes, however split, no secret reaches the guest.
"""

from typing import Any, ClassVar

# What replaces a secret value that an upstream echoes back in a response.
REDACTED = b"[redacted by ppp]"


def redaction(value: bytes) -> bytes:
    """REDACTED cut or padded with `*` to exactly `value`'s length: the
    body keeps its length, so a Content-Length the upstream sent stays true
    (an HTTP/2 client resets a stream whose DATA disagrees with it)."""
    return (REDACTED + b"*" * len(value))[: len(value)]


class Scrubber:
    """A `flow.response.stream` function that replaces every secret value in
    a streamed body with its `redaction`, also across chunk boundaries: it
    holds back the longest end of each chunk that is the start of a secret
    (shorter than it) until the next chunk (or the end, `b""`) shows whether
    the secret follows. Only such an end is held: a chunk that ends
    otherwise (an SSE event ends in a blank line) goes on whole and at once,
    so streamed events and gRPC messages are never delayed. Memory: one
    chunk plus that tail."""

    # What a Scrubber needs of its secrets, by the values as given: every
    # response of a flow with an injected key gets a Scrubber, nearly always
    # for the same few values. Bounded: cleared when full.
    _tables: ClassVar[dict[tuple[bytes, ...], tuple[Any, ...]]] = {}
    _TABLES_MAX = 256

    def __init__(self, values: list[bytes]) -> None:
        given = tuple(values)
        t = Scrubber._tables.get(given)
        if t is None:
            ordered = sorted({v for v in values if v}, key=len, reverse=True)
            t = (
                ordered,
                max((len(v) for v in ordered), default=1) - 1,
                # Knuth-Morris-Pratt failure function of each secret, so
                # that `_held` costs O(len(secret)) per chunk whatever the
                # bytes.
                [self._failure(v) for v in ordered],
                # The bytes a held end can finish with: a proper prefix of a
                # secret ends with one of them.
                frozenset(b for v in ordered for b in v[:-1]),
            )
            if len(Scrubber._tables) >= Scrubber._TABLES_MAX:
                Scrubber._tables.clear()
            Scrubber._tables[given] = t
        self.values, self.keep, self._fail, self._ends = t
        self.tail = b""

    @staticmethod
    def _failure(v: bytes) -> list[int]:
        f = [0] * len(v)
        k = 0
        for i in range(1, len(v)):
            while k and v[i] != v[k]:
                k = f[k - 1]
            if v[i] == v[k]:
                k += 1
            f[i] = k
        return f

    def _held(self, data: bytes) -> int:
        """The length of the longest end of `data` that is a proper prefix
        of a secret: only that can still become one."""
        if not data or data[-1] not in self._ends:
            return 0  # the usual case: no secret's start ends the chunk
        best = 0
        for v, f in zip(self.values, self._fail, strict=True):
            q = 0
            for b in data[-(len(v) - 1) :] if len(v) > 1 else b"":
                while q and (q == len(v) or b != v[q]):
                    q = f[q - 1]
                if b == v[q]:
                    q += 1
            best = max(best, q if q < len(v) else f[q - 1])
        return best

    def scrub(self, data: bytes) -> bytes:
        for v in self.values:
            if v in data:
                data = data.replace(v, redaction(v))
        return data

    def __call__(self, chunk: bytes) -> bytes | list[bytes]:
        data = self.scrub(self.tail + chunk)
        if chunk == b"" or self.keep == 0:
            self.tail = b""
            return data
        # Hold back a tail that could be the start of a secret; a redaction
        # never contains a secret, so nothing is replaced twice.
        cut = len(data) - self._held(data)
        self.tail = data[cut:]
        # Never b"" mid-stream: mitmproxy would send it as an empty chunk,
        # which ends a chunked body.
        return data[:cut] or []
