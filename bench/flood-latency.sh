#!/usr/bin/env bash
# Flood isolation (issue 11, point 4): the latency of one sandbox's small
# HTTP requests while another sandbox floods the proxy (a chunked download
# at full speed plus a stream of refused DNS names), against the same
# requests with the proxy idle. Goal: flooded/idle <= 2 at p50 and p90.
# Needs root (ip netns).
#
# It runs the ignored test `bench_other_sandbox_latency_under_a_flood` of
# tests/e2e_daemon.rs, which uses the end-to-end rig: the real daemon and
# mitmdump in a host namespace, two wireguard-go guests, the upstream of
# tests/support/upstream.py. Rounds alternate idle and flooded; the median
# of the per-round ratios is printed.
#
# Usage: bench/flood-latency.sh
# Env: REQUESTS (per side and round, default 60), ROUNDS (default 3),
# FLOOD (which floods: download, dns or both, the default "download,dns"),
# PPP_TEST_VENV / PPP_TEST_MITMDUMP (as for the tests).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_netns_prereqs
cd "$root"
cargo test --locked --test e2e_daemon -- --ignored --exact bench_other_sandbox_latency_under_a_flood --nocapture \
  2>&1 | grep -E '^(round|median)'
