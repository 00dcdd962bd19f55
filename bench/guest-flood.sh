#!/usr/bin/env bash
# What one guest's floods leave in the one host mitmdump (issue 22, points
# 3 and 4): two rounds of refused DNS names (20,000 on one socket, then
# 2,000 each from a socket of its own, as getaddrinfo sends them), and
# slowloris (200 connections whose request headers never end, held 40 s,
# for the cost of one held connection; then 2,000; then 2,000 from a guest
# that keeps them half open after the proxy closes them). Prints mitmdump's growth
# per round, no assertions beyond the tests' own wide bounds. Needs root.
#
# It runs tests/e2e_flood.rs (the real daemon and mitmdump in a host
# namespace, wireguard-go guests, tests/support/flood.py), one at a time.
#
# Usage: bench/guest-flood.sh
# Env: PPP_TEST_VENV / PPP_TEST_MITMDUMP (as for the tests).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_netns_prereqs
cd "$root"
for t in a_dns_flood_leaves_mitmdump_flat a_dns_flood_from_a_socket_per_name_leaves_mitmdump_flat \
  held_connections_cost_a_sandbox_at_most_32_mib; do
  cargo test --locked --test e2e_flood -- --exact "$t" --nocapture 2>&1 |
    grep -E '^(one socket|a socket per name|slowloris|one held connection)' || {
    echo "$t: failed (run it alone to see why)" >&2
    exit 1
  }
done
