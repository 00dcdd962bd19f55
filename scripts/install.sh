#!/usr/bin/env bash
# `make install`: install the ppp binary, its man pages and its runtime, then
# show what ppp finds. The runtime is the pinned mitmproxy in ppp's own venv
# under its data directory (`$PPP_DATA/venv`), where ppp looks for mitmdump.
# What ppp needs on the host is in README.md, section "Requirements".
#
#   scripts/install.sh        everything: the binary, the man pages, the venv
#   scripts/install.sh man    only the man pages, from the ppp already installed
#                             (`make install-man`)
#
#   PREFIX     install ppp to $PREFIX/bin (default: cargo's, ~/.cargo/bin)
#   MANDIR     install the man pages to $MANDIR/man1 (default: share/man next to
#              that bin directory, ~/.cargo/share/man or $PREFIX/share/man:
#              man looks there for any bin directory on PATH, so `man ppp`
#              works with no MANPATH)
#   PPP_DATA   ppp's data directory (default: $XDG_DATA_HOME/ppp or ~/.local/share/ppp)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=/dev/null # versions.env holds only KEY=value lines
. "$root/versions.env"

step=${1:-all}
case $step in
  all | man) ;;
  *)
    echo "usage: scripts/install.sh [all|man]" >&2
    exit 2
    ;;
esac

bindir=${PREFIX:-${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}}/bin
bin=$bindir/ppp

if [ "$step" = all ]; then
  args=(install --path "$root" --locked --force)
  if [ -n "${PREFIX:-}" ]; then args+=(--root "$PREFIX"); fi
  cargo "${args[@]}"
fi

# Man pages come from the installed binary, so they match it exactly. man-db
# and BSD man search `<dir>/../share/man` for every <dir> on PATH, so pages
# next to the bin directory are found wherever ppp itself is found.
mandir=${MANDIR:-$(dirname "$bindir")/share/man}
pages=$(mktemp -d)
trap 'rm -rf "$pages"' EXIT
"$bin" __man "$pages" >/dev/null
mkdir -p "$mandir/man1"
install -m 0644 "$pages"/*.1 "$mandir/man1/"
echo "installed $(find "$pages" -name '*.1' | wc -l | tr -d ' ') man pages to $mandir/man1" >&2
case ":${PATH:-}:" in
  *":$bindir:"*) ;;
  *) echo "note: $bindir is not on PATH; add it, or \`ppp\` and \`man ppp\` will not find what was installed" >&2 ;;
esac
if [ "$step" = man ]; then exit 0; fi

data=${PPP_DATA:-${XDG_DATA_HOME:-$HOME/.local/share}/ppp}
"$root/scripts/install-mitmproxy-venv.sh" "$data/venv"

command -v podman >/dev/null 2>&1 ||
  echo "note: podman is not on PATH; sandboxes need Podman 5.5 or newer (tested with $PODMAN_TESTED_VERSION): see \"Requirements\" in $root/README.md" >&2

"$bin" version
