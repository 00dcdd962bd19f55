#!/usr/bin/env bash
# `make install`: install the ppp binary and its runtime, then show what ppp
# finds. The runtime is the pinned mitmproxy in ppp's own venv under its data
# directory (`$PPP_DATA/venv`), where ppp looks for mitmdump.
#
#   PREFIX     install ppp to $PREFIX/bin (default: cargo's, ~/.cargo/bin)
#   MANDIR     install the man pages to $MANDIR/man1 (default: $PREFIX/share/man,
#              or ~/.local/share/man without PREFIX, which man finds by itself)
#   PPP_DATA   ppp's data directory (default: $XDG_DATA_HOME/ppp or ~/.local/share/ppp)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=/dev/null # versions.env holds only KEY=value lines
. "$root/versions.env"

args=(install --path "$root" --locked --force)
if [ -n "${PREFIX:-}" ]; then args+=(--root "$PREFIX"); fi
cargo "${args[@]}"
bin=${PREFIX:-${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}}/bin/ppp

# Man pages come from the installed binary, so they match it exactly.
if [ -n "${PREFIX:-}" ]; then default_mandir=$PREFIX/share/man; else default_mandir=$HOME/.local/share/man; fi
mandir=${MANDIR:-$default_mandir}
pages=$(mktemp -d)
trap 'rm -rf "$pages"' EXIT
"$bin" __man "$pages" >/dev/null
mkdir -p "$mandir/man1"
install -m 0644 "$pages"/*.1 "$mandir/man1/"
echo "installed $(find "$pages" -name '*.1' | wc -l | tr -d ' ') man pages to $mandir/man1" >&2

data=${PPP_DATA:-${XDG_DATA_HOME:-$HOME/.local/share}/ppp}
"$root/scripts/install-mitmproxy-venv.sh" "$data/venv"

command -v podman >/dev/null 2>&1 ||
  echo "note: podman is not on PATH; sandboxes need Podman $PODMAN_TESTED_VERSION (see README)" >&2

"$bin" version
