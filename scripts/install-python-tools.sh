#!/usr/bin/env bash
# Install the addon's pinned Python tooling (ruff, mypy, pytest from
# versions.env) into a venv that already holds the pinned mitmproxy,
# idempotently: mypy checks the addon against that mitmproxy's own type
# hints, and pytest runs the addon's tests with it.
# usage: scripts/install-python-tools.sh VENV_DIR
#
# Only for the test venv (scripts/install-test-deps.sh calls it): the venv
# ppp runs mitmdump from (`ppp install`, scripts/install-mitmproxy-venv.sh)
# never gets these. Prints one summary line on stdout; progress on stderr.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=/dev/null # versions.env holds only KEY=value lines
. "$root/versions.env"

say() { printf 'install-python-tools: %s\n' "$*" >&2; }
die() { say "error: $1"; [ $# -lt 2 ] || say "hint: $2"; exit 1; }

[ $# -eq 1 ] || die "usage: $0 VENV_DIR"
venv=$1
python=$venv/bin/python
[ -x "$python" ] || die "\`$python\` is missing" "build the venv first: scripts/install-mitmproxy-venv.sh $venv"
want=("ruff==$RUFF_VERSION" "mypy==$MYPY_VERSION" "pytest==$PYTEST_VERSION")

# The pinned versions iff pip's metadata says so for all three.
tools_ok() {
  "$python" - "${want[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import PackageNotFoundError, version

for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        sys.exit(1)
    if have != want:
        sys.exit(1)
PY
}

start=$SECONDS
if tools_ok; then
  echo "ruff $RUFF_VERSION, mypy $MYPY_VERSION, pytest $PYTEST_VERSION already in $venv"
  exit 0
fi
say "installing ${want[*]} into $venv"
"$python" -m pip install -q --disable-pip-version-check "${want[@]}" >&2
tools_ok || die "$venv does not report ${want[*]} after install"
echo "ruff $RUFF_VERSION, mypy $MYPY_VERSION, pytest $PYTEST_VERSION installed in $venv ($((SECONDS - start)) s)"
