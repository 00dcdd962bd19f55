#!/usr/bin/env bash
# Print the absolute path of a Python >= PYTHON_MIN_VERSION (versions.env) that
# can build a venv, for the mitmproxy venv that tests and ppp use.
#
# Search order (first that really runs and is new enough wins):
#   1. $PPP_PYTHON, if set. An explicit choice that fails is an error, never a
#      silent fall-through to something else.
#   2. python3.13, python3.12 on PATH. pyenv shims are on PATH here but fail
#      unless their version is selected, which is why every candidate is run.
#   3. pyenv builds: $(pyenv root)/versions/3.13.*/bin/python3, then 3.12.*.
#   4. /opt/ppp-python (or $PPP_PYTHON_PREFIX), built if needed by
#      ../shared/tools/build-python.sh from Debian's source (about 10 min, root).
#
# Only the path goes to stdout; everything else goes to stderr.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=/dev/null # versions.env holds only KEY=value lines
. "$root/versions.env"

say() { printf 'find-python: %s\n' "$*" >&2; }

# Print sys.executable if $1 runs, is >= PYTHON_MIN_VERSION and has what
# `python -m venv` + pip need (venv, ensurepip, ssl); fail quietly otherwise.
probe() {
  "$1" - "$PYTHON_MIN_VERSION" 2>/dev/null <<'EOF'
import sys
want = tuple(int(p) for p in sys.argv[1].split("."))
if sys.version_info[:len(want)] < want:
    sys.exit(1)
import ensurepip, ssl, venv  # noqa: F401  (Debian splits ensurepip into pythonX.Y-venv)
print(sys.executable)
EOF
}

try() {
  local found
  if found=$(probe "$1") && [ -n "$found" ]; then
    say "using $found ($("$found" -c 'import sys; print(sys.version.split()[0])'))"
    printf '%s\n' "$found"
    exit 0
  fi
}

if [ -n "${PPP_PYTHON:-}" ]; then
  try "$PPP_PYTHON"
  say "error: PPP_PYTHON=\`$PPP_PYTHON\` is not a working Python >= $PYTHON_MIN_VERSION with venv, ensurepip and ssl"
  exit 1
fi

for name in python3.13 python3.12; do
  if path=$(command -v "$name"); then try "$path"; fi
done

if command -v pyenv >/dev/null 2>&1; then
  pyenv_root=$(pyenv root)
else
  pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
fi
for minor in 3.13 3.12; do
  # Newest patch release first. An unmatched glob stays literal and simply
  # fails the probe.
  while IFS= read -r py; do
    try "$py"
  done < <(printf '%s\n' "$pyenv_root/versions/$minor".*/bin/python3 | sort -rV)
done

prefix=${PPP_PYTHON_PREFIX:-/opt/ppp-python}
if [ -x "$prefix/bin/python3" ]; then try "$prefix/bin/python3"; fi

builder="$root/../shared/tools/build-python.sh"
if [ ! -f "$builder" ]; then
  say "error: no Python >= $PYTHON_MIN_VERSION found, and the fallback builder \`$builder\` is missing"
  say "hint: install python3.13 (or 3.12) with its venv module, or set PPP_PYTHON"
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  say "error: no Python >= $PYTHON_MIN_VERSION found; building one needs root (it installs build deps with apt)"
  say "hint: run \`sudo PREFIX=$prefix $builder\`, or set PPP_PYTHON"
  exit 1
fi
say "no Python >= $PYTHON_MIN_VERSION found; building CPython into $prefix (about 10 min)"
# The builder's own output (apt, configure, make) is progress, not our answer.
PREFIX="$prefix" bash "$builder" >&2
try "$prefix/bin/python3"
say "error: \`$builder\` finished but \`$prefix/bin/python3\` is not a working Python >= $PYTHON_MIN_VERSION"
exit 1
