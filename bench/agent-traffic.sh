#!/usr/bin/env bash
# The traffic agents make (issue 12), through ppp against bare mitmdump
# (no addon, same WireGuard mode, same topology, stream_large_bodies=1),
# side by side in one run, medians of ROUNDS interleaved rounds:
#   - SSE: one event every 50 ms for 5 s from the LLM API stand-in; the
#     latency from the upstream's write to the guest's read, p50/p99 added
#     by ppp over bare mitmdump (goal p99 <= 5 ms), and ppp's first event
#     (goal <= 20 ms);
#   - a 1 GiB HTTPS download: ppp / bare MB/s (goal >= 0.90) and mitmdump's
#     RSS growth (goal <= 64 MiB), beside the MB/s with no proxy at all
#     (routed by the host namespace) and through wireguard-go alone;
#   - a 64 MiB upload to the LLM API with the key injected: it passes (the
#     upstream checks every byte and the key), MB/s, RSS growth.
# Needs root (ip netns).
#
# It runs the ignored test `bench_agent_traffic` of tests/e2e_daemon.rs on
# the end-to-end rig (real daemon and mitmdump with ppp's addon, wireguard-go
# guests, tests/support/agent_servers.py upstream) and prints its `bench:`
# lines. The requests/s goal of the issue is bench/addon-overhead.sh's.
#
# MODE=no-inspect instead runs `bench_no_inspect_download` of
# tests/e2e_no_inspect.rs (issue 30, point 2): the 1 GiB download through a
# `--no-inspect` host, through interception and through bare mitmdump, side
# by side, with the MB/s ratios (goal: passed through >= 1.5x intercepted)
# and mitmdump's peak RSS growth.
#
# Usage: bench/agent-traffic.sh; MODE=no-inspect bench/agent-traffic.sh
# Env: MODE (all | no-inspect), ROUNDS (default 3), BYTES (download, default 1073741824),
# UPLOAD_BYTES (default 67108864), SSE_EVENTS (100), SSE_EVERY_MS (50),
# PIN (1: both mitmdumps on the last CPU, the rest on the others; 0: off),
# PPP_TEST_VENV / PPP_TEST_MITMDUMP (as for the tests).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_netns_prereqs
command -v taskset >/dev/null || { echo "error: taskset is missing; run make test-deps" >&2; exit 1; }
cd "$root"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# The whole output is kept: on a failure it says why.
case "${MODE:-all}" in
  all) target=e2e_daemon test=bench_agent_traffic ;;
  no-inspect) target=e2e_no_inspect test=bench_no_inspect_download ;;
  *) echo "error: MODE is \`all\` or \`no-inspect\`, not \`$MODE\`" >&2; exit 2 ;;
esac
if ! cargo test --locked --test "$target" -- --ignored --exact "$test" --nocapture >"$out" 2>&1; then
  cat "$out" >&2
  exit 1
fi
sed -n 's/^bench: //p' "$out"
