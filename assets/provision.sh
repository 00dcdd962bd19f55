#!/usr/bin/env bash
# ppp guest provisioning: runs inside a sandbox VM (Fedora CoreOS in
# production; Debian/Ubuntu work too) as root, through
#
#   podman machine ssh NAME -- sudo bash /tmp/ppp/provision.sh up \
#       --wg-conf - [--image IMAGE_REF]  < wg0.conf
#   podman machine ssh NAME -- sudo bash /tmp/ppp/provision.sh verify \
#       [--denied-url URL --denied-connect-to HOST:PORT:IP:PORT] --salt SALT
#
# `up` makes all egress leave through the WireGuard tunnel to the host's
# mitmdump, and nothing else: it is idempotent and runs on every boot. It
# prints `ppp-provision: step <n>/<N> <what>` per step and, on failure,
# `ppp-provision: FAILED at <step>: <why>` and exits 1.
#
# `verify` prints exactly one line per check, `ok <check>`,
# `fail <check>: <reason>` or (policy-denies only) `skip <check>: <reason>`,
# then the guest's environment as salted digests (`env …` lines and one
# `env-end <n>`), which the host compares with its secrets; it exits 1 if
# any check failed. See docs/provisioning.md.
#
# Exit codes: 0 success, 1 failure, 2 usage error.
set -Eeuo pipefail
umask 077
export LC_ALL=C
PATH=${PATH:-/usr/bin:/bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

readonly WG_IF=wg0
# The tunnel's config, with the guest's private key, lives on tmpfs only:
# no reboot, disk copy or template carries it, and a machine booted
# without ppp has no tunnel until ppp pushes the config again (ADR 0018).
readonly RUN_DIR=/run/ppp
readonly WG_CONF=$RUN_DIR/wg0.conf
# Where ppp before ADR 0018 kept it (on disk); removed on sight.
readonly LEGACY_WG_CONFS=(/etc/wireguard/wg0.conf /tmp/ppp/wg0.conf)
readonly NFT_TABLE=ppp
# The kill switch, persisted so it is in force from the first packet of
# every boot, before any other service (ADR 0018): the ruleset in /etc and
# a unit that loads it early, enabled by hand (no systemctl needed).
readonly KILLSWITCH_NFT=/etc/ppp/killswitch.nft
readonly KILLSWITCH_UNIT=ppp-killswitch.service
readonly UNIT_DIR=/etc/systemd/system
readonly KILLSWITCH_WANTS=$UNIT_DIR/sysinit.target.wants/$KILLSWITCH_UNIT
readonly STATE_DIR=/var/lib/ppp
readonly MARKER=$STATE_DIR/.provisioned
readonly NET_STATE=$STATE_DIR/uplink
# The system bundle with mitmproxy's CA, exported for the agent container:
# ppp mounts it over the image's /etc/ssl/certs/ca-certificates.crt.
readonly CA_BUNDLE_EXPORT=$STATE_DIR/ca-bundle.pem
readonly TUNNEL_DNS=10.0.0.53
# sshd's port in the guest: gvproxy forwards podman's ssh port to it.
readonly SSH_PORT=22
# Seconds between the lines `up` prints while it runs (see heartbeat).
readonly HEARTBEAT_SECONDS=3
readonly HEARTBEAT_LINE='ppp-provision: alive'

readonly FALLBACK_GATEWAY=192.168.127.1
readonly CA_HTTP_URL=http://mitm.it/cert/pem
readonly CA_HTTPS_URL=https://mitm.it/cert/pem
readonly CA_FEDORA=/etc/pki/ca-trust/source/anchors/ppp-mitmproxy.crt
readonly CA_DEBIAN=/usr/local/share/ca-certificates/ppp-mitmproxy.crt
readonly NM_CONF_DIR=/etc/NetworkManager/conf.d
readonly SYSCTL_CONF=/etc/sysctl.d/99-ppp.conf
readonly TOTAL_STEPS=9

STEP=setup
TMP=''
VERIFY_TMP=''

say() { printf 'ppp-provision: %s\n' "$*"; }

# The usage text on stderr, then exit ${1:-2}.
usage() {
  cat >&2 <<'EOF'
usage: provision.sh up --wg-conf PATH|- [--image IMAGE_REF]
       provision.sh verify [--denied-url URL [--denied-connect-to HOST:PORT:IP:PORT]]
                           --salt SALT
EOF
  exit "${1:-2}"
}

usage_error() {
  printf 'ppp-provision: usage error: %s\n' "$1" >&2
  usage
}

# Stop `up` with one line ppp can quote, naming the step.
die() {
  trap - ERR
  say "FAILED at $STEP: $*"
  exit 1
}

HEARTBEAT_PID=''

cleanup() {
  if [ -n "$HEARTBEAT_PID" ]; then
    kill "$HEARTBEAT_PID" 2>/dev/null || true
  fi
  if [ -n "$TMP" ] && [ -d "$TMP" ]; then
    rm -rf -- "$TMP"
  fi
}
trap cleanup EXIT

have() { command -v "$1" >/dev/null 2>&1; }

# A line every HEARTBEAT_SECONDS on the session's own output, for as long as
# this script runs: ppp gives up on a session that stays silent (ssh itself
# may take a quarter of an hour to notice a connection whose packets stopped
# arriving) and names the step it was at. It stops with the script, even one
# killed outright.
start_heartbeat() {
  local parent=$$
  (
    trap - ERR EXIT
    set +e
    while sleep "$HEARTBEAT_SECONDS" && kill -0 "$parent" 2>/dev/null; do
      printf '%s\n' "$HEARTBEAT_LINE" 2>/dev/null || exit 0
    done
  ) &
  HEARTBEAT_PID=$!
}

# `step N what`: start step N.
step() {
  STEP="step $1/$TOTAL_STEPS ($2)"
  say "step $1/$TOTAL_STEPS $2"
}

# ---------------------------------------------------------------------------
# wg0.conf parsing

# The value of the first `Key = value` line (case-insensitive key) in $1.
conf_value() {
  local file=$1 key=$2 line k v
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%$'\r'}
    [[ $line == *=* ]] || continue
    k=${line%%=*}
    v=${line#*=}
    k=${k//[[:space:]]/}
    v=${v#"${v%%[![:space:]]*}"}
    v=${v%"${v##*[![:space:]]}"}
    if [ "${k,,}" = "${key,,}" ]; then
      printf '%s\n' "$v"
      return 0
    fi
  done <"$file"
  return 1
}

valid_ipv4() {
  local ip=$1 part
  local -a parts
  [[ $ip =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || return 1
  IFS=. read -r -a parts <<<"$ip"
  for part in "${parts[@]}"; do
    [ "$((10#$part))" -le 255 ] || return 1
  done
}

# Sets EP_IP and EP_PORT from the Endpoint line of $1.
parse_endpoint() {
  local ep
  ep=$(conf_value "$1" Endpoint) || return 1
  EP_IP=${ep%:*}
  EP_PORT=${ep##*:}
  valid_ipv4 "$EP_IP" || return 1
  [[ $EP_PORT =~ ^[0-9]{1,5}$ ]] && [ "$EP_PORT" -ge 1 ] && [ "$EP_PORT" -le 65535 ]
}

# ---------------------------------------------------------------------------
# uplink and gateway

# Sets UPLINK and GATEWAY: the interface and next hop that reach the
# WireGuard endpoint without the tunnel. Order: a default route that is not
# wg0 (first run), then the route the kernel picks for the endpoint (re-runs,
# where the /32 exists and the default is wg0), then what the last `up`
# saved. The gateway falls back to gvproxy's 192.168.127.1.
find_uplink() {
  local line dev via
  UPLINK='' GATEWAY=''
  while IFS= read -r line; do
    dev=$(field_after dev "$line")
    via=$(field_after via "$line")
    if [ -n "$dev" ] && [ "$dev" != "$WG_IF" ] && [ -n "$via" ]; then
      UPLINK=$dev GATEWAY=$via
      return 0
    fi
  done < <(ip -4 route show default 2>/dev/null)
  line=$(ip -4 route get "$EP_IP" 2>/dev/null | head -n1) || line=
  dev=$(field_after dev "$line")
  via=$(field_after via "$line")
  if [ -n "$dev" ] && [ "$dev" != "$WG_IF" ] && [ "$dev" != lo ]; then
    UPLINK=$dev GATEWAY=${via:-$FALLBACK_GATEWAY}
    return 0
  fi
  if [ -r "$NET_STATE" ]; then
    # Written by us: two lines, uplink then gateway.
    { read -r UPLINK && read -r GATEWAY; } <"$NET_STATE" || true
    if [ -n "$UPLINK" ] && [ -n "$GATEWAY" ] && ip link show dev "$UPLINK" >/dev/null 2>&1; then
      return 0
    fi
  fi
  UPLINK='' GATEWAY=''
  return 1
}

# The word after $1 in the words of $2 (e.g. `dev` in an `ip route` line).
field_after() {
  local want=$1 prev='' w
  local -a words
  read -r -a words <<<"$2"
  for w in "${words[@]}"; do
    if [ "$prev" = "$want" ]; then
      printf '%s\n' "$w"
      return 0
    fi
    prev=$w
  done
  return 0
}

# ---------------------------------------------------------------------------
# the tunnel

wg_quick() {
  # wg-quick falls back to $WG_QUICK_USERSPACE_IMPLEMENTATION itself when
  # `ip link add wg0 type wireguard` fails; it never needs resolvconf here
  # (no DNS= line).
  wg-quick "$@"
}

# The peer's latest handshake (unix seconds), 0 if none or no wg0.
latest_handshake() {
  local out
  out=$(wg show "$WG_IF" latest-handshakes 2>/dev/null) || {
    echo 0
    return 0
  }
  out=$(printf '%s\n' "$out" | awk 'NR == 1 { print $2 }')
  printf '%s\n' "${out:-0}"
}

# Send a packet into the tunnel so that WireGuard handshakes.
nudge() {
  curl -s -o /dev/null -m 1 --connect-to "mitm.it:80:$TUNNEL_DNS:80" "$CA_HTTP_URL" >/dev/null 2>&1 || true
}

# Wait up to $1 seconds for a handshake at most $2 seconds old (0: any).
wait_handshake() {
  local deadline=$((SECONDS + $1)) max_age=$2 hs now
  while :; do
    hs=$(latest_handshake)
    now=$(date +%s)
    if [ "$hs" != 0 ] && { [ "$max_age" = 0 ] || [ $((now - hs)) -le "$max_age" ]; }; then
      return 0
    fi
    [ "$SECONDS" -lt "$deadline" ] || return 1
    nudge
    sleep 0.2
  done
}

# ---------------------------------------------------------------------------
# the kill switch

# The nftables table, replaced in one transaction (nft -f is atomic): the
# leading `table` + `delete table` pair works on every nft (`destroy table`
# needs nft >= 1.0.8).
#
# Besides the tunnel, only the machine's management channel leaves by the
# uplink: sshd's side of the connections gvproxy opens to port 22 from its
# gateway address (`podman machine ssh`/`cp`, podman's API forwarding). Two
# rules, because conntrack meets these connections two ways:
# - opened after the table is loaded (every boot: the table is in force
#   before sshd starts), it is tracked from gvproxy's SYN, and sshd's packets
#   are its reply direction;
# - open before (the very session that runs this script on the first run, and
#   perhaps conntrack was not even loaded yet), conntrack picks it up
#   mid-stream from the first packet it sees, which is sshd's output: sshd is
#   then its "original" side, and every packet is "new" until one is let
#   through. Dropping those left the session hanging with its output unsent
#   (seen on a real VM, docs/provisioning.md). So sshd's non-SYN, non-RST
#   packets to the gateway pass too: they belong to a connection gvproxy
#   opened, since a new one needs a SYN from port 22, which stays dropped.
# Nothing else a guest process can send matches: not another address
# (gvproxy's host alias, the world through gvproxy's NAT), not another port
# or protocol, not a connection opened from port 22.
nft_ruleset() {
  cat <<EOF
table inet $NFT_TABLE
delete table inet $NFT_TABLE
table inet $NFT_TABLE {
  chain output {
    type filter hook output priority filter; policy drop;
    oifname "lo" accept
    meta nfproto ipv6 drop
    oifname "$WG_IF" accept
    oifname "$UPLINK" ip daddr $EP_IP udp dport $EP_PORT accept
    oifname "$UPLINK" ip daddr { $GATEWAY, 255.255.255.255 } udp sport 68 udp dport 67 accept
    oifname "$UPLINK" ip daddr $GATEWAY tcp sport $SSH_PORT ct direction reply accept
    oifname "$UPLINK" ip daddr $GATEWAY tcp sport $SSH_PORT ct direction original ct state new,established tcp flags & (syn | rst) == 0 accept
  }
  chain forward {
    type filter hook forward priority filter; policy drop;
    meta nfproto ipv6 drop
    oifname "$WG_IF" accept
    iifname "$WG_IF" ct state established,related accept
  }
}
EOF
}

# The unit that loads the kill switch at boot: before network-pre.target
# (so before NetworkManager brings the NIC up) and without the default
# dependencies (which would order it after sysinit.target, too late).
killswitch_unit() {
  cat <<EOF
# written by ppp: no egress but the WireGuard tunnel, from the first packet
[Unit]
Description=ppp kill switch (nftables table inet $NFT_TABLE)
DefaultDependencies=no
Before=network-pre.target shutdown.target
Wants=network-pre.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=$1 -f $KILLSWITCH_NFT

[Install]
WantedBy=sysinit.target
EOF
}

# Persist the kill switch in $1 (the ruleset file) for every boot.
install_killswitch() {
  local nft_bin
  nft_bin=$(command -v nft)
  mkdir -p "$(dirname "$KILLSWITCH_NFT")" "$UNIT_DIR/sysinit.target.wants"
  copy_file "$1" "$KILLSWITCH_NFT" 0644
  write_file "$UNIT_DIR/$KILLSWITCH_UNIT" "$(killswitch_unit "$nft_bin")"$'\n' 0644
  ln -sfn "../$KILLSWITCH_UNIT" "$KILLSWITCH_WANTS"
  # Only where systemd is this system's init: never another's through a
  # shared /run.
  if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ] && have systemctl; then
    systemctl daemon-reload || true
  fi
}

# ---------------------------------------------------------------------------
# up

# Write $2 to $1 atomically (temp file in the same directory, so it gets
# that directory's SELinux label, then rename), with mode $3.
write_file() {
  local dest=$1 content=$2 mode=$3 tmp
  tmp=$(mktemp "$(dirname "$dest")/.ppp-tmp.XXXXXX")
  printf '%s' "$content" >"$tmp"
  chmod "$mode" "$tmp"
  mv -f -- "$tmp" "$dest"
  relabel "$dest"
}

# Copy $1 to $2 atomically, with mode $3 (as write_file).
copy_file() {
  local src=$1 dest=$2 mode=$3 tmp
  tmp=$(mktemp "$(dirname "$dest")/.ppp-tmp.XXXXXX")
  cat -- "$src" >"$tmp"
  chmod "$mode" "$tmp"
  mv -f -- "$tmp" "$dest"
  relabel "$dest"
}

# The file's default SELinux label (FCOS enforces SELinux); a no-op elsewhere.
relabel() {
  if have restorecon; then
    restorecon -F "$1" >/dev/null 2>&1 || true
  fi
}

cmd_up() {
  local wg_conf='' image=''
  while [ $# -gt 0 ]; do
    case $1 in
      --wg-conf) [ $# -ge 2 ] || usage_error "--wg-conf needs a value"; wg_conf=$2; shift 2 ;;
      --image) [ $# -ge 2 ] || usage_error "--image needs a value"; image=$2; shift 2 ;;
      *) usage_error "unknown argument to up: $1" ;;
    esac
  done
  [ -n "$wg_conf" ] || usage_error "up needs --wg-conf"
  start_heartbeat
  trap 'die "command failed (exit $?): $BASH_COMMAND"' ERR
  [ "$(id -u)" -eq 0 ] || die "must run as root (ppp runs it with sudo)"
  TMP=$(mktemp -d /tmp/ppp-provision.XXXXXX)

  # 1. WireGuard available: the kernel module, else wireguard-go.
  step 1 "wireguard"
  for tool in wg wg-quick ip nft curl; do
    have "$tool" || die "\`$tool\` is not installed in the guest"
  done
  if have modprobe; then
    modprobe wireguard >/dev/null 2>&1 || true
  fi
  if [ -e /sys/module/wireguard ]; then
    say "wireguard: kernel module"
    unset WG_QUICK_USERSPACE_IMPLEMENTATION
  elif have wireguard-go; then
    say "wireguard: no kernel module, using userspace wireguard-go"
    export WG_QUICK_USERSPACE_IMPLEMENTATION=wireguard-go
  else
    die "no wireguard kernel module and no wireguard-go on PATH"
  fi

  # 2. wg0.conf: read (from stdin with `-`, how ppp sends it, so no copy
  # is staged anywhere), checked, never edited, installed 0600 (umask, not
  # chmod) on tmpfs.
  step 2 "install $WG_CONF"
  mkdir -p "$RUN_DIR" "$STATE_DIR"
  chmod 0700 "$RUN_DIR"
  chmod 0755 "$STATE_DIR"
  local staged=$RUN_DIR/.wg0.conf.ppp-tmp what=$wg_conf
  if [ "$wg_conf" = - ]; then
    what='the WireGuard config on stdin'
    cat >"$staged"
  else
    [ -r "$wg_conf" ] || die "cannot read $wg_conf"
    cat -- "$wg_conf" >"$staged"
  fi
  local table
  table=$(conf_value "$staged" Table) || table=
  if [ "${table,,}" != off ]; then
    rm -f -- "$staged"
    die "$what lacks 'Table = off' (wg-quick would route the tunnel's own packets into itself)"
  fi
  if conf_value "$staged" DNS >/dev/null; then
    rm -f -- "$staged"
    die "$what has a 'DNS =' line; refusing it (wg-quick would run resolvconf, which breaks on FCOS; DNS is set by this script)"
  fi
  if ! parse_endpoint "$staged"; then
    rm -f -- "$staged"
    die "$what has no 'Endpoint = <IPv4>:<port>' line"
  fi
  if ! conf_value "$staged" PrivateKey >/dev/null; then
    rm -f -- "$staged"
    die "$what has no PrivateKey"
  fi
  say "endpoint $EP_IP:$EP_PORT"
  mv -f -- "$staged" "$WG_CONF"
  # An older ppp kept the key on disk; a template or a reboot would carry it.
  rm -f -- "${LEGACY_WG_CONFS[@]}"

  # 3. The off-tunnel route to the endpoint (longest prefix wins over the
  # default via wg0).
  step 3 "off-tunnel route to $EP_IP"
  find_uplink || die "cannot find the uplink: no default route and no route to $EP_IP"
  printf '%s\n%s\n' "$UPLINK" "$GATEWAY" >"$NET_STATE"
  ip route replace "$EP_IP/32" via "$GATEWAY" dev "$UPLINK"
  say "uplink $UPLINK, gateway $GATEWAY"

  # 4. The kill switch, before the tunnel moves: from here on only the
  # tunnel (and its own UDP) can leave, so there is no open window.
  step 4 "kill switch (nftables table inet $NFT_TABLE)"
  nft_ruleset >"$TMP/ppp.nft"
  nft -f "$TMP/ppp.nft" || die "nft rejected the kill switch"
  install_killswitch "$TMP/ppp.nft"
  say "kill switch persisted in $KILLSWITCH_NFT, loaded at boot by $KILLSWITCH_UNIT"

  # 5. The tunnel: a previous wg0 goes first, so re-runs start clean.
  step 5 "tunnel $WG_IF"
  if ip link show dev "$WG_IF" >/dev/null 2>&1; then
    say "taking down the previous $WG_IF"
    ip link del dev "$WG_IF"
  fi
  wg_quick up "$WG_CONF" || die "wg-quick up $WG_CONF failed"
  ip route replace default dev "$WG_IF" quickack 1
  wait_handshake 10 0 || die "no WireGuard handshake with $EP_IP:$EP_PORT within 10 s"
  say "handshake with $EP_IP:$EP_PORT"

  # 6. DNS through the tunnel (mitmproxy answers 10.0.0.53 under policy).
  step 6 "DNS via $TUNNEL_DNS"
  if [ -d /etc/NetworkManager ]; then
    [ -d "$NM_CONF_DIR" ] || mkdir -m 0755 "$NM_CONF_DIR"
    write_file "$NM_CONF_DIR/90-ppp-dns.conf" $'# written by ppp: /etc/resolv.conf is ppp\'s\n[main]\ndns=none\n' 0644
    if have systemctl && systemctl is-active --quiet NetworkManager 2>/dev/null; then
      if have nmcli; then
        nmcli general reload conf >/dev/null 2>&1 || systemctl reload NetworkManager
      else
        systemctl reload NetworkManager
      fi
    fi
  fi
  if [ -L /etc/resolv.conf ]; then
    rm -f /etc/resolv.conf
  fi
  local resolv="# written by ppp: every DNS query goes through the tunnel
nameserver $TUNNEL_DNS
"
  write_file /etc/resolv.conf "$resolv" 0644 2>/dev/null ||
    printf '%s' "$resolv" >/etc/resolv.conf # a bind-mounted resolv.conf cannot be renamed over

  # 7. mitmproxy's CA, fetched through the tunnel and trusted system-wide.
  step 7 "trust the mitmproxy CA"
  curl -fsS --retry 3 --retry-delay 1 -m 10 --connect-to "mitm.it:80:$TUNNEL_DNS:80" "$CA_HTTP_URL" -o "$TMP/ca.pem" ||
    die "could not fetch the CA from $CA_HTTP_URL through the tunnel"
  if have openssl; then
    openssl x509 -noout -in "$TMP/ca.pem" >/dev/null 2>&1 || die "what $CA_HTTP_URL returned is not a PEM certificate"
  else
    if ! grep -q -- '^-----BEGIN CERTIFICATE-----' "$TMP/ca.pem" || ! grep -q -- '^-----END CERTIFICATE-----' "$TMP/ca.pem"; then
      die "what $CA_HTTP_URL returned is not a PEM certificate"
    fi
  fi
  local bundle
  if [ -d "$(dirname "$CA_FEDORA")" ] && have update-ca-trust; then
    copy_file "$TMP/ca.pem" "$CA_FEDORA" 0644
    update-ca-trust extract || die "update-ca-trust failed"
    say "trusted in $CA_FEDORA"
    bundle=/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem
  elif [ -d "$(dirname "$CA_DEBIAN")" ] && have update-ca-certificates; then
    copy_file "$TMP/ca.pem" "$CA_DEBIAN" 0644
    update-ca-certificates >/dev/null || die "update-ca-certificates failed"
    say "trusted in $CA_DEBIAN"
    bundle=/etc/ssl/certs/ca-certificates.crt
  else
    die "no CA trust store found (neither update-ca-trust with /etc/pki/ca-trust nor update-ca-certificates with /usr/local/share/ca-certificates)"
  fi
  # The bundle must now hold the CA (its first base64 line is enough to tell).
  [ -s "$bundle" ] || die "the system CA bundle $bundle is missing after the update"
  grep -qxF -- "$(sed -n 2p "$TMP/ca.pem")" "$bundle" || die "the system CA bundle $bundle does not contain mitmproxy's CA"
  copy_file "$bundle" "$CA_BUNDLE_EXPORT" 0644
  # Containers (container_t) may read it only with a container label.
  if have selinuxenabled && selinuxenabled && have chcon; then
    chcon -t container_file_t "$CA_BUNDLE_EXPORT" || die "could not label $CA_BUNDLE_EXPORT for containers"
  fi
  say "CA bundle for containers in $CA_BUNDLE_EXPORT"

  # 8. No IPv6: mitmproxy's tunnel is IPv4-only (the kill switch drops it too).
  step 8 "disable IPv6"
  sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 ||
    die "sysctl could not disable IPv6"
  [ -d "$(dirname "$SYSCTL_CONF")" ] || mkdir -m 0755 "$(dirname "$SYSCTL_CONF")"
  write_file "$SYSCTL_CONF" $'# written by ppp: the tunnel is IPv4-only\nnet.ipv6.conf.all.disable_ipv6 = 1\nnet.ipv6.conf.default.disable_ipv6 = 1\n' 0644

  # 9. The agent image the user named (PPP_<AGENT>_IMAGE), pulled once (per
  # image ref) as the ssh user, whose rootless podman runs the agent.
  # Without --image ppp builds its own image after this script, through
  # the tunnel it has just made (or loads it from the host's cache).
  step 9 "agent image ${image:-built by ppp}"
  if [ -z "$image" ]; then
    say "built or loaded by ppp after provisioning"
  elif [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$image" ]; then
    say "already pulled (marker $MARKER)"
  else
    have podman || die "podman is not installed in the guest"
    pull_as_user "$image" || die "podman pull $image failed"
    write_file "$MARKER" "$image" 0644
  fi
  say "done"
}

# `podman pull` as the user who ran sudo (rootless podman keeps its own image
# store), or as root when there is no such user.
pull_as_user() {
  local image=$1 user=${SUDO_USER:-} uid home
  if [ -z "$user" ] || [ "$user" = root ]; then
    say "pulling as root"
    podman pull "$image"
    return
  fi
  uid=$(id -u "$user") || return 1
  home=$(getent passwd "$user" | cut -d: -f6) || home=/
  say "pulling as $user"
  local env=(env "HOME=${home:-/}" "USER=$user" "LOGNAME=$user" "PATH=$PATH")
  if [ -d "/run/user/$uid" ]; then
    env+=("XDG_RUNTIME_DIR=/run/user/$uid")
  fi
  (cd / && runuser -u "$user" -- "${env[@]}" podman pull "$image")
}

# ---------------------------------------------------------------------------
# verify

FAILED=0
check_ok() { printf 'ok %s\n' "$1"; }
check_fail() {
  printf 'fail %s: %s\n' "$1" "$2"
  FAILED=1
}

check_handshake() {
  if ! ip link show dev "$WG_IF" >/dev/null 2>&1; then
    check_fail handshake "$WG_IF does not exist"
  elif ! wg show "$WG_IF" >/dev/null 2>&1; then
    check_fail handshake "$WG_IF is not a WireGuard interface"
  elif wait_handshake 5 180; then
    check_ok handshake
  else
    check_fail handshake "no WireGuard handshake on $WG_IF within the last 180 s (nudged, waited 5 s)"
  fi
}

# One direct TCP attempt to $1:$2 bound to the uplink. Prints why it shows
# egress is open, or nothing when it was blocked. The kill switch drops the
# SYN, which TCP retries until curl's timeout (exit 28); any answer at all,
# a refusal included, means packets left outside the tunnel; any other error
# is reported too, so a probe that could not run never passes.
direct_attempt() {
  local out rc
  out=$(curl -sS -o /dev/null -m 2 --interface "if!$UPLINK" "http://$1:$2/" 2>&1) && rc=0 || rc=$?
  out=${out//$'\n'/ }
  case $rc in
    28) ;;
    0 | 22 | 52 | 56) echo "a direct TCP connection to $1:$2 on $UPLINK succeeded" ;;
    7) echo "a direct TCP connection to $1:$2 on $UPLINK was answered (curl: $out)" ;;
    *) [[ $out == *"not permitted"* ]] || echo "the direct probe to $1:$2 on $UPLINK failed unexpectedly (curl exit $rc: $out)" ;;
  esac
}

check_no_direct_egress() {
  local policy forward
  if ! policy=$(nft list chain inet "$NFT_TABLE" output 2>/dev/null); then
    check_fail no-direct-egress "nftables table inet $NFT_TABLE (chain output) is missing"
    return
  fi
  forward=$(nft list chain inet "$NFT_TABLE" forward 2>/dev/null) || forward=
  if [[ $policy != *"policy drop"* ]] || [[ $forward != *"policy drop"* ]]; then
    check_fail no-direct-egress "table inet $NFT_TABLE does not drop by default on output and forward"
    return
  fi
  if [ ! -s "$KILLSWITCH_NFT" ] || [ ! -e "$KILLSWITCH_WANTS" ]; then
    check_fail no-direct-egress "the kill switch is not installed for boot ($KILLSWITCH_NFT, $KILLSWITCH_WANTS)"
    return
  fi
  if [ -z "${EP_IP:-}" ] || ! find_uplink; then
    check_fail no-direct-egress "cannot find the uplink interface to probe"
    return
  fi
  # Both probes at once: a dropped SYN is retried until the timeout (TCP
  # does not report the local drop), so a pass costs the timeout, once.
  local probes=("$GATEWAY:80" "$EP_IP:$EP_PORT") i why
  local -a pids=()
  for i in "${!probes[@]}"; do
    direct_attempt "${probes[$i]%:*}" "${probes[$i]##*:}" >"$VERIFY_TMP/probe.$i" &
    pids+=($!)
  done
  wait "${pids[@]}" || true
  for i in "${!probes[@]}"; do
    why=$(cat "$VERIFY_TMP/probe.$i")
    if [ -n "$why" ]; then
      check_fail no-direct-egress "$why"
      return
    fi
  done
  check_ok no-direct-egress
}

check_policy_denies() {
  local url=$1 connect_to=$2 code args=(-s -o /dev/null -w '%{http_code}' -m 10)
  if [ -z "$url" ]; then
    printf 'skip policy-denies: no --denied-url given\n'
    return
  fi
  [ -z "$connect_to" ] || args+=(--connect-to "$connect_to")
  code=$(curl "${args[@]}" -- "$url" 2>/dev/null) || true
  if [ "$code" = 403 ]; then
    check_ok policy-denies
  else
    check_fail policy-denies "$url answered HTTP ${code:-000}, not the proxy's 403"
  fi
}

check_ca_trusted() {
  local err
  if err=$(curl -fsS -m 10 --connect-to "mitm.it:443:$TUNNEL_DNS:443" "$CA_HTTPS_URL" -o /dev/null 2>&1); then
    check_ok ca-trusted
  else
    check_fail ca-trusted "curl without -k to $CA_HTTPS_URL failed: ${err//$'\n'/ }"
  fi
}

# Report every process's environment as salted digests, for the host to
# compare against its secrets: the host sends only the salt it picked, so
# nothing derived from a secret ever enters the guest (issue 11 point 6).
# One line per distinct value, `env <sha256(salt || value)> <where>`, where
# <where> names at most ENV_WHERE_MAX `pid <pid> variable <name>` places
# (never the value), then `env-end <count>` so the host can tell a report
# that was cut short. One temp file per distinct value (builtin writes, no
# fork), one sha256sum.
readonly ENV_WHERE_MAX=4
report_env() {
  local salt=$1 dir kv name value n=0 hash path i
  local -A index_of=() where=() count=()
  dir=$VERIFY_TMP/env
  mkdir "$dir"
  local p pid
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" != "$$" ] || continue
    while IFS= read -r -d '' kv; do
      [[ $kv == *=* ]] || continue
      name=${kv%%=*}
      value=${kv#*=}
      [ -n "$value" ] || continue
      # Names are printed: keep them to what a variable name may hold.
      [[ $name =~ ^[A-Za-z_][A-Za-z0-9_]{0,127}$ ]] || name='<unprintable>'
      if [ -z "${index_of[$value]+x}" ]; then
        n=$((n + 1))
        index_of[$value]=$n
        printf '%s%s' "$salt" "$value" >"$dir/$n"
      fi
      i=${index_of[$value]}
      count[$i]=$((${count[$i]:-0} + 1))
      if [ "${count[$i]}" -le "$ENV_WHERE_MAX" ]; then
        where[$i]+="pid $pid variable $name, "
      fi
    done 2>/dev/null <"$p/environ" || true
  done
  if [ "$n" -gt 0 ]; then
    while read -r hash path; do
      i=${path##*/}
      local more=''
      [ "${count[$i]}" -le "$ENV_WHERE_MAX" ] || more=" and $((count[$i] - ENV_WHERE_MAX)) more"
      printf 'env %s %s%s\n' "$hash" "${where[$i]%, }" "$more"
    done < <(cd "$dir" && find . -maxdepth 1 -type f -print0 | xargs -0 -r sha256sum --)
  fi
  rm -rf -- "$dir"
  printf 'env-end %s\n' "$n"
}

cmd_verify() {
  local denied_url='' denied_connect_to='' salt=''
  while [ $# -gt 0 ]; do
    case $1 in
      --denied-url) [ $# -ge 2 ] || usage_error "--denied-url needs a value"; denied_url=$2; shift 2 ;;
      --denied-connect-to) [ $# -ge 2 ] || usage_error "--denied-connect-to needs a value"; denied_connect_to=$2; shift 2 ;;
      --salt) [ $# -ge 2 ] || usage_error "--salt needs a value"; salt=$2; shift 2 ;;
      *) usage_error "unknown argument to verify: $1" ;;
    esac
  done
  [[ $salt =~ ^[0-9a-f]{16,64}$ ]] || usage_error "verify needs --salt with 16 to 64 lowercase hex digits"
  if [ -n "$denied_connect_to" ] && [ -z "$denied_url" ]; then
    usage_error "--denied-connect-to needs --denied-url"
  fi
  if [ "$(id -u)" -ne 0 ]; then
    printf 'ppp-provision: verify must run as root\n' >&2
    exit 1
  fi
  set +e
  EP_IP='' EP_PORT=''
  if [ -r "$WG_CONF" ]; then
    parse_endpoint "$WG_CONF" || EP_IP=
  fi
  # tmpfs, root only (umask 077): the env check's files hold salted values.
  if ! VERIFY_TMP=$(mktemp -d /dev/shm/ppp-verify.XXXXXX 2>/dev/null); then
    VERIFY_TMP=$(mktemp -d /run/ppp-verify.XXXXXX) || {
      printf 'ppp-provision: verify cannot make a temp dir\n' >&2
      exit 1
    }
  fi
  TMP=$VERIFY_TMP
  # The checks run at once (a dead tunnel costs each one its timeout) and
  # print in a fixed order, one line each.
  local -a pids=()
  check_handshake >"$VERIFY_TMP/out.1" 2>/dev/null &
  pids+=($!)
  check_no_direct_egress >"$VERIFY_TMP/out.2" 2>/dev/null &
  pids+=($!)
  check_policy_denies "$denied_url" "$denied_connect_to" >"$VERIFY_TMP/out.3" 2>/dev/null &
  pids+=($!)
  check_ca_trusted >"$VERIFY_TMP/out.4" 2>/dev/null &
  pids+=($!)
  report_env "$salt" >"$VERIFY_TMP/out.5" 2>"$VERIFY_TMP/err.5" &
  pids+=($!)
  wait "${pids[@]}"
  local i line names=(handshake no-direct-egress policy-denies ca-trusted)
  for i in 1 2 3 4; do
    line=$(head -n1 "$VERIFY_TMP/out.$i")
    [ -n "$line" ] || line="fail ${names[$((i - 1))]}: the check produced no result"
    printf '%s\n' "$line"
    [[ $line != fail\ * ]] || FAILED=1
  done
  cat -- "$VERIFY_TMP/out.5"
  # Why a report was cut short, for machine.log (ppp logs our stderr).
  head -c 4096 -- "$VERIFY_TMP/err.5" >&2
  exit "$FAILED"
}

main() {
  [ $# -ge 1 ] || usage
  local cmd=$1
  shift
  case $cmd in
    up) cmd_up "$@" ;;
    verify) cmd_verify "$@" ;;
    -h | --help | help) usage 0 ;;
    *) usage_error "unknown command: $cmd" ;;
  esac
}

main "$@"
