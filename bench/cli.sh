#!/usr/bin/env bash
# Whole-command timings against the goals of issue 2, with hyperfine:
#   ppp policy check with a 10,000-rule policies.yaml   goal <= 50 ms
#   ppp ls with 80 sandboxes                            goal <= 30 ms
# Prints the mean of each and its ratio to the goal (< 1.00 meets it).
# Usage: bench/cli.sh [path-to-ppp]   (default: builds target/release/ppp)
set -euo pipefail
# shellcheck source=bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_ppp "${1:-}"
command -v hyperfine >/dev/null || { echo "hyperfine is missing: run scripts/install-test-deps.sh" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PPP_CONFIG=$work/config PPP_DATA=$work/data PPP_CACHE=$work/cache HOME=$work
# No podman: `ls` measures ppp itself, not a VM manager.
export PATH=/usr/bin:/bin
mkdir -p "$PPP_CONFIG" "$PPP_DATA/sandboxes"

# 10,000 rules: 60% exact hosts, 25% wildcards, 5% regexes, 10% CIDRs, the
# same mix as the criterion benchmark.
python3 - "$PPP_CONFIG/policies.yaml" <<'PY'
import sys, uuid
out = ["default: deny", "rules:"]
for i in range(10000):
    k = i % 20
    if k < 12:   res = f"host{i}.example{i % 97}.com"
    elif k < 17: res = ("*." if i % 2 else "**.") + f"zone{i}.example.net"
    elif k < 18: res = f"^api{i}-[0-9]+\\.regex\\.io$"
    else:        res = f"10.{(i >> 8) & 255}.{i & 255}.0/24"
    dec = "deny" if i % 7 == 0 else "allow"
    out += [f"- id: {uuid.uuid4()}", f"  decision: {dec}", "  type: network",
            f"  resource: '{res}'", "  created_at: 2026-11-29T10:00:00Z", "  source: local"]
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PY

for i in $(seq 1 80); do
  n=$(printf 'sb-%02d' "$i"); port=$((51819 + i)); mkdir -p "$PPP_DATA/sandboxes/$n"
  cat > "$PPP_DATA/sandboxes/$n/sandbox.json" <<JSON
{"name":"$n","agent":"opencode","workspace":["/src/$n"],"status":"stopped","created_at":"2026-11-29T10:00:00Z","cpus":2,"memory":4096,"port":$port,"inner_ip":"10.0.0.$i","kit_refs":[],"template_tag":null,"machine_name":"ppp-$n"}
JSON
done

# Sanity: both commands work on this data before they are timed.
"$ppp" policy check network host5.example5.com --json >/dev/null
[ "$("$ppp" ls -q | wc -l)" -eq 80 ]

hyperfine --warmup 3 --runs 30 --export-json "$work/h.json" --style basic \
  "$ppp policy check network api77-123.regex.io --json" \
  "$ppp ls" >&2

python3 - "$work/h.json" <<'PY'
import json, sys
goals = [50.0, 30.0]
for r, goal in zip(json.load(open(sys.argv[1]))["results"], goals):
    mean = r["mean"] * 1000
    print(f"{r['command'].split('/')[-1]:<60} mean {mean:7.2f} ms  goal {goal:4.0f} ms  ratio {mean/goal:.2f}")
PY
