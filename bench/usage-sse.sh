#!/usr/bin/env bash
# SSE latency with usage metering on and off (issue 27), side by side in one
# run: the same Anthropic Messages stream (one event every SSE_EVERY_MS from
# tests/support/agent_servers.py, the key injected and the stream scrubbed
# as for any LLM API) on the metered /v1/messages and on a path no provider
# names, interleaved for ROUNDS rounds; each event's latency from the
# upstream's write to the guest's read, p50 and p99, and what metering
# adds. The goal is docs/benchmarks.md's SSE goal (ppp adds p99 <= 5 ms):
# metering must not move it.
# Needs root (ip netns).
#
# It runs the ignored test `bench_usage_sse` of tests/e2e_usage.rs on the
# end-to-end rig (bench/agent-traffic.sh's machinery: real daemon and
# mitmdump with ppp's addon, a wireguard-go guest, agent_servers.py) and
# prints its `bench:` lines.
#
# Usage: bench/usage-sse.sh
# Env: ROUNDS (default 3), SSE_EVENTS (100), SSE_EVERY_MS (50),
# PPP_TEST_VENV / PPP_TEST_MITMDUMP (as for the tests).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_netns_prereqs
cd "$root"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# The whole output is kept: on a failure it says why.
if ! cargo test --locked --test e2e_usage -- --ignored --exact bench_usage_sse --nocapture >"$out" 2>&1; then
  cat "$out" >&2
  exit 1
fi
sed -n 's/^bench: //p' "$out"
