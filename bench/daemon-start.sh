#!/usr/bin/env bash
# Daemon start-up against bare mitmdump, both with 80 WireGuard servers
# (every port of the pool claimed), inside a network namespace with no
# route out. Goal (issue 3): ppp's time to ready <= 1.2x bare mitmdump's
# time to print all 80 client configs. Prints medians of RUNS starts and
# the ratio. Needs root (ip netns).
# Usage: bench/daemon-start.sh [path-to-ppp]   (default: builds target/release/ppp)
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
runs=${RUNS:-5}
bench_ppp "${1:-}"
bench_netns_prereqs

ns=ppp-bds$$
work=$(mktemp -d)
cleanup() {
  PPP_DATA=$work/data PPP_CONFIG=$work/config "$ppp" daemon stop >/dev/null 2>&1 || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up

export PPP_DATA=$work/data PPP_CONFIG=$work/config PPP_CACHE=$work/cache PPP_MITMDUMP=$mitm
mkdir -p "$PPP_DATA" "$work/bare/c"
python3 - "$PPP_DATA/port-registry.json" <<'PY'
import json, sys
json.dump({"ports": {str(51820 + i): f"sb-{i:02d}" for i in range(80)}}, open(sys.argv[1], "w"))
PY

now() { date +%s.%N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

bare_once() {
  local log=$work/bare/out.log args=() t0 pid
  for p in $(seq 51820 51899); do args+=(--mode "wireguard:$work/bare/keys-$p.conf@$p"); done
  t0=$(now)
  PYTHONUNBUFFERED=1 ip netns exec "$ns" "$mitm" "${args[@]}" --set confdir="$work/bare/c" --set connection_strategy=lazy >"$log" 2>&1 &
  pid=$!
  until [ "$(grep -c '^Endpoint = ' "$log" 2>/dev/null || true)" -ge 80 ]; do
    kill -0 "$pid" 2>/dev/null || { echo "bare mitmdump died:" >&2; tail "$log" >&2; exit 1; }
    sleep 0.02
  done
  echo "$(now) - $t0" | bc
  kill "$pid"; wait "$pid" 2>/dev/null || true
}

ppp_once() {
  local t0
  t0=$(now)
  ip netns exec "$ns" "$ppp" daemon start -d >/dev/null
  echo "$(now) - $t0" | bc
  "$ppp" daemon stop >/dev/null
}

# One unmeasured start of each generates the 80 key pairs, as a first
# install would; the measured starts reuse them, as every later start does.
bare_once >/dev/null
ppp_once >/dev/null
bare=$(for _ in $(seq "$runs"); do bare_once; done | median)
daemon=$(for _ in $(seq "$runs"); do ppp_once; done | median)
printf 'bare mitmdump, 80 servers, all configs printed   median %6.2f s\n' "$bare"
printf 'ppp daemon start -d, 80 ports, ready            median %6.2f s\n' "$daemon"
printf 'ratio %.2f (goal <= 1.20)\n' "$(echo "$daemon / $bare" | bc -l)"
