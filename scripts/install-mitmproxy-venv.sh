#!/usr/bin/env bash
# Build (or keep) a venv holding the pinned mitmproxy, idempotently.
# usage: scripts/install-mitmproxy-venv.sh VENV_DIR
#
# The venv is kept when its mitmdump reports MITMPROXY_VERSION from
# versions.env; a wrong or broken one is replaced. PPP_PYTHON picks the
# interpreter, else scripts/find-python.sh searches for one >= 3.12.
# Prints one summary line on stdout; progress goes to stderr.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=/dev/null # versions.env holds only KEY=value lines
. "$root/versions.env"

say() { printf 'install-mitmproxy-venv: %s\n' "$*" >&2; }
die() { say "error: $1"; [ $# -lt 2 ] || say "hint: $2"; exit 1; }

[ $# -eq 1 ] || die "usage: $0 VENV_DIR"
venv=$1
want="Mitmproxy: $MITMPROXY_VERSION"

# The pinned version iff the venv's mitmdump runs and says so. Read all of its
# output: cutting it short (| head) makes mitmdump print a BrokenPipe trace.
venv_ok() {
  local out
  out=$("$venv/bin/mitmdump" --version 2>/dev/null) || return 1
  printf '%s\n' "$out" | grep -qxF "$want"
}

start=$SECONDS
if venv_ok; then
  echo "mitmproxy $MITMPROXY_VERSION already in $venv"
  exit 0
fi
if [ -e "$venv" ]; then
  # Refuse to delete a directory that is not a venv: the path may be
  # mistyped, and rm -rf of the wrong place is not recoverable.
  [ -f "$venv/pyvenv.cfg" ] || [ -z "$(ls -A "$venv")" ] ||
    die "\`$venv\` exists but is not a venv; not replacing it" "choose a new directory or a venv"
  say "replacing $venv: its mitmdump is missing, broken or not $MITMPROXY_VERSION"
  rm -rf "$venv"
fi
python=$("$root/scripts/find-python.sh")
say "creating $venv with $python"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "mitmproxy==$MITMPROXY_VERSION" >&2
venv_ok || die "$venv/bin/mitmdump does not report $MITMPROXY_VERSION after install"
echo "mitmproxy $MITMPROXY_VERSION installed in $venv ($((SECONDS - start)) s)"
