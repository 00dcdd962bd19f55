#!/usr/bin/env bash
# Run the whole Rust test suite and finish with one total line, so that the
# last thing CI prints is the real count rather than the doctest runner's
# "0 passed" (this crate has no doctests today).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
# --all-targets runs unit, integration and bench targets (criterion runs each
# benchmark once as a smoke test) but skips doctests, hence the second run.
cargo test --locked --all-targets --no-fail-fast 2>&1 | tee -a "$log" || status=$?
if [ "$status" -eq 0 ]; then
  cargo test --locked --doc 2>&1 | tee -a "$log" || status=$?
fi
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "total: %d passed, %d failed\n", p, f; if (p == 0) exit 1 }' "$log" || status=1
exit "$status"
