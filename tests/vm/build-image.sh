#!/usr/bin/env bash
# Build (once) what the real-VM test needs, from Debian packages only:
#
#   <cache>/root/        a trixie userland with podman 5.4, gvproxy, qemu,
#                        virtiofsd and ssh. The host stays bookworm; the test
#                        enters this root with tests/vm/enter.sh.
#   <cache>/guest/       a podman-machine-compatible guest: disk.qcow2 (ext4 on
#                        the whole disk, no partition table), vmlinuz and
#                        initrd.img taken from the guest's own /boot. The test's
#                        qemu wrapper (tests/vm/bin/) boots them directly.
#
# <cache> is $PPP_VM_CACHE, else ${XDG_CACHE_HOME:-~/.cache}/ppp-test, plus
# vm-<hash of this recipe>: editing this script or tests/vm/guest/ builds a new
# one, and a second run finds the old one in no time. The last line printed on
# stdout is the cache directory.
#
# Why a home-made guest: the Fedora CoreOS image podman normally downloads is
# out of reach here (no internet), but Debian's archive is. The guest applies
# podman's Ignition config itself (tests/vm/guest/ignition-apply.py).
#
#   PPP_VM_MIRROR   Debian mirror (default: the first Debian URI in this
#                   machine's own apt sources)
# shellcheck disable=SC2016,SC2054 # mmdebstrap expands $1 in its hooks; commas separate its package lists
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { printf 'build-image: %s\n' "$*" >&2; }
die() { say "error: $1"; [ $# -lt 2 ] || say "hint: $2"; exit 1; }

# The uid podman runs as inside the root. podman writes it into the Ignition
# config as core's uid, so the guest's core has the same one.
readonly VM_UID=1000

[ "$(id -u)" -eq 0 ] || die "must run as root (mmdebstrap, mkfs)" "run it with sudo"
for tool in mmdebstrap mkfs.ext4 qemu-img sha256sum flock; do
  command -v "$tool" >/dev/null 2>&1 ||
    die "\`$tool\` not found" "run scripts/install-test-deps.sh (it installs mmdebstrap, e2fsprogs, qemu-utils)"
done

# The two recipes. Each is cached on its own, keyed by a hash of its
# arguments (and, for the guest, of tests/vm/guest/), so changing one does not
# rebuild the other.
#
# The host-side userland. gvproxy must sit where podman looks for helpers
# (/usr/libexec/podman among others); Debian installs it in /usr/bin. podman
# machine init reads /etc/timezone, gvproxy needs /etc/hosts and a
# /etc/resolv.conf (the test's namespace has no DNS to forward to). The directories
# under /opt are mount points for enter.sh.
ROOT_ARGS=(
  --variant=apt --mode=root
  --include=podman,gvproxy,qemu-system-x86,qemu-utils,virtiofsd,openssh-client,ca-certificates,passwd,tzdata,procps,iproute2
  --customize-hook='chroot "$1" useradd -m -u '"$VM_UID"' -s /bin/sh ppp'
  --customize-hook='echo Etc/UTC >"$1/etc/timezone"; ln -sf /usr/share/zoneinfo/Etc/UTC "$1/etc/localtime"'
  --customize-hook='printf "127.0.0.1 localhost\n::1 localhost\n" >"$1/etc/hosts"'
  --customize-hook='rm -f "$1/etc/resolv.conf"; echo "nameserver 127.0.0.1" >"$1/etc/resolv.conf"'
  --customize-hook='mkdir -p "$1/usr/libexec/podman" && [ -e "$1/usr/libexec/podman/gvproxy" ] || ln -s /usr/bin/gvproxy "$1/usr/libexec/podman/gvproxy"'
  --customize-hook='mkdir -p "$1/opt/ppp-test/bin" "$1/opt/ppp-vm" "$1/run/user/'"$VM_UID"'"'
  --customize-hook='rm -rf "$1/var/cache/apt/archives"/*.deb "$1/var/lib/apt/lists"/*'
)
# The guest. What FCOS brings that podman relies on: core with passwordless
# sudo, rootless podman (uidmap, passt), sshd, DHCP on the NIC (gvproxy gives
# 192.168.127.2; systemd-networkd is part of trixie's systemd), and Ignition,
# played by ppp-ignition.service.
GUEST_ARGS=(
  --variant=apt --mode=root
  --include=systemd-sysv,udev,kmod,linux-image-amd64,initramfs-tools,openssh-server,sudo,podman,crun,conmon,netavark,aardvark-dns,uidmap,passt,fuse-overlayfs,catatonit,dbus,libpam-systemd,dbus-user-session,nftables,wireguard-tools,iproute2,iputils-ping,curl,ca-certificates,python3,tzdata,procps,e2fsprogs,bind9-dnsutils,passwd
  --customize-hook='echo ppp-vm >"$1/etc/hostname"; printf "127.0.0.1 localhost ppp-vm\n::1 localhost\n" >"$1/etc/hosts"'
  --customize-hook='printf "[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n" >"$1/etc/systemd/network/10-uplink.network"'
  --customize-hook='chroot "$1" systemctl enable systemd-networkd.service'
  --customize-hook='echo "nameserver 192.168.127.1" >"$1/etc/resolv.conf"'
  --customize-hook='echo "/dev/vda / ext4 rw,relatime 0 1" >"$1/etc/fstab"'
  --customize-hook='echo "core ALL=(ALL) NOPASSWD: ALL" >"$1/etc/sudoers.d/90-core"; chmod 0440 "$1/etc/sudoers.d/90-core"'
  # A system group: a plain groupadd takes gid 1000, so core (podman's uid,
  # 1000) got gid 1001, and rootless virtiofsd, which runs as 1000:1000 and
  # cannot switch to another gid, refused every file the agent created.
  --customize-hook='groupadd -R "$1" -r -f wheel'
  --customize-hook='echo qemu_fw_cfg >"$1/etc/modules-load.d/ppp-ignition.conf"'
  --customize-hook='install -m 0755 '"$here"'/guest/ignition-apply.py "$1/usr/local/sbin/ppp-ignition-apply"'
  --customize-hook='install -m 0644 '"$here"'/guest/ppp-ignition.service "$1/etc/systemd/system/ppp-ignition.service"'
  --customize-hook='chroot "$1" systemctl enable ppp-ignition.service ssh.service'
  --customize-hook='chroot "$1" passwd -d root >/dev/null'
  --customize-hook='rm -rf "$1/var/cache/apt/archives"/*.deb "$1/var/lib/apt/lists"/*'
)
# $here is in GUEST_ARGS; it must not make the key depend on the checkout.
root_key=$(printf '%s\n' "${ROOT_ARGS[@]}" | sha256sum | cut -c1-12)
guest_key=$({ printf '%s\n' "${GUEST_ARGS[@]}" | sed "s|$here|tests/vm|g"; cat "$here"/guest/*; } | sha256sum | cut -c1-12)
base=${PPP_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ppp-test}
out=$base/vm-$root_key-$guest_key
mkdir -p "$base"
exec 9>"$base/.lock"
flock 9
if [ -e "$out/root/usr/bin/podman" ] && [ -e "$out/guest/done" ] && [ -e "$out/guest/vmlinux" ] &&
  [ -s "$base/agent-rootfs-trixie-curl-git.tar" ]; then
  say "cached: $out"
  printf '%s\n' "$out"
  exit 0
fi

mirror=${PPP_VM_MIRROR:-}
if [ -z "$mirror" ]; then
  # deb822 `URIs:` lines first, then one-line `deb URI suite` entries; the
  # first plain Debian archive wins (not security, not third-party repos).
  mirror=$(
    {
      cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '/^URIs:/ { for (i = 2; i <= NF; i++) print $i }'
      cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { print $i; break } }'
    } | grep -E '/debian/?$' | head -n1
  ) || true
fi
[ -n "$mirror" ] || die "no Debian mirror in /etc/apt/sources*" "set PPP_VM_MIRROR=http://deb.debian.org/debian"
say "mirror $mirror"
start=$SECONDS

root=$base/root-$root_key
if [ ! -e "$root/usr/bin/podman" ]; then
  say "trixie root (podman, gvproxy, qemu) into $root"
  rm -rf "$root.tmp"
  mmdebstrap --quiet "${ROOT_ARGS[@]}" trixie "$root.tmp" "$mirror" >&2
  mv "$root.tmp" "$root"
  say "root done ($((SECONDS - start)) s)"
fi

guest=$base/guest-$guest_key
if [ ! -e "$guest/done" ]; then
  say "trixie guest (kernel, systemd, podman, nftables, wireguard) into $guest"
  gstart=$SECONDS
  rm -rf "$guest.tmp"
  mkdir -p "$guest.tmp"
  groot=$guest.tmp/rootfs
  mmdebstrap --quiet "${GUEST_ARGS[@]}" trixie "$groot" "$mirror" >&2
  tmp=$guest.tmp
  kver=$(basename "$(ls -d "$groot"/lib/modules/*)")
  cp "$groot/boot/vmlinuz-$kver" "$tmp/vmlinuz"
  cp "$groot/boot/initrd.img-$kver" "$tmp/initrd.img"
  chmod 0644 "$tmp/vmlinuz" "$tmp/initrd.img"
  # ext4 on the whole disk (root=/dev/vda); podman grows the qcow2 at init,
  # the filesystem keeps its size, which is plenty for one agent image.
  truncate -s 4G "$tmp/disk.raw"
  mkfs.ext4 -q -L ppp-vm -d "$groot" "$tmp/disk.raw"
  qemu-img convert -f raw -O qcow2 "$tmp/disk.raw" "$tmp/disk.qcow2"
  rm -rf "$tmp/disk.raw" "$groot"
  printf 'built %s\nseconds %s\nkernel %s\n' "$(date -u +%FT%TZ)" "$((SECONDS - gstart))" "$kver" >"$tmp/done"
  mv "$tmp" "$guest"
  say "guest done ($((SECONDS - gstart)) s, kernel $kver)"
fi

# The uncompressed kernel, booted through its PVH entry (see the qemu wrapper):
# the test machines' KVM is PVM (kvm_pvm, nested), whose instruction emulator
# stops on the SHLX of the bzImage's zstd decompressor ("KVM internal error.
# Suberror: 1", "INTERNAL_ERROR in batch emul" in dmesg). The payload sits at
# (setup_sects + 1) * 512 + payload_offset, payload_length bytes long; zstd
# complains about the 4-byte size trailer, hence the check on the ELF magic.
if [ ! -e "$guest/vmlinux" ]; then
  command -v zstd >/dev/null 2>&1 || die "\`zstd\` not found" "run scripts/install-test-deps.sh"
  sects=$(od -An -tu1 -j 497 -N1 "$guest/vmlinuz")
  read -r off len < <(od -An -tu4 -j 584 -N8 "$guest/vmlinuz")
  tail -c +$(((sects + 1) * 512 + off + 1)) "$guest/vmlinuz" | head -c "$len" | zstd -dcq >"$guest/vmlinux.tmp" 2>/dev/null || true
  [ "$(head -c 4 "$guest/vmlinux.tmp" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] ||
    die "could not extract vmlinux from $guest/vmlinuz" "the kernel is no longer zstd-compressed? see build-image.sh"
  mv "$guest/vmlinux.tmp" "$guest/vmlinux"
fi

# The stand-in agent's rootfs (tests/vm/agent-image.sh adds the agent and a
# big file, then imports and pushes it). Built here because the test pushes
# from a namespace with no route to the mirror.
agent=$base/agent-rootfs-trixie-curl-git.tar
if [ ! -s "$agent" ]; then
  say "agent rootfs (trixie, sh, curl, git)"
  rm -rf "$agent.tmp"
  # git for issue 26's commit and push inside the agent's container; its
  # manuals, docs and locales left out to keep the image small.
  mmdebstrap --quiet --format=tar --variant=essential --include=curl,ca-certificates,git \
    --dpkgopt=path-exclude=/usr/share/man/* --dpkgopt=path-exclude=/usr/share/doc/* \
    --dpkgopt=path-exclude=/usr/share/locale/* --dpkgopt=path-exclude=/usr/share/info/* \
    trixie "$agent.tmp" "$mirror" >&2
  mv "$agent.tmp" "$agent"
fi

rm -rf "$out"
mkdir -p "$out"
ln -s "../root-$root_key" "$out/root"
ln -s "../guest-$guest_key" "$out/guest"
# Older recipes are dead weight (a guest is ~1 GB): keep only this one.
for old in "$base"/vm-* "$base"/root-* "$base"/guest-* "$base"/agent-*; do
  case $old in "$out" | "$root" | "$guest" | "$agent") ;; *) rm -rf "$old" ;; esac
done
say "ready: $out ($((SECONDS - start)) s)"
printf '%s\n' "$out"
