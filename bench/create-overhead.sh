#!/usr/bin/env bash
# ppp's own overhead in `ppp create`, with the fake podman from tests/:
# everything a real VM would do (boot, provisioning inside the guest, the
# handover checks) happens inside podman calls, so ppp's overhead is the
# command's wall time minus the time spent in podman calls. Goal (issue 4):
# <= 1 s from the command's start to verified handover. The daemon is
# already running (the usual case); the first create's daemon start is
# reported separately. Runs in a network namespace with no route out.
# Needs root (ip netns) and `make test-deps`.
# Usage: bench/create-overhead.sh [path-to-ppp]   (default: builds target/release/ppp)
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
runs=${RUNS:-5}
bench_ppp "${1:-}"
bench_netns_prereqs

ns=ppp-bco$$
work=$(mktemp -d)
cleanup() {
  ip netns exec "$ns" "$ppp" rm --all -f >/dev/null 2>&1 || true
  ip netns exec "$ns" "$ppp" daemon stop >/dev/null 2>&1 || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up

# Every podman call goes through this wrapper, which logs its wall time.
bench_timed_podman "$work"
mkdir -p "$work/ws" "$work/images/localhost_agent_latest/bin"
export PPP_DATA=$work/data PPP_CONFIG=$work/config PPP_CACHE=$work/cache PPP_MITMDUMP=$mitm
export PPP_SECRET_BACKEND=file PPP_PODMAN=$work/podman PPP_OPENCODE_IMAGE=localhost/agent:latest
export FAKE_PODMAN_ROOT=$work/fake FAKE_PODMAN_IMAGES=$work/images FAKE_PODMAN_PROVIDER=qemu
export PATH=$root/tests/fake-podman/host-bin:$PATH

now() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ms() { awk -v n="$1" 'BEGIN {printf "%.0f", n / 1e6}'; }

"$ppp" policy init deny-all >/dev/null
t0=$(now)
ip netns exec "$ns" "$ppp" daemon start -d >/dev/null
daemon_ms=$(ms $(( $(now) - t0 )))

: >"$work/totals"; : >"$work/podmans"; : >"$work/overheads"
for i in $(seq 1 "$runs"); do
  : >"$work/podman-times"
  t0=$(now)
  ip netns exec "$ns" "$ppp" create -q --name "bench$i" --cpus 1 -m 2g opencode "$work/ws" >/dev/null
  total=$(( $(now) - t0 ))
  inpodman=$(awk '{s += $2 - $1} END {printf "%.0f", s}' "$work/podman-times")
  echo "$total" >>"$work/totals"
  echo "$inpodman" >>"$work/podmans"
  echo $(( total - inpodman )) >>"$work/overheads"
  ip netns exec "$ns" "$ppp" rm -f "bench$i" >/dev/null
done

total=$(median <"$work/totals"); inpodman=$(median <"$work/podmans"); over=$(median <"$work/overheads")
printf 'ppp create with the fake podman, median of %d (daemon already running)\n' "$runs"
printf '  wall time                  %6s ms\n' "$(ms "$total")"
printf '  in podman calls            %6s ms  (VM start, provisioning, handover checks)\n' "$(ms "$inpodman")"
printf '  ppp overhead               %6s ms\n' "$(ms "$over")"
printf '  overhead / goal (1000 ms)  %6s\n' "$(awk -v o="$over" 'BEGIN {printf "%.2f", o / 1e9}')"
printf '  goal (<= 1 s): %s\n' "$(awk -v o="$over" 'BEGIN {print (o <= 1e9) ? "met" : "NOT met"}')"
printf 'first daemon start (not in the figures above): %s ms\n' "$daemon_ms"
