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

# Write `$1/podman`: the fake podman behind a wrapper that appends each
# call's start and end (ns) to `$1/podman-times`, so a script can tell
# ppp's own time apart from podman's.
bench_timed_podman() {
  local dir=$1
  cat >"$dir/podman" <<WRAP
#!/usr/bin/env bash
t0=\$(date +%s%N)
"$root/tests/fake-podman/podman" "\$@"
rc=\$?
echo "\$t0 \$(date +%s%N)" >>"$dir/podman-times"
exit \$rc
WRAP
  chmod +x "$dir/podman"
}
