#!/usr/bin/env bash
# Addon overhead: requests/s and p50/p99 latency of many small keep-alive
# HTTPS requests from a WireGuard guest, through (a) bare mitmdump with no
# addon and (b) ppp's daemon and addon, which make a policy decision and
# inject a secret on every request. Goal (issue 3): (b)/(a) >= 0.90 for
# requests/s, and a/b >= 0.90 for p50 and p99. Needs root (ip netns).
# A third side, (c), is bare mitmdump with only the addon's cache of
# mitmproxy's hook lookup loaded: that cache makes mitmproxy itself cheaper
# per request, so (b)/(c) shows what the rest of the addon costs.
#
# Everything runs in namespaces made here: a "host" one (mitmdump and the
# ppp daemon; no default route, no link to the root namespace), a guest one
# (wireguard-go on wg0, the load generator) and an upstream one (the HTTPS
# echo server of tests/support/upstream.py, with a throwaway CA).
#
# Against the noise of a shared VM: (a) and (b) both run for the whole
# benchmark (bare mitmdump on port 51821, ppp's on 51820, (c) on 51822; an
# idle one costs nothing measurable), and the guest switches between them for
# ROUNDS interleaved rounds (a b c, c b a, a b c, ...). Each round gives one ratio per
# metric; the medians of those are the result. With PIN=1 (the default on 2
# or more CPUs) both mitmdumps run on the last CPU and everything else (load
# generator, wireguard-go, upstream, the ppp daemon, this script) on the
# others, the same for (a) and (b). mitmdump's CPU time per request (all its
# threads, from /proc) is printed too: it is the least noisy figure.
#
# Usage: bench/addon-overhead.sh [path-to-ppp]   (default: builds target/release/ppp)
# Env: DURATION (seconds measured per side and round, default 10),
# CONCURRENCY (keep-alive connections, default 4), WARMUP (seconds, default
# 2), ROUNDS (default 3), PIN (1 or 0); PYSPY (path to py-spy: profiles
# each measured mitmdump into PROFILE_DIR, collapsed stacks).
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
duration=${DURATION:-10}
concurrency=${CONCURRENCY:-4}
warmup=${WARMUP:-2}
rounds=${ROUNDS:-3}
ncpu=$(nproc)
pin=${PIN:-$([ "$ncpu" -ge 2 ] && echo 1 || echo 0)}
bench_ppp "${1:-}"
bench_netns_prereqs
[ -x "$ppp" ] || { echo "error: $ppp is not an executable" >&2; exit 1; }
for tool in ip nsenter wireguard-go wg curl python3 openssl taskset; do
  command -v "$tool" >/dev/null || { echo "error: $tool is missing; run make test-deps" >&2; exit 1; }
done
[ -e /dev/net/tun ] || { echo "error: /dev/net/tun is missing; wireguard-go needs it" >&2; exit 1; }

name=api.anthropic.com      # ppp's built-in table maps it to the anthropic service
up_ip=198.18.0.10           # routed only inside the host namespace
key=sk-ant-bench-0123456789
port=51820                  # ppp's server (the port registry names it)
bare_port=51821             # bare mitmdump's
cached_port=51822           # bare mitmdump with the dispatch cache's
p=pao$$
h=$p-h g=$p-g u=$p-u
work=$(mktemp -d)
pids=()
export PPP_DATA=$work/data PPP_CONFIG=$work/config PPP_CACHE=$work/cache
export PPP_SECRET_BACKEND=file PPP_MITMDUMP=$mitm

cleanup() {
  "$ppp" daemon stop >/dev/null 2>&1 || true
  local ns pid
  # Our own processes, then anything left in our namespaces (all ours).
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for ns in "$h" "$g" "$u"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
  done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for ns in "$h" "$g" "$u"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$work" "/etc/netns/$h"
}
trap cleanup EXIT

die() { echo "error: $*" >&2; exit 1; }

# Pinning: this script and all it starts on the first CPUs, mitmdump alone
# on the last one (moved there with every thread once it runs).
mitm_cpu=$((ncpu - 1))
rest_cpus=0-$((ncpu > 1 ? ncpu - 2 : 0))
if [ "$pin" = 1 ]; then
  taskset -p -c "$rest_cpus" $$ >/dev/null
fi
pin_mitm() { # pid
  [ "$pin" = 1 ] || return 0
  local t
  for t in /proc/"$1"/task/*; do taskset -p -c "$mitm_cpu" "${t##*/}" >/dev/null; done
}
cpu_ticks() { # pid: user+system clock ticks of all its threads
  awk '{print $14 + $15}' "/proc/$1/stat"
}
wait_for() { # what, seconds, command...
  local what=$1 end=$(($(date +%s) + $2)); shift 2
  until "$@"; do
    [ "$(date +%s)" -lt "$end" ] || die "timed out waiting for $what"
    sleep 0.05
  done
}

# Topology (as tests/support/netns.rs): host 10.251.0.1 <-> upstream
# 10.251.0.2 (+ $up_ip), host 10.251.1.1 (WireGuard endpoint) <-> guest 10.251.1.2.
for ns in "$h" "$g" "$u"; do
  ip netns add "$ns"
  ip -n "$ns" link set lo up
done
ip netns exec "$h" sysctl -qw net.ipv4.ip_forward=0
ip -n "$h" link add "${p}hu" type veth peer name veth0 netns "$u"
ip -n "$h" addr add 10.251.0.1/30 dev "${p}hu"
ip -n "$h" link set "${p}hu" up
ip -n "$u" addr add 10.251.0.2/30 dev veth0
ip -n "$u" addr add "$up_ip/32" dev veth0
ip -n "$u" link set veth0 up
ip -n "$u" route add 10.251.0.0/16 via 10.251.0.1 quickack 1
ip -n "$h" route add 198.18.0.0/24 via 10.251.0.2 dev "${p}hu" quickack 1
ip -n "$h" link add "${p}hg" type veth peer name veth0 netns "$g"
ip -n "$h" addr add 10.251.1.1/30 dev "${p}hg"
ip -n "$h" link set "${p}hg" up
ip -n "$g" addr add 10.251.1.2/30 dev veth0
ip -n "$g" link set veth0 up

# The host namespace resolves with the upstream's test DNS server only
# (`ip netns exec` bind-mounts these over /etc): ppp refuses a connection to
# an address the name does not resolve to.
mkdir -p "/etc/netns/$h"
echo "nameserver $up_ip" >"/etc/netns/$h/resolv.conf"
echo "127.0.0.1 localhost" >"/etc/netns/$h/hosts"

# Upstream: a throwaway CA, a certificate for $name, the echo server.
up=$work/upstream
mkdir -p "$up"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$up/ca.key" \
  -out "$up/ca.pem" -days 2 -subj "/CN=ppp bench CA" -addext basicConstraints=critical,CA:TRUE \
  -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$up/srv.key" \
  -out "$up/srv.csr" -subj "/CN=$name" 2>/dev/null
printf '%s\n' basicConstraints=critical,CA:FALSE keyUsage=critical,digitalSignature \
  extendedKeyUsage=serverAuth subjectKeyIdentifier=hash authorityKeyIdentifier=keyid \
  "subjectAltName=DNS:$name,IP:$up_ip" >"$up/srv.ext"
openssl x509 -req -in "$up/srv.csr" -CA "$up/ca.pem" -CAkey "$up/ca.key" -CAcreateserial \
  -out "$up/srv.pem" -days 2 -extfile "$up/srv.ext" 2>/dev/null
echo "{\"$name\": \"$up_ip\"}" >"$up/zone.json"
PYTHONUNBUFFERED=1 ip netns exec "$u" python3 "$root/tests/support/upstream.py" "$up_ip" "$up/srv.pem" \
  "$up/srv.key" "$up/requests.jsonl" "$up/ready" "$up/zone.json" "$up/dns.jsonl" 2>"$up/err.log" &
pids+=($!)
wait_for "the upstream echo server" 20 test -e "$up/ready"

# Guest: wireguard-go with a private /run/wireguard (its control socket).
mkdir -p /run/wireguard
ip netns exec "$g" sh -c "mount -t tmpfs $p-wg /run/wireguard && exec wireguard-go -f wg0" >"$work/wg.log" 2>&1 &
wgpid=$!
pids+=("$wgpid")
wgc() { nsenter -t "$wgpid" -m -n wg "$@"; }
wait_for "wireguard-go to create wg0" 20 wgc show wg0 >/dev/null 2>&1
ip -n "$g" link set wg0 mtu 1420 up
ip -n "$g" route replace 10.251.1.1/32 dev veth0
# quickack: without it keep-alive requests stall ~40 ms (docs/harness.md);
# the two routes between host and upstream above carry it for the same reason.
ip -n "$g" route replace default dev wg0 quickack 1

handshake() { [ "$(wgc show wg0 latest-handshakes | awk '{print $2}')" != 0 ]; }
nudge_until_handshake() {

  for _ in $(seq 100); do
    handshake && return 0
    ip netns exec "$g" bash -c "echo x >/dev/udp/$up_ip/9" 2>/dev/null || true
    sleep 0.2
  done
  die "guest got no WireGuard handshake in 20 s"
}

guest_up() { # private-key server-public-key address server-port
  printf '[Interface]\nPrivateKey = %s\n\n[Peer]\nPublicKey = %s\nAllowedIPs = 0.0.0.0/0\nEndpoint = 10.251.1.1:%s\n' \
    "$1" "$2" "$4" >"$work/wg0.setconf"
  wgc setconf wg0 "$work/wg0.setconf"
  ip -n "$g" addr flush dev wg0
  ip -n "$g" addr add "${3:-10.0.0.1/32}" dev wg0
  ip -n "$g" route replace default dev wg0 quickack 1
  nudge_until_handshake
}

guest_curl() { # mitmproxy-ca, curl args...
  local ca=$1; shift
  ip netns exec "$g" curl -sS -m 10 --cacert "$ca" --resolve "$name:443:$up_ip" \
    -H 'x-api-key: ppp-proxy-managed' "$@" "https://$name/v1/bench"
}

cat >"$work/load.py" <<'PY'
"""Keep-alive HTTPS load: N threads, one connection each, small GETs."""
import http.client, json, socket, ssl, sys, threading, time

name, ip, ca, conc, warm, dur = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6])
ctx = ssl.create_default_context(cafile=ca)


class Conn(http.client.HTTPSConnection):
    """Connects to `ip`, while SNI, verification and Host use `name`."""

    def connect(self):
        s = socket.create_connection((ip, 443), self.timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = ctx.wrap_socket(s, server_hostname=name)


t0 = time.perf_counter()
start, end = t0 + warm, t0 + warm + dur
lat, errors, lock = [], [0], threading.Lock()


def worker():
    conn, mine, errs = None, [], 0
    while True:
        a = time.perf_counter()
        if a >= end:
            break
        try:
            if conn is None:
                conn = Conn(name, 443, timeout=10)
            conn.request("GET", "/v1/bench", headers={"x-api-key": "ppp-proxy-managed"})
            r = conn.getresponse()
            r.read()
            ok = r.status == 200
        except (OSError, http.client.HTTPException):
            ok = False
            conn = None
        b = time.perf_counter()
        if a >= start and b <= end:
            if ok:
                mine.append(b - a)
            else:
                errs += 1
    with lock:
        lat.extend(mine)
        errors[0] += errs


threads = [threading.Thread(target=worker) for _ in range(conc)]
for t in threads:
    t.start()
for t in threads:
    t.join()
lat.sort()
q = lambda f: round(lat[min(len(lat) - 1, int(f * len(lat)))] * 1000, 2) if lat else None
print(json.dumps({"requests": len(lat), "rps": round(len(lat) / dur, 1), "p50_ms": q(0.50), "p99_ms": q(0.99), "errors": errors[0]}))
PY

load() { # mitmproxy-ca
  local out
  out=$(ip netns exec "$g" python3 "$work/load.py" "$name" "$up_ip" "$1" "$concurrency" "$warmup" "$duration")
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); sys.exit(r["errors"] > 0 or r["requests"] == 0)' "$out" ||
    die "load generator reported errors: $out"
  echo "$out"
}
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# (a) Bare mitmdump, no addon; (c) the same plus only ppp's cache of
# mitmproxy's hook lookup (`_cache_hook_dispatch` in
# assets/addon/ppp_addon/patches.py, taken from this checkout). ppp's addon installs that cache, which makes
# mitmproxy's own dispatch cheaper than bare's: (b)/(a) is what a user gets,
# (b)/(c) is what the rest of the addon costs.
cat >"$work/dispatch-cache.py" <<PY
"""bench/addon-overhead.sh side (c): bare mitmdump with ppp's hook-dispatch cache."""
import sys
from mitmproxy import ctx
sys.path.insert(0, "$root/assets/addon")
from ppp_addon import patches  # noqa: E402


def load(loader):
    patches._cache_hook_dispatch(ctx.master.addons)
PY
conf() { sed -n "s/^$2 = //p" "$1" | head -n1; }
start_bare() { # side port [mitmdump args...]: start it, set bare_pid
  local side=$1 port=$2; shift 2
  mkdir -p "$work/$side/c"
  PYTHONUNBUFFERED=1 ip netns exec "$h" "$mitm" --mode "wireguard:$work/$side/keys.conf@$port" \
    --set confdir="$work/$side/c" --set connection_strategy=lazy \
    --set ssl_verify_upstream_trusted_ca="$up/ca.pem" "$@" >"$work/$side/out.log" 2>&1 &
  bare_pid=$!
  pids+=("$bare_pid")
  wait_for "mitmdump ($side)'s client config" 20 grep -q '^Endpoint = ' "$work/$side/out.log"
  # `ip netns exec` execs mitmdump, so $bare_pid is its pid.
  pin_mitm "$bare_pid"
}
start_bare a "$bare_port"
bare=$bare_pid
bare_keys=("$(conf "$work/a/out.log" PrivateKey)" "$(conf "$work/a/out.log" PublicKey)" "$(conf "$work/a/out.log" Address)" "$bare_port")
bare_ca=$work/a/c/mitmproxy-ca-cert.pem
start_bare c "$cached_port" -s "$work/dispatch-cache.py"
cached=$bare_pid
cached_keys=("$(conf "$work/c/out.log" PrivateKey)" "$(conf "$work/c/out.log" PublicKey)" "$(conf "$work/c/out.log" Address)" "$cached_port")
cached_ca=$work/c/c/mitmproxy-ca-cert.pem

# (b) ppp's daemon and addon: deny-all plus one allow, a stored key.
mkdir -p "$PPP_DATA" "$PPP_CONFIG"
# The guest reaches the host namespace at its veth's address, not through
# gvproxy's NAT to loopback (where ppp's servers listen by default).
printf 'wireguard:\n  listen_host: 0.0.0.0\n' >"$PPP_CONFIG/config.yaml"
echo "{\"ports\": {\"$port\": \"bench\"}}" >"$PPP_DATA/port-registry.json"
"$ppp" policy init deny-all >/dev/null
# $up_ip is not public: the DNS-rebinding defence needs an address rule.
"$ppp" policy allow network --sandbox bench "$name,$up_ip" >/dev/null
"$ppp" secret set -g anthropic -t "$key" >/dev/null
PPP_UPSTREAM_CA=$up/ca.pem ip netns exec "$h" "$ppp" daemon start -d >/dev/null
read -r pk spk addr < <(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))[sys.argv[2]]
print(c["private_key"], c["public_key"], c["address"])' "$PPP_DATA/wg/client-confs.json" "$port")
ppp_keys=("$pk" "$spk" "$addr" "$port")
ppp_ca=$PPP_DATA/mitmproxy/mitmproxy-ca-cert.pem
ppp_mitm=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["mitmdump_pid"])' "$PPP_DATA/daemon.json")
[ -e "/proc/$ppp_mitm" ] || die "ppp's mitmdump ($ppp_mitm) is not running"
pin_mitm "$ppp_mitm"

guest_up "${bare_keys[@]}"
guest_curl "$bare_ca" -o /dev/null || die "bare mitmdump: request failed"
guest_up "${cached_keys[@]}"
guest_curl "$cached_ca" -o /dev/null || die "bare mitmdump with the dispatch cache: request failed"
grep -q "Loading script $work/dispatch-cache.py" "$work/c/out.log" || die "mitmdump (c) did not load the dispatch cache"
guest_up "${ppp_keys[@]}"
resp=$(guest_curl "$ppp_ca") || die "ppp: request failed"
# ppp scrubs the key out of the echo it sends back: the upstream's own log
# shows what arrived.
grep -q "\"x-api-key\": \"$key\"" "$up/requests.jsonl" || die "ppp did not inject the key; upstream answered: $resp"

measure() { # a|b|c: switch the guest over, load, print the result with mitmdump's CPU ms per request
  local side=$1 pid ca out t0 t1
  case $side in
  a)
    guest_up "${bare_keys[@]}"
    pid=$bare ca=$bare_ca
    ;;
  b)
    guest_up "${ppp_keys[@]}"
    pid=$ppp_mitm ca=$ppp_ca
    ;;
  c)
    guest_up "${cached_keys[@]}"
    pid=$cached ca=$cached_ca
    ;;
  esac
  t0=$(cpu_ticks "$pid")
  if [ -n "${PYSPY:-}" ]; then # profile each side's mitmdump: raw collapsed stacks
    # shellcheck disable=SC2086 # PYSPY_ARGS is a list of flags, split on purpose
    "$PYSPY" record ${PYSPY_ARGS---nonblocking} --format raw -r 200 -d $((warmup + duration)) -p "$pid" \
      -o "${PROFILE_DIR:-.}/profile-$side-$$-$RANDOM.txt" >/dev/null 2>&1 &
  fi
  out=$(load "$ca")
  t1=$(cpu_ticks "$pid")
  wait
  python3 -c 'import json,os,sys; r=json.loads(sys.argv[1]); tick=os.sysconf("SC_CLK_TCK")
w=float(sys.argv[4]) + float(sys.argv[5])  # the CPU time covers warm-up and measurement
n=r["requests"] * w / float(sys.argv[5])   # requests in that time, estimated
r["cpu_ms"]=round((int(sys.argv[3]) - int(sys.argv[2])) * 1000 / tick / n, 3) if n else None
print(json.dumps(r))' "$out" "$t0" "$t1" "$warmup" "$duration"
}

results=()
for i in $(seq "$rounds"); do
  if [ $((i % 2)) = 1 ]; then order="a b c"; else order="c b a"; fi
  for side in $order; do
    r=$(measure "$side")
    case $side in a) ra=$r ;; b) rb=$r ;; c) rc=$r ;; esac
  done
  results+=("$ra" "$rb" "$rc")
done

python3 - "$concurrency" "$duration" "$warmup" "$pin" "${results[@]}" <<'PY'
import json, statistics, sys
conc, dur, warm, pin = sys.argv[1:5]
rows = [json.loads(x) for x in sys.argv[5:]]
rounds = list(zip(rows[0::3], rows[1::3], rows[2::3]))
print(f"{conc} keep-alive HTTPS connections, {dur} s measured after {warm} s warm-up, "
      f"{len(rounds)} interleaved rounds, pinned: {'yes' if pin == '1' else 'no'}")
print("(a) bare mitmdump, (b) ppp's daemon and addon, (c) bare mitmdump with only ppp's hook-dispatch cache")
fmt = "{:<38} {:>9} {:>9} {:>9} {:>13}"
print(fmt.format("", "req/s", "p50 ms", "p99 ms", "mitm CPU ms/req"))


def ratio(b, a):
    """b against a: req/s b/a, latency a/b (higher is better for b), CPU b/a."""
    cpu = f"{b['cpu_ms'] / a['cpu_ms']:.2f}" if a["cpu_ms"] and b["cpu_ms"] else "-"
    return (b["rps"] / a["rps"], a["p50_ms"] / b["p50_ms"], a["p99_ms"] / b["p99_ms"]), cpu


vs_a, vs_c = [], []
for i, (a, b, c) in enumerate(rounds, 1):
    for tag, r in (("(a) bare mitmdump", a), ("(b) ppp daemon + addon", b), ("(c) bare + dispatch cache", c)):
        print(fmt.format(f"round {i} {tag}", r["rps"], r["p50_ms"], r["p99_ms"], r["cpu_ms"]))
    for tag, other, acc in (("b/a", a, vs_a), ("b/c", c, vs_c)):
        x, cpu = ratio(b, other)
        acc.append(x)
        print(fmt.format(f"round {i} ratio {tag}", *(f"{v:.2f}" for v in x), f"CPU {cpu}"))
cpu = {k: statistics.median(r[k]["cpu_ms"] for r in ({"a": a, "b": b, "c": c} for a, b, c in rounds)) for k in "abc"}
for tag, acc in (("b/a", vs_a), ("b/c", vs_c)):
    med = [statistics.median(r[k] for r in acc) for k in range(3)]
    print(fmt.format(f"median ratio {tag} (req/s; lat inverted)", *(f"{x:.2f}" for x in med),
                     f"{cpu['a' if tag == 'b/a' else 'c']:.2f} -> {cpu['b']:.2f}"))
    if tag == "b/a":
        goal = all(x >= 0.90 for x in med)
print("goal, ppp against bare mitmdump (>= 0.90 for all three b/a medians):", "met" if goal else "NOT met")
PY
