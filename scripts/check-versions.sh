#!/usr/bin/env bash
# Check that versions.env stays strictly `KEY=value` / `# comment` (the Rust
# code embeds it with include_str! and parses it line by line, make includes
# it, the scripts source it), and that the dev container's pinned versions
# equal it.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
fail=0
err() { printf 'check-versions: error: %s\n' "$*" >&2; fail=1; }

# A value is one token: no spaces, quotes, `$`, backslashes or `#`, so the
# three readers cannot disagree about it.
n=0
while IFS= read -r line || [ -n "$line" ]; do
  n=$((n + 1))
  case "$line" in
    '' | '#'*) continue ;;
  esac
  printf '%s\n' "$line" | grep -Eq '^[A-Z][A-Z0-9_]*=[^[:space:]"'"'"'$\\#`]+$' ||
    err "versions.env line $n is not KEY=value: \`$line\`"
done < versions.env
# Sourcing a malformed file could run part of it as a command.
[ "$fail" -eq 0 ] || exit 1

# shellcheck source=/dev/null # versions.env holds only KEY=value lines
. ./versions.env

for key in RUST_VERSION MITMPROXY_VERSION; do
  want=${!key}
  json=$(sed -n 's/^ *"'"$key"'": *"\([^"]*\)".*/\1/p' .devcontainer/devcontainer.json)
  arg=$(sed -n 's/^ARG '"$key"'=//p' .devcontainer/Containerfile)
  [ "$json" = "$want" ] ||
    err ".devcontainer/devcontainer.json build arg $key is \`$json\`, versions.env says \`$want\`"
  [ "$arg" = "$want" ] ||
    err ".devcontainer/Containerfile ARG $key default is \`$arg\`, versions.env says \`$want\`"
done

[ "$fail" -eq 0 ] && echo "check-versions: versions.env and .devcontainer agree"
exit "$fail"
