#!/usr/bin/env bash
# Install everything the test suite needs on a Debian machine (root, no
# prompts) and build the pinned mitmproxy venv the end-to-end tests run, with
# the addon's pinned Python tooling (ruff, mypy, pytest) in it.
#
# Idempotent and quick on repeat: apt is skipped when every package is already
# installed, and the venv is kept when its mitmdump reports the pinned version.
#
#   PPP_TEST_VENV  where the venv lives (default <repo>/target/test-venv)
#   PPP_PYTHON     Python to build it with (else scripts/find-python.sh searches)
#
# The apt list below is also what .devcontainer/Containerfile installs: the
# image runs this script, so the two cannot drift apart.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=/dev/null # versions.env holds only KEY=value lines
. "$root/versions.env"

# Why each package is here:
#   gnome-keyring, dbus, dbus-daemon, dbus-bin, libsecret-tools
#       a real Secret Service for the keyring tests: dbus-run-session comes from
#       dbus-daemon, dbus-send (used to wait for the service) from dbus-bin,
#       secret-tool from libsecret-tools
#   wireguard-tools, wireguard-go   guest WireGuard in netns (no kernel module here)
#   iproute2, nftables              netns, veth, routes, guest kill switch
#   bind9-dnsutils                  dig, to query the tunnel's DNS in e2e tests
#                                   (Debian's `dnsutils` is a transitional alias)
#   curl, ca-certificates, openssl  test clients and test CA/certificates
#   procps                          pgrep/ps to wait for pids to disappear
#   util-linux                      nsenter, mount for per-guest mount namespaces
#   qemu-utils                      qemu-img: the fake podman's small qcow2 "disks"
#   hyperfine                       whole-command benchmarks (never in assertions)
#   age                             stock `age` decrypts secrets.age in the store
#                                   tests, proving the file is plain age format
#   tmux                            drives `ppp tui` on a real terminal in e2e_tui
#   groff-base, man-db              render the generated man pages in the tests
#                                   (`groff -man`, `man -l`)
#   docker-registry                 a real OCI registry (distribution 2.8) on
#                                   loopback for `ppp kit push/pull` (kit_oci);
#                                   the tests run the binary, never its service
#   apache2-utils                   htpasswd -B: the registry's auth file in kit_oci
#   mmdebstrap, zstd, e2fsprogs     the real-VM test (tests/vm/build-image.sh):
#                                   a trixie root with podman 5.4 and a guest
#                                   image from Debian packages; zstd unpacks the
#                                   guest's kernel (see the qemu wrapper there)
#   (linter) shellcheck             `make check` runs it on scripts/ and .ci/run
APT_PACKAGES=(
  gnome-keyring dbus dbus-daemon dbus-bin libsecret-tools
  wireguard-tools wireguard-go iproute2 nftables bind9-dnsutils
  curl ca-certificates openssl procps util-linux qemu-utils
  hyperfine shellcheck age tmux groff-base man-db
  docker-registry apache2-utils git
  mmdebstrap zstd e2fsprogs
)

export DEBIAN_FRONTEND=noninteractive
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1
APT=(apt-get -q -o DPkg::Lock::Timeout=600)

summary=()
say() { printf 'install-test-deps: %s\n' "$*" >&2; }
die() { say "error: $1"; [ $# -lt 2 ] || say "hint: $2"; exit 1; }
note() { summary+=("$(printf '%-10s %s' "$1:" "$2")"); }

# --- cargo -----------------------------------------------------------------
# The toolchain is not ours to install (rustup, pinned in versions.env).
command -v cargo >/dev/null 2>&1 ||
  die "cargo not found on PATH" "install Rust $RUST_VERSION with rustup, with clippy and rustfmt, then add ~/.cargo/bin to PATH"
note cargo "$(cargo --version)"

# --- apt -------------------------------------------------------------------
start=$SECONDS
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  note apt "all ${#APT_PACKAGES[@]} packages already installed"
else
  [ "$(id -u)" -eq 0 ] ||
    die "missing Debian packages: ${missing[*]}" "run as root, or: sudo apt-get install ${missing[*]}"
  say "installing ${missing[*]}"
  "${APT[@]}" update >&2
  "${APT[@]}" install -y --no-install-recommends "${missing[@]}" >&2
  note apt "installed ${missing[*]} ($((SECONDS - start)) s)"
fi
# On a host with systemd, installing docker-registry enables and starts its
# service on :5000. The tests start their own registry on a free port; a
# system-wide one is not wanted, so switch it off (idempotent, quiet).
if [ -d /run/systemd/system ] && systemctl is-enabled docker-registry.service >/dev/null 2>&1; then
  systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
  note registry "disabled docker-registry.service (tests run their own)"
fi

# --- mitmproxy venv ----------------------------------------------------------
venv=${PPP_TEST_VENV:-$root/target/test-venv}
note mitmproxy "$("$root/scripts/install-mitmproxy-venv.sh" "$venv")"
note python-tools "$("$root/scripts/install-python-tools.sh" "$venv")"
note python "$("$venv/bin/python" -c 'import sys; print(sys.version.split()[0])') ($(readlink -f "$venv/bin/python"))"

printf '%s\n' "${summary[@]}"
