#!/usr/bin/env bash
# Run a command of the trixie root that tests/vm/build-image.sh made, as the
# unprivileged user `ppp` (uid 1000), in a private mount namespace. The real-VM
# test points PPP_PODMAN at tests/vm/podman, which comes through here, so ppp
# drives podman 5.4 + gvproxy + qemu from that root while the host stays
# bookworm. Test-only: product code never knows about it.
#
#   PPP_VM_DIR    the cache dir build-image.sh printed (root/ and guest/)
#   PPP_VM_STATE  a directory of the test's own, kept between calls: the user's
#                 home (podman's machine configs and disk copies) and
#                 XDG_RUNTIME_DIR (gvproxy, qmp and ready sockets, pid files)
#   PPP_VM_ACCEL  optional, kvm or tcg: forces the qemu wrapper's accelerator
#                 (tests/vm/bin/qemu-system-x86_64; without it, a probe decides)
#   XDG_CONFIG_HOME, XDG_DATA_HOME, XDG_RUNTIME_DIR
#                 a podman home, as ppp gives each sandbox its own (src/podman.rs,
#                 issue 25); without them, the podman user's own home
#
# Podman homes. podman runs one machine at a time per home, a home being its
# XDG directories; ppp gives every sandbox its own, so that several run at
# once. Here ppp runs as root and keeps those directories in its data dir,
# root's and 0700, which uid 1000 cannot enter. So the config and data
# directories are re-rooted: podman gets $PPP_VM_STATE/homes/<digest of the
# two paths ppp gave>/{config,data}, owned by uid 1000 (the same sandbox
# lands in the same one at every call). The runtime directory, ppp's own
# short path under /tmp (its sockets must fit sun_path), is passed as it is
# and handed to uid 1000: ppp reads podman's pid files there (gvproxy.pid,
# <machine>_vm.pid) as it would on a real host.
#
# Every call gets a fresh mount namespace, yet the machines it starts outlive
# it (qemu, gvproxy and virtiofsd keep theirs): the state lives on the host
# filesystem, bind-mounted at the same place each time, so a later call sees
# the same sockets and pid files. The host's /tmp is bound at /tmp, so paths
# ppp passes (workspaces, files for `cp`) mean the same inside.
#
# The network namespace is the caller's: the test runs ppp, and so podman,
# gvproxy and qemu, in its host namespace with no route out.
set -euo pipefail

die() { printf 'enter.sh: error: %s\n' "$1" >&2; [ $# -lt 2 ] || printf 'hint: %s\n' "$2" >&2; exit 125; }

[ "$(id -u)" -eq 0 ] || die "must run as root (mount namespace, pivot_root)"
dir=${PPP_VM_DIR:?set PPP_VM_DIR to the directory tests/vm/build-image.sh printed}
state=${PPP_VM_STATE:?set PPP_VM_STATE to a directory the test owns}
root=$dir/root
[ -x "$root/usr/bin/podman" ] || die "no trixie root at $root" "run tests/vm/build-image.sh"
[ -c /dev/kvm ] || die "/dev/kvm is missing" "the real-VM test needs KVM (nested virtualisation on a VM host)"

readonly VM_UID=1000
bin=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/bin
mkdir -p "$state/home" "$state/run"
chown "$VM_UID:$VM_UID" "$state/home" "$state/run"
chmod 0700 "$state/run"

config=/home/ppp/.config data=/home/ppp/.local/share runtime=/run/user/$VM_UID
if [ -n "${XDG_CONFIG_HOME:-}${XDG_DATA_HOME:-}" ]; then
  key=$(printf '%s\0%s' "${XDG_CONFIG_HOME:-}" "${XDG_DATA_HOME:-}" | sha256sum | cut -c1-12)
  home=$state/homes/$key
  mkdir -p "$home/config" "$home/data"
  chown "$VM_UID:$VM_UID" "$home" "$home/config" "$home/data"
  [ -e "$home/ppp-paths" ] || printf '%s\n%s\n' "${XDG_CONFIG_HOME:-}" "${XDG_DATA_HOME:-}" >"$home/ppp-paths"
  config=$home/config data=$home/data
fi
if [ -n "${XDG_RUNTIME_DIR:-}" ]; then
  case $XDG_RUNTIME_DIR in
    /tmp/?*) ;;
    *) die "XDG_RUNTIME_DIR=$XDG_RUNTIME_DIR is not under /tmp" "the trixie root sees the host's /tmp only" ;;
  esac
  mkdir -p "$XDG_RUNTIME_DIR"
  chown "$VM_UID:$VM_UID" "$XDG_RUNTIME_DIR"
  chmod 0700 "$XDG_RUNTIME_DIR"
  runtime=$XDG_RUNTIME_DIR
fi

# The body runs in the new mount namespace; "$@" is the command.
# shellcheck disable=SC2016 # expanded by the inner shell
exec unshare --mount --propagation private -- /bin/sh -euc '
root=$1 dir=$2 state=$3 bin=$4 uid=$5 accel=$6 config=$7 data=$8 runtime=$9
shift 9
# pivot_root, not chroot: rootless podman unshares a user namespace even for
# `podman version`, and the kernel refuses that inside a chroot (EPERM).
mount --bind "$root" "$root"
# /dev: a private tmpfs with the few nodes the root needs, and a kvm node the
# user may open (the host keeps /dev/kvm 0600 root; it is not ours to change).
mount -t tmpfs -o mode=0755,nosuid ppp-dev "$root/dev"
for n in null zero full random urandom tty; do
  touch "$root/dev/$n"
  mount --bind "/dev/$n" "$root/dev/$n"
done
mknod -m 0600 "$root/dev/kvm" c 10 232
chown "$uid" "$root/dev/kvm"
mkdir -p "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777 shm "$root/dev/shm"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /tmp "$root/tmp"
mount --bind "$state/home" "$root/home/ppp"
# /run is private to each call (the root is shared and stays clean); only
# XDG_RUNTIME_DIR must persist, so it is the state directory.
mount -t tmpfs -o mode=0755 ppp-run "$root/run"
mkdir -p "$root/run/user/$uid"
mount --bind "$state/run" "$root/run/user/$uid"
mount --bind "$bin" "$root/opt/ppp-test/bin"
mount --bind "$dir/guest" "$root/opt/ppp-vm"
cd "$root"
mkdir -p run/.oldroot
pivot_root . run/.oldroot
cd /
/run/.oldroot/bin/umount -l /run/.oldroot # from the host: the trixie root has no `mount` package
rmdir /run/.oldroot
exec setpriv --reuid="$uid" --regid="$uid" --init-groups /usr/bin/env -i -C /home/ppp \
  HOME=/home/ppp USER=ppp LOGNAME=ppp XDG_RUNTIME_DIR="$runtime" XDG_CONFIG_HOME="$config" XDG_DATA_HOME="$data" \
  PATH=/opt/ppp-test/bin:/usr/local/bin:/usr/bin:/bin \
  CONTAINERS_MACHINE_PROVIDER=qemu LANG=C.UTF-8 PODMAN_IGNORE_CGROUPSV1_WARNING=1 \
  PPP_VM_ACCEL="$accel" "$@"
' sh "$root" "$dir" "$state" "$bin" "$VM_UID" "${PPP_VM_ACCEL:-}" "$config" "$data" "$runtime" "$@"
