#!/usr/bin/env bash
# Run every fuzz target for N seconds each (default 60).
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`). The toolchain here is stable
# only; RUSTC_BOOTSTRAP=1 lets it accept the `-Z sanitizer` flags cargo-fuzz
# passes. Findings land in fuzz/artifacts/<target>/; the growing corpus in
# fuzz/corpus/<target>/ (both git-ignored), seeded from fuzz/seeds/<target>/.
set -euo pipefail
secs=${1:-60}
cd "$(dirname "$0")/.."
export RUSTC_BOOTSTRAP=1
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz from crates.io" >&2
  cargo install cargo-fuzz --locked
fi
for target in resource_parse policy_yaml kit_yaml; do
  mkdir -p "fuzz/corpus/$target"
  echo "== $target for ${secs}s"
  cargo fuzz run -O "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
    -max_total_time="$secs" -dict="fuzz/dict/$target.dict" -print_final_stats=1
done
