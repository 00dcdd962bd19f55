"""The usage meter's parsers (assets/addon/ppp_addon/usage.py), without a
daemon: SSE split at every chunk boundary, CRLF and CR line ends, an
over-long event skipped and the record marked estimated, the field paths
read and merged, compressed bodies decoded as they pass, and the estimate
for a response that reports nothing. The e2e test (tests/e2e_usage.rs)
runs the same module through the real tunnel, daemon and mitmdump.

Run by tests/addon.rs (under pytest).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
import types
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "usage"


def load_usage() -> types.ModuleType:
    """ppp_addon.usage, loaded through the entry file as mitmdump does."""
    if "ppp_addon" not in sys.modules:
        spec = importlib.util.spec_from_file_location("ppp_addon_entry", ROOT / "assets" / "addon" / "addon.py")
        assert spec and spec.loader
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
    from ppp_addon import usage

    return usage


U = load_usage()

ANTHROPIC = {
    "provider": "anthropic",
    "usage": {
        "model": ["message.model", "model"],
        "input": ["message.usage.input_tokens", "usage.input_tokens"],
        "output": ["usage.output_tokens", "message.usage.output_tokens"],
        "cache_read": ["message.usage.cache_read_input_tokens", "usage.cache_read_input_tokens"],
        "cache_write": ["message.usage.cache_creation_input_tokens", "usage.cache_creation_input_tokens"],
    },
    "input_includes_cache_read": False,
}
GEMINI = {
    "provider": "gemini",
    "usage": {
        "model": ["modelVersion"],
        "input": ["usageMetadata.promptTokenCount"],
        "output": ["usageMetadata.candidatesTokenCount+usageMetadata.thoughtsTokenCount"],
        "cache_read": ["usageMetadata.cachedContentTokenCount"],
    },
    "input_includes_cache_read": True,
}


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def run(spec: dict[str, object], body: bytes, sse: bool, chunks: list[int], encoding: str = "") -> dict[str, object]:
    m = U.Meter(spec, sse, encoding)
    i = 0
    for n in chunks:
        m.feed(body[i : i + n])
        i += n
    m.feed(body[i:])
    return m.finish(400, False)


class UsageTest(unittest.TestCase):
    def test_events_split_at_any_chunk_boundary_and_line_end(self) -> None:
        text = b': comment\nevent: a\ndata: {"x": 1}\n\ndata: two\ndata: lines\n\ndata:nospace\n\n'
        want = [b'{"x": 1}', b"two\nlines", b"nospace"]
        for end in (b"\n", b"\r\n", b"\r"):
            body = text.replace(b"\n", end)
            for cut in range(len(body) + 1):
                s = U.SseSplitter()
                got = s.feed(body[:cut]) + s.feed(body[cut:]) + s.end()
                self.assertEqual(got, want, (end, cut))
            # And one byte at a time.
            s = U.SseSplitter()
            got = [e for b in range(len(body)) for e in s.feed(body[b : b + 1])] + s.end()
            self.assertEqual(got, want, end)

    def test_an_over_long_event_is_skipped_and_marked(self) -> None:
        s = U.SseSplitter(max_event=64)
        big = b"data: " + b"x" * 200 + b"\n\n"
        got = s.feed(b"data: 1\n\n" + big[:50]) + s.feed(big[50:]) + s.feed(b"data: 2\n\n")
        self.assertEqual(got, [b"1", b"2"])
        self.assertTrue(s.overflowed)
        # Many short data lines add up too.
        s = U.SseSplitter(max_event=64)
        self.assertEqual(s.feed(b"data: aaaaaaaaaa\n" * 10 + b"\ndata: 3\n\n"), [b"3"])
        self.assertTrue(s.overflowed)
        # The meter says estimated, and keeps the usage it did read.
        m = U.Meter(ANTHROPIC, True, "")
        m.sse = U.SseSplitter(max_event=512)
        m.feed(fixture("anthropic.sse"))
        m.feed(b"data: " + b"y" * 1000 + b"\n\n")
        r = m.finish(10, False)
        self.assertTrue(r["estimated"])
        self.assertEqual(r["input"], 25)

    def test_anthropic_stream_merges_start_and_delta(self) -> None:
        body = fixture("anthropic.sse")
        for chunks in ([], [1] * 300, [7, 13, 200]):
            r = run(ANTHROPIC, body, True, chunks)
            self.assertEqual(
                r,
                {
                    "input": 25,
                    "output": 15,
                    "cache_read": 100,
                    "cache_write": 10,
                    "model": "claude-sonnet-4-5-20250929",
                    "estimated": False,
                },
            )

    def test_gemini_sums_thoughts_and_subtracts_the_cache(self) -> None:
        r = run(GEMINI, fixture("gemini.json"), False, [5])
        self.assertEqual((r["input"], r["output"], r["cache_read"], r["model"]), (8, 45, 4, "gemini-2.5-flash"))
        self.assertFalse(r["estimated"])

    def test_gzip_is_decoded_as_it_passes(self) -> None:
        body = gzip.compress(fixture("anthropic.json"))
        r = run(ANTHROPIC, body, False, [3, 3, 10], "gzip")
        self.assertEqual((r["input"], r["output"], r["estimated"]), (12, 30, False))
        # br and zstd too (mitmproxy's own dependencies), in small pieces.
        import brotli  # type: ignore[import-untyped]
        import zstandard

        for enc, packed in (
            ("br", brotli.compress(fixture("anthropic.sse"))),
            ("zstd", zstandard.ZstdCompressor().compress(fixture("anthropic.sse"))),
            ("gzip", gzip.compress(fixture("anthropic.sse"))),
        ):
            r = run(ANTHROPIC, packed, True, [1] * 40, enc)
            self.assertEqual((r["input"], r["output"], r["estimated"]), (25, 15, False), enc)
        # An encoding ppp cannot read is estimated, never zero.
        r = run(ANTHROPIC, b"\x00" * 400, False, [], "compress")
        self.assertTrue(r["estimated"])
        self.assertEqual((r["input"], r["output"]), (100, 0))

    def test_no_usage_is_estimated_from_the_bytes(self) -> None:
        body = fixture("openai-chat-nousage.sse")
        m = U.Meter({"provider": "openai", "usage": {"input": ["usage.prompt_tokens"]}}, True, "")
        m.feed(body)
        r = m.finish(401, False)
        self.assertTrue(r["estimated"])
        self.assertEqual(r["input"], 101)
        self.assertEqual(r["output"], -(-len(body) // 4))
        self.assertGreater(r["output"], 0)

    def test_a_refused_request_adds_no_input_however_large(self) -> None:
        # The attack: a guest posts a huge body the provider refuses (no
        # key, too large): only the error body seen is counted, never the
        # request's bytes.
        body = fixture("anthropic-error.json")
        m = U.Meter(ANTHROPIC, False, "")
        m.feed(body)
        r = m.finish(64 * 1024 * 1024, False, accepted=False)
        self.assertTrue(r["estimated"])
        self.assertEqual(r["input"], 0)
        self.assertEqual(r["output"], -(-len(body) // 4))

    def test_a_cut_stream_is_estimated_and_keeps_what_it_read(self) -> None:
        body = fixture("anthropic.sse")
        m = U.Meter(ANTHROPIC, True, "")
        m.feed(body[: len(body) // 2])
        r = m.finish(40, True)
        self.assertTrue(r["estimated"])
        self.assertEqual(r["input"], 25, "the input message_start reported")
        self.assertGreaterEqual(r["output"], (len(body) // 2) // 4)

    def test_field_paths(self) -> None:
        obj = json.loads('{"a": {"b": 3, "t": true, "n": -1, "s": "x"}, "c": 4}')
        self.assertEqual(U.read_count(obj, ["a.b"]), 3)
        self.assertEqual(U.read_count(obj, ["a.zz", "c"]), 4)
        self.assertEqual(U.read_count(obj, ["a.b+c+a.zz"]), 7)
        self.assertIsNone(U.read_count(obj, ["a.t", "a.n", "a.s", "a.b.c"]), "bools, negatives, text, no path")

    def test_a_request_past_a_budget_gets_the_daemons_refusal_and_no_meter(self) -> None:
        from mitmproxy.test import tflow

        flow = tflow.tflow()
        flow.metadata["ppp"] = {"sandbox": "red", "host": "api.anthropic.com", "decision": "allow", "meter": ANTHROPIC}
        body = json.dumps({"type": "error", "error": {"type": "rate_limit_error", "message": "ppp: used up"}})
        over = {
            "status": 429,
            "headers": [["content-type", "application/json"], ["retry-after", "60"]],
            "body": body,
            "message": "ppp: used up",
            "ask": False,
        }
        U.Usage._over_budget(flow, over)
        assert flow.response is not None
        self.assertEqual(flow.response.status_code, 429)
        self.assertEqual(flow.response.content, body.encode())
        self.assertEqual(flow.response.headers["retry-after"], "60")
        meta = flow.metadata["ppp"]
        self.assertEqual((meta["decision"], meta["aborted"]), ("deny", "budget: ppp: used up"))
        self.assertNotIn("meter", meta, "a refused request reports no usage")

    def test_a_daemon_that_cannot_meter_refuses_the_request(self) -> None:
        # Fail closed: a request to a provider's host whose budgets could
        # not be checked does not go on unchecked and uncounted.
        from mitmproxy.test import tflow

        class Down:
            def ask(self, req: dict[str, object]) -> dict[str, object]:
                raise U.DaemonError("daemon restarting")

        class Refuses:
            def ask(self, req: dict[str, object]) -> dict[str, object]:
                return {"ok": False, "reason": "internal"}

        for daemon in (Down(), Refuses()):
            u = U.Usage()
            u.daemon = daemon  # type: ignore[assignment]
            flow = tflow.tflow()
            meta = {"sandbox": "red", "host": "api.anthropic.com", "metered_host": True, "secret_ok": True}
            flow.metadata["ppp"] = meta
            over = u._meter_request(flow, "POST", "/v1/messages")
            assert over is not None
            self.assertEqual((over["status"], over["ask"]), (503, False))
            U.Usage._over_budget(flow, over)
            assert flow.response is not None
            self.assertEqual(flow.response.status_code, 503)
            self.assertIn("budget", meta["aborted"])


if __name__ == "__main__":
    unittest.main()
