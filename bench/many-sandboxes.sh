#!/usr/bin/env bash
# Many sandboxes at once (issue 25), with the fake podman from tests/: each
# sandbox's machine in its own podman home, all behind the one daemon and
# mitmdump. Reports:
#   - start time of each additional sandbox (`ppp create` wall time, the
#     daemon already running) and the growth of the daemon's and mitmdump's
#     memory (RSS) per sandbox. The fake's machines are namespaces: a real
#     VM adds its `-m` (lazily touched) and a qemu/gvproxy pair on top, which
#     this does not measure;
#   - the one mitmdump's request rate with 1, 4 and 8 sandboxes sending at
#     once (keep-alive HTTP through each one's tunnel to an upstream in the
#     host namespace), as ratios to the rate with one.
# Runs in a network namespace with no route out. Needs root (ip netns) and
# `make test-deps`; 8 sandboxes of 1.5 GiB must fit the host's memory (ppp
# refuses more).
# Usage: bench/many-sandboxes.sh [path-to-ppp]   (default: builds target/release/ppp)
# Env: DURATION (seconds of load per step, default 10), COUNTS (default "1 4 8").
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
duration=${DURATION:-10}
counts=${COUNTS:-"1 4 8"}
max=$(for c in $counts; do echo "$c"; done | sort -n | tail -1)
bench_ppp "${1:-}"
bench_netns_prereqs

ns=ppp-bms$$
work=$(mktemp -d)
cleanup() {
  ip netns exec "$ns" "$ppp" rm --all -f >/dev/null 2>&1 || true
  ip netns exec "$ns" "$ppp" daemon stop >/dev/null 2>&1 || true
  [ -n "${up_pid:-}" ] && kill "$up_pid" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
# The upstream: an address routed only inside the namespace.
up_ip=198.18.0.10
ip -n "$ns" addr add "$up_ip/32" dev lo
cat >"$work/upstream.py" <<'PY'
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], 80), H).serve_forever()
PY
ip netns exec "$ns" python3 "$work/upstream.py" "$up_ip" &
up_pid=$!

mkdir -p "$work/ws" "$work/images/localhost_agent_latest/bin" "$work/home"
chmod 777 "$work/ws"
export HOME=$work/home
export PPP_DATA=$work/data PPP_CONFIG=$work/config PPP_CACHE=$work/cache PPP_MITMDUMP=$mitm
export PPP_SECRET_BACKEND=file PPP_PODMAN=$root/tests/fake-podman/podman PPP_OPENCODE_IMAGE=localhost/agent:latest
export FAKE_PODMAN_ROOT=$work/fake FAKE_PODMAN_IMAGES=$work/images FAKE_PODMAN_PROVIDER=qemu
export PATH=$root/tests/fake-podman/host-bin:$PATH

now() { date +%s%N; }
ms() { awk -v n="$1" 'BEGIN {printf "%.0f", n / 1e6}'; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

"$ppp" policy init deny-all >/dev/null
"$ppp" policy allow network "$up_ip" >/dev/null
ip netns exec "$ns" "$ppp" daemon start -d >/dev/null
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]] or 0)" "$PPP_DATA/daemon.json" "$1"; }
daemon_pid=$(field pid)
mitm_pid() { field mitmdump_pid; }

printf 'sandbox  create (ms)  daemon RSS (MiB)  mitmdump RSS (MiB)\n'
d0=$(rss_kib "$daemon_pid"); m0=$(rss_kib "$(mitm_pid)")
printf '%-8s %11s  %16s  %18s\n' "none" "-" "$(( d0 / 1024 ))" "$(( m0 / 1024 ))"
: >"$work/creates"
for i in $(seq 1 "$max"); do
  t0=$(now)
  ip netns exec "$ns" "$ppp" create -q --name "s$i" --cpus 1 -m 1536m opencode "$work/ws" >/dev/null
  t=$(( $(now) - t0 ))
  echo "$t" >>"$work/creates"
  printf '%-8s %11s  %16s  %18s\n' "s$i" "$(ms "$t")" "$(( $(rss_kib "$daemon_pid") / 1024 ))" \
    "$(( $(rss_kib "$(mitm_pid)") / 1024 ))"
done
d1=$(rss_kib "$daemon_pid"); m1=$(rss_kib "$(mitm_pid)")
printf 'per additional sandbox: daemon +%s KiB, mitmdump +%s KiB (RSS, mean over %d)\n' \
  "$(( (d1 - d0) / max ))" "$(( (m1 - m0) / max ))" "$max"
first=$(head -1 "$work/creates"); last=$(tail -1 "$work/creates")
printf 'create: first %s ms (fetches the machine image), last %s ms, ratio last/first %s\n' \
  "$(ms "$first")" "$(ms "$last")" "$(awk -v a="$last" -v b="$first" 'BEGIN {printf "%.2f", a / b}')"

# The load: keep-alive GETs for DURATION seconds; prints the count.
load="import socket, time
s = socket.create_connection(('$up_ip', 80), timeout=30)
end = time.monotonic() + $duration
n = 0
while time.monotonic() < end:
    s.sendall(b'GET / HTTP/1.1\\r\\nHost: $up_ip\\r\\n\\r\\n')
    buf = b''
    while not buf.endswith(b'ok\\n'):
        buf += s.recv(4096)
    n += 1
print(n)"
printf '\nactive  requests/s  per sandbox  ratio to one\n'
base=""
for c in $counts; do
  pids=()
  for i in $(seq 1 "$c"); do
    ip netns exec "$ns" "$ppp" exec "s$i" -- python3 -c "$load" >"$work/load-$i" &
    pids+=("$!")
  done
  for p in "${pids[@]}"; do wait "$p"; done
  total=0
  for i in $(seq 1 "$c"); do total=$(( total + $(cat "$work/load-$i") )); done
  rps=$(awk -v n="$total" -v d="$duration" 'BEGIN {printf "%.0f", n / d}')
  [ -n "$base" ] || base=$rps
  printf '%-7s %10s  %11s  %12s\n' "$c" "$rps" "$(awk -v r="$rps" -v c="$c" 'BEGIN {printf "%.0f", r / c}')" \
    "$(awk -v r="$rps" -v b="$base" 'BEGIN {printf "%.2f", r / b}')"
done
