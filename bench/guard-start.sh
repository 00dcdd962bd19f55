#!/usr/bin/env bash
# What the workspace guard (issue 26, ADR 0036) costs when an agent
# starts: `ppp run` of an existing sandbox with the guard on, against the
# same with the guard off (`workspace.unprotected`), interleaved in one
# run on the fake podman. With the guard on ppp plans the read-only binds
# (the git dirs it finds, the extra protected paths), snapshots the paths
# it can only report, binds them read-only over the workspace, and
# compares the snapshot when the agent exits; the fake's containers make
# the binds as real read-only bind mounts. The agent is a stub that exits
# at once, so the figures are ppp's start and end of a session, not an
# agent's work. Runs in a network namespace with no route out. Needs root
# (ip netns) and `make test-deps`.
# Usage: bench/guard-start.sh [path-to-ppp]   (default: builds target/release/ppp)
# RUNS (default 7) pairs; FILES (default 2000) files in the workspace.
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
runs=${RUNS:-7}
files=${FILES:-2000}
bench_ppp "${1:-}"
bench_netns_prereqs

ns=ppp-bgs$$
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

# Every podman call goes through this wrapper, which logs its wall time,
# so ppp's own part (planning the binds, the snapshot and its comparison)
# shows apart from the container's start (where the binds are mounted).
bench_timed_podman "$work"

# The stub agent: starts and exits 0.
mkdir -p "$work/images/localhost_agent_latest/bin" "$work/home" "$work/config"
printf '#!/bin/sh\nexit 0\n' >"$work/images/localhost_agent_latest/bin/opencode"
chmod +x "$work/images/localhost_agent_latest/bin/opencode"
printf 'workspace:\n  unprotected: [open]\n' >"$work/config/config.yaml"

# A workspace like a project's: a git repository with history, git's
# sample hooks, an editor directory, and $files files to commit.
ws=$work/ws
mkdir -p "$ws/src" "$ws/.vscode"
for i in $(seq 1 "$files"); do echo "line $i" >"$ws/src/f$i.txt"; done
echo '{}' >"$ws/.vscode/settings.json"
export HOME=$work/home GIT_CONFIG_NOSYSTEM=1
git -C "$ws" init -q
git -C "$ws" add -A
git -C "$ws" -c user.name=b -c user.email=b@b commit -qm bench
chmod -R a+rwX "$ws"

export PPP_DATA=$work/data PPP_CONFIG=$work/config PPP_CACHE=$work/cache PPP_MITMDUMP=$mitm
export PPP_SECRET_BACKEND=file PPP_PODMAN=$work/podman PPP_OPENCODE_IMAGE=localhost/agent:latest
export FAKE_PODMAN_ROOT=$work/fake FAKE_PODMAN_IMAGES=$work/images FAKE_PODMAN_PROVIDER=qemu
export PATH=$root/tests/fake-podman/host-bin:$PATH

now() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
ms() { awk -v n="$1" 'BEGIN {printf "%.0f", n / 1e6}'; }

"$ppp" policy init deny-all >/dev/null
ip netns exec "$ns" "$ppp" daemon start -d >/dev/null
for name in guarded open; do
  ip netns exec "$ns" "$ppp" create -q --name "$name" --cpus 1 -m 2g opencode "$ws" >/dev/null
done
protection=$(ip netns exec "$ns" "$ppp" ls --json | python3 -c '
import json, sys
print(" ".join("%s=%s" % (s["name"], s["protection"]) for s in json.load(sys.stdin)))')

# One untimed start each (page cache, the fake's first container), then
# the pairs, alternating which goes first so drift falls on both.
run() { ip netns exec "$ns" "$ppp" run -q --name "$1" opencode "$ws" -- bench </dev/null >/dev/null; }
run guarded
run open
: >"$work/on"; : >"$work/off"; : >"$work/on-own"; : >"$work/off-own"
for i in $(seq 1 "$runs"); do
  if [ $((i % 2)) -eq 1 ]; then order="guarded open"; else order="open guarded"; fi
  for name in $order; do
    : >"$work/podman-times"
    t0=$(now)
    run "$name"
    t=$(( $(now) - t0 ))
    inpodman=$(awk '{s += $2 - $1} END {printf "%.0f", s}' "$work/podman-times")
    if [ "$name" = guarded ]; then side=on; else side=off; fi
    echo "$t" >>"$work/$side"
    echo $(( t - inpodman )) >>"$work/$side-own"
  done
done

on=$(median <"$work/on"); off=$(median <"$work/off")
on_own=$(median <"$work/on-own"); off_own=$(median <"$work/off-own")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
printf 'ppp run of an existing sandbox with the fake podman, stub agent, median of %d pairs\n' "$runs"
printf '  (%s; workspace: git repository, %d files)\n' "$protection" "$files"
printf '                         wall time   ppp alone (wall minus podman calls)\n'
printf '  guard on               %6s ms   %6s ms\n' "$(ms "$on")" "$(ms "$on_own")"
printf '  guard off              %6s ms   %6s ms\n' "$(ms "$off")" "$(ms "$off_own")"
printf '  on - off               %6s ms   %6s ms\n' "$(ms $(( on - off )))" "$(ms $(( on_own - off_own )))"
printf '  on / off               %6s      %6s\n' "$(ratio "$on" "$off")" "$(ratio "$on_own" "$off_own")"
