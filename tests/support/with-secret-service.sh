#!/bin/sh
# Run a command against a real, unlocked Secret Service (gnome-keyring).
#
# usage: HOME=$(mktemp -d) dbus-run-session -- with-secret-service.sh COMMAND [ARG...]
#
# Must run inside its own D-Bus session (dbus-run-session), with HOME set to
# a fresh empty directory: gnome-keyring keeps its keyring file under
# $HOME/.local/share/keyrings, and an old one would not open with this run's
# password. The script starts gnome-keyring-daemon with only the secrets
# component, unlocks (and so creates) the login keyring with a throwaway
# password, waits until the service answers on the bus, then execs COMMAND.
#
# Why wait: gnome-keyring-daemon forks before it has claimed
# org.freedesktop.secrets, and a client that asks too early either finds no
# service or triggers D-Bus activation of a second, locked daemon (about one
# run in seven without the wait). Waiting is bounded; on timeout the script
# fails with the daemon's output rather than letting the test flake.
#
# Needs: dbus-run-session and dbus-send (Debian: dbus-daemon, dbus-bin) and
# gnome-keyring-daemon (gnome-keyring).
set -eu

die() {
    echo "with-secret-service: $*" >&2
    exit 1
}

[ $# -gt 0 ] || die "usage: with-secret-service.sh COMMAND [ARG...]"
[ -n "${DBUS_SESSION_BUS_ADDRESS:-}" ] ||
    die "no D-Bus session: run me as \`dbus-run-session -- $0 COMMAND...\`"
for tool in gnome-keyring-daemon dbus-send; do
    command -v "$tool" >/dev/null 2>&1 ||
        die "\`$tool\` is not installed (Debian: apt-get install gnome-keyring dbus-daemon dbus-bin)"
done
if [ -z "${HOME:-}" ] || [ ! -d "$HOME" ]; then
    die "HOME must be an existing directory"
fi
# Refuse a HOME that already has keyrings: it is either someone's real home
# or a reused test home whose keyring this run's password cannot open.
[ ! -e "$HOME/.local/share/keyrings" ] ||
    die "\`$HOME\` already has keyrings; give me a fresh temporary HOME"

# gnome-keyring-daemon only listens on its control socket under
# XDG_RUNTIME_DIR; keep it inside the throwaway HOME.
if [ -z "${XDG_RUNTIME_DIR:-}" ] || [ ! -d "$XDG_RUNTIME_DIR" ]; then
    XDG_RUNTIME_DIR="$HOME/.run"
    mkdir -m 700 "$XDG_RUNTIME_DIR"
    export XDG_RUNTIME_DIR
fi

log="$HOME/gnome-keyring.log"
password="ppp-test-$$-$(date +%s)"
# --unlock reads the login keyring's password from stdin, creating the
# keyring on first use. The daemon forks; its output goes to the log.
printf '%s' "$password" |
    gnome-keyring-daemon --unlock --components=secrets >"$log" 2>&1 ||
    die "gnome-keyring-daemon failed: $(cat "$log")"

bus_call() {
    dbus-send --session --print-reply --reply-timeout=2000 "$@" 2>/dev/null
}

# Up to 10 s (200 polls of 50 ms) for each of two conditions:
# 1. org.freedesktop.secrets has an owner. Asked of the bus itself, so the
#    question cannot start a second daemon by activation.
# 2. the default collection exists and is unlocked, so the first write does
#    not end in a prompt that nobody can answer.
wait_for() {
    what=$1
    shift
    i=0
    until "$@"; do
        i=$((i + 1))
        [ "$i" -le 200 ] ||
            die "timed out after 10 s waiting for $what; gnome-keyring said: $(cat "$log")"
        sleep 0.05
    done
}

owned() {
    bus_call --dest=org.freedesktop.DBus /org/freedesktop/DBus \
        org.freedesktop.DBus.NameHasOwner string:org.freedesktop.secrets |
        grep -q 'boolean true'
}

unlocked() {
    bus_call --dest=org.freedesktop.secrets /org/freedesktop/secrets/aliases/default \
        org.freedesktop.DBus.Properties.Get \
        string:org.freedesktop.Secret.Collection string:Locked |
        grep -q 'boolean false'
}

wait_for "org.freedesktop.secrets on the session bus" owned
wait_for "an unlocked default keyring" unlocked

unset password
exec "$@"
