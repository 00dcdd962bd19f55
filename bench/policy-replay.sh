#!/usr/bin/env bash
# `ppp policy replay` over a 1,000,000-line flows.jsonl with a 1,000-rule
# candidate policy (issue 28):
#   throughput on one core      goal >= 300,000 flows/s
#   memory flat while streaming peak RSS at 1M lines ~= at 100k lines
# Prints flows/s (best and median of RUNS, default 3) and peak RSS, pinned
# to one CPU with taskset. Needs no root, no network.
# Usage: bench/policy-replay.sh [path-to-ppp]   (default: builds target/release/ppp)
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_ppp "${1:-}"
runs=${RUNS:-3}
lines=${LINES:-1000000}
[ -x /usr/bin/time ] || { echo "error: /usr/bin/time is missing (apt-get install time)" >&2; exit 1; }
command -v taskset >/dev/null || { echo "error: taskset is missing (util-linux)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PPP_CONFIG=$work/config PPP_DATA=$work/data PPP_CACHE=$work/cache HOME=$work
mkdir -p "$PPP_CONFIG" "$PPP_DATA"

# The candidate: 1,000 rules of the criterion mix (60% exact hosts, 25%
# wildcards, 5% regexes, 10% networks; one in seven a deny), as a sandbox
# file. The log: what the addon writes, all kinds (55% http, 20% tls, 15%
# dns, 10% tcp), 70% to hosts the rules name, the rest misses; a third
# learned, the rest allowed or denied by a rule.
python3 - "$work/candidate.yaml" "$work/flows.jsonl" "$lines" <<'PY'
import json, random, sys, uuid
cand, log, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rnd = random.Random(28)
out, hosts = ["rules:"], []
for i in range(1000):
    k = i % 20
    if k < 12:
        res = f"host{i}.example{i % 97}.com"; hosts.append(res)
    elif k < 17:
        res = ("*." if i % 2 else "**.") + f"zone{i}.example.net"; hosts.append(f"a{i}.zone{i}.example.net")
    elif k < 18:
        res = f"^api{i}-[0-9]+\\.regex\\.io$"; hosts.append(f"api{i}-7.regex.io")
    else:
        res = f"10.{(i >> 8) & 255}.{i & 255}.0/24"
    dec = "deny" if i % 7 == 0 else "allow"
    out += [f"- id: {uuid.UUID(int=rnd.getrandbits(128))}", f"  decision: {dec}", "  type: network",
            f"  resource: '{res}'", "  created_at: 2026-11-29T10:00:00Z", "  source: local"]
open(cand, "w").write("\n".join(out) + "\n")
kinds = ["http"] * 11 + ["tls"] * 4 + ["dns"] * 3 + ["tcp"] * 2
with open(log, "w") as f:
    for i in range(n):
        kind = kinds[i % len(kinds)]
        host = rnd.choice(hosts) if rnd.random() < 0.7 else f"miss{rnd.randrange(100000)}.elsewhere.org"
        ip = f"93.184.{rnd.randrange(256)}.{rnd.randrange(1, 255)}"
        port = 53 if kind == "dns" else (443 if kind != "tcp" else 22)
        rule = "learned" if i % 3 == 0 else str(uuid.UUID(int=rnd.getrandbits(128)))
        rec = {"sandbox": "bench", "timestamp": f"2026-12-02T10:{(i // 60000) % 60:02d}:{(i // 1000) % 60:02d}.{i % 1000:03d}Z",
               "kind": kind, "host": host, "ip": "10.0.0.53" if kind == "dns" else ip, "port": port,
               "method": "GET" if kind == "http" else None, "path": "/v1/items" if kind == "http" else None,
               "status": 200 if kind == "http" else None, "decision": "deny" if i % 11 == 0 else "allow",
               "matched_rule": rule, "bytes_out": 512, "bytes_in": 4096, "duration_ms": 12}
        f.write(json.dumps(rec, separators=(",", ":")) + "\n")
PY
head -n $((lines / 10)) "$work/flows.jsonl" >"$work/flows-tenth.jsonl"
echo "log: $(wc -l <"$work/flows.jsonl") lines, $(du -m "$work/flows.jsonl" | cut -f1) MiB; candidate: 1000 rules" >&2

# One timed replay: prints "seconds max_rss_kib". Exit 3 ("something would
# be newly denied") is the expected answer for this log.
replay() {
  local log=$1 rc=0
  taskset -c 0 /usr/bin/time -f "%e %M" -o "$work/t" \
    "$ppp" policy replay --json --policy "$work/candidate.yaml" --log "$log" bench >"$work/out.json" || rc=$?
  [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] || { echo "error: replay exited $rc" >&2; cat "$work/t" >&2; exit 1; }
  tail -n 1 "$work/t"
}

replay "$work/flows.jsonl" >/dev/null # warm the page cache
python3 - "$work/out.json" <<'PY' >&2
import json, sys
s = json.load(open(sys.argv[1]))
print(f"replayed {s['flows']} flows: {s['newly_denied']} newly denied, {s['newly_allowed']} newly allowed, "
      f"{s['unchanged']} unchanged ({len(s['changes'])} changed destinations listed, {s['changes_left_off']} left off)")
PY
results=()
for _ in $(seq 1 "$runs"); do results+=("$(replay "$work/flows.jsonl")"); done
tenth=$(replay "$work/flows-tenth.jsonl")

python3 - "$lines" "$tenth" "${results[@]}" <<'PY'
import statistics, sys
n, tenth, runs = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
secs = sorted(float(r.split()[0]) for r in runs)
rss = max(int(r.split()[1]) for r in runs)
rate = lambda s: n / s if s > 0 else float("inf")
best, med = rate(secs[0]), rate(statistics.median(secs))
print(f"policy replay, {n} flows, 1000 rules, one core: best {best:,.0f} flows/s, median {med:,.0f} flows/s "
      f"(goal 300,000: ratio {med / 300000:.2f}, >= 1 meets it)")
print(f"peak RSS: {rss / 1024:.1f} MiB at {n} lines, {int(tenth.split()[1]) / 1024:.1f} MiB at {n // 10} lines")
PY
