#!/usr/bin/env bash
# Build the stand-in agent image for the real-VM test and push it to the
# test's registry: a trixie rootfs with sh and curl (build-image.sh caches it
# next to the VM images), the stand-in agent as /usr/local/bin/opencode, and a 12 MiB
# file of random bytes, so that its one layer is over 10 MiB on purpose (the
# pull through the tunnel must carry it whole). podman (from the trixie root,
# through enter.sh) imports it and pushes it.
#
#   agent-image.sh AGENT_SCRIPT REFERENCE
#
# REFERENCE is where to push, e.g. 198.18.0.10:5000/ppp/agent:latest (plain
# TLS-unverified push from the test's host namespace; the guest pulls it by
# name, verified, through the tunnel). PPP_VM_DIR and PPP_VM_STATE as for
# enter.sh.
set -euo pipefail

say() { printf 'agent-image: %s\n' "$*" >&2; }
die() { say "error: $1"; [ $# -lt 2 ] || say "hint: $2"; exit 1; }
[ $# -eq 2 ] || die "usage: agent-image.sh AGENT_SCRIPT REFERENCE"
agent=$1 ref=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=${PPP_VM_DIR:?set PPP_VM_DIR}
: "${PPP_VM_STATE:?set PPP_VM_STATE}" # read by enter.sh

# build-image.sh made the rootfs beside the VM images.
rootfs=$(dirname "$(readlink -f "$dir/guest")")/agent-rootfs-trixie-curl-git.tar
[ -s "$rootfs" ] || die "no agent rootfs at $rootfs" "run tests/vm/build-image.sh"

# The tar goes where the trixie root sees it at the same path (/tmp).
work=$(mktemp -d /tmp/ppp-agent-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/add/usr/local/bin" "$work/add/opt"
install -m 0755 "$agent" "$work/add/usr/local/bin/opencode"
head -c $((12 * 1024 * 1024)) /dev/urandom >"$work/add/opt/ballast.bin"
cp "$rootfs" "$work/agent.tar"
tar -C "$work/add" -rf "$work/agent.tar" usr/local/bin/opencode opt/ballast.bin
chmod -R a+rX "$work"

"$here/enter.sh" podman import --change 'CMD ["/usr/local/bin/opencode"]' "$work/agent.tar" localhost/ppp-agent:latest >&2
"$here/enter.sh" podman push --tls-verify=false localhost/ppp-agent:latest "docker://$ref" >&2
say "pushed $ref"
