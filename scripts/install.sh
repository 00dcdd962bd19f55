#!/usr/bin/env bash
# `make install`: install the ppp binary and its runtime, then show what ppp
# finds. The runtime is the pinned mitmproxy in ppp's own venv under its data
# directory (`$PPP_DATA/venv`), where ppp looks for mitmdump.
#
#   PREFIX     install ppp to $PREFIX/bin (default: cargo's, ~/.cargo/bin)
#   PPP_DATA   ppp's data directory (default: $XDG_DATA_HOME/ppp or ~/.local/share/ppp)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=/dev/null # versions.env holds only KEY=value lines
. "$root/versions.env"

args=(install --path "$root" --locked --force)
if [ -n "${PREFIX:-}" ]; then args+=(--root "$PREFIX"); fi
cargo "${args[@]}"
bin=${PREFIX:-${CARGO_INSTALL_ROOT:-${CARGO_HOME:-$HOME/.cargo}}}/bin/ppp

data=${PPP_DATA:-${XDG_DATA_HOME:-$HOME/.local/share}/ppp}
"$root/scripts/install-mitmproxy-venv.sh" "$data/venv"

command -v podman >/dev/null 2>&1 ||
  echo "note: podman is not on PATH; sandboxes need Podman $PODMAN_TESTED_VERSION (see README)" >&2

"$bin" version
