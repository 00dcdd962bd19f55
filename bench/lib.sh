# shellcheck shell=bash
# Sourced by the bench scripts: the set-up they share.

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Set `ppp`: the path given ($1), else a fresh release build.
bench_ppp() {
  ppp=${1:-}
  if [ -z "$ppp" ]; then
    cargo build --release --locked --quiet --manifest-path "$root/Cargo.toml"
    ppp=$root/target/release/ppp
  fi
}

# Set `mitm` to the test venv's pinned mitmdump, and require root (the
# benchmarks that run it do so in network namespaces).
bench_netns_prereqs() {
  mitm=${PPP_TEST_MITMDUMP:-$root/target/test-venv/bin/mitmdump}
  [ "$(id -u)" -eq 0 ] || { echo "error: needs root for ip netns" >&2; exit 1; }
  [ -x "$mitm" ] || { echo "error: $mitm is missing; run make test-deps" >&2; exit 1; }
}
