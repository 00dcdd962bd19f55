#!/usr/bin/python3
"""Apply podman's Ignition config (spec 3.x) on the ppp test guest.

Test-only (tests/vm/build-image.sh bakes it into the guest image): the Fedora
CoreOS image that normally does this cannot be downloaded on the test
machines, so a Debian guest plays it. It covers what podman 5.4's
pkg/machine/ignition writes: passwd.users (with ssh keys), storage.directories,
storage.files (data: URLs), storage.links and systemd.units (contents, dropins,
enabled, mask). Anything else is logged and ignored, so a new field shows up in
the console log instead of silently breaking the boot.
"""

import base64
import gzip
import json
import os
import pwd
import grp
import subprocess
import sys
import urllib.parse

FW_CFG = "/sys/firmware/qemu_fw_cfg/by_name/opt/com.coreos/config/raw"
DONE = "/var/lib/ppp-ignition.done"


def log(msg):
    print(f"ppp-ignition: {msg}", flush=True)


def run(*argv):
    subprocess.run(argv, check=True)


def data_url(source, compression=None):
    if not source:
        return b""
    if not source.startswith("data:"):
        raise ValueError(f"only data: URLs are supported, not {source[:40]!r}")
    meta, _, payload = source[5:].partition(",")
    if meta.endswith(";base64"):
        raw = base64.b64decode(payload)
    else:
        raw = urllib.parse.unquote_to_bytes(payload)
    if compression == "gzip":
        raw = gzip.decompress(raw)
    return raw


def ids(node):
    uid = gid = 0
    user, group = node.get("user") or {}, node.get("group") or {}
    if user.get("id") is not None:
        uid = user["id"]
    elif user.get("name"):
        uid = pwd.getpwnam(user["name"]).pw_uid
    if group.get("id") is not None:
        gid = group["id"]
    elif group.get("name"):
        gid = grp.getgrnam(group["name"]).gr_gid
    elif user:
        gid = pwd.getpwuid(uid).pw_gid
    return uid, gid


def users(cfg):
    for u in cfg.get("passwd", {}).get("users", []):
        name = u["name"]
        if u.get("shouldExist") is False:
            continue
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            argv = ["useradd", "-m", "-s", "/bin/bash", "-U"]
            if u.get("uid") is not None:
                argv += ["-u", str(u["uid"])]
            run(*argv, name)
            pw = pwd.getpwnam(name)
        for g in u.get("groups") or []:
            subprocess.run(["usermod", "-aG", g, name], check=False)
        keys = u.get("sshAuthorizedKeys") or []
        if keys:
            ssh = os.path.join(pw.pw_dir, ".ssh")
            os.makedirs(ssh, mode=0o700, exist_ok=True)
            path = os.path.join(ssh, "authorized_keys")
            with open(path, "a", encoding="utf-8") as f:
                f.write("".join(k.strip() + "\n" for k in keys))
            for p in (ssh, path):
                os.chown(p, pw.pw_uid, pw.pw_gid)
            os.chmod(path, 0o600)
        log(f"user {name} uid {pw.pw_uid}, {len(keys)} key(s)")


def make_parents(path):
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)


def storage(cfg):
    st = cfg.get("storage", {})
    for d in st.get("directories", []):
        os.makedirs(d["path"], exist_ok=True)
        os.chmod(d["path"], d.get("mode") or 0o755)
        os.chown(d["path"], *ids(d))
    for f in st.get("files", []):
        path = f["path"]
        make_parents(path)
        contents = f.get("contents") or {}
        body = data_url(contents.get("source"), contents.get("compression"))
        if os.path.exists(path) and f.get("overwrite") is False:
            log(f"keeping existing {path}")
        else:
            with open(path, "wb") as out:
                out.write(body)
        for extra in f.get("append") or []:
            with open(path, "ab") as out:
                out.write(data_url(extra.get("source"), extra.get("compression")))
        os.chmod(path, f.get("mode") or 0o644)
        os.chown(path, *ids(f))
    for link in st.get("links", []):
        path = link["path"]
        make_parents(path)
        if os.path.lexists(path):
            os.remove(path)
        if link.get("hard"):
            os.link(link["target"], path)
        else:
            os.symlink(link["target"], path)
        os.lchown(path, *ids(link))
    for key in st:
        if key not in ("directories", "files", "links"):
            log(f"ignoring storage.{key}")


def units(cfg):
    enable, disable, mask = [], [], []
    for u in cfg.get("systemd", {}).get("units", []):
        name = u["name"]
        if u.get("contents") is not None:
            with open(f"/etc/systemd/system/{name}", "w", encoding="utf-8") as f:
                f.write(u["contents"])
        for d in u.get("dropins") or []:
            dropdir = f"/etc/systemd/system/{name}.d"
            os.makedirs(dropdir, exist_ok=True)
            with open(os.path.join(dropdir, d["name"]), "w", encoding="utf-8") as f:
                f.write(d.get("contents") or "")
        if u.get("mask"):
            mask.append(name)
        elif u.get("enabled") is True:
            enable.append(name)
        elif u.get("enabled") is False:
            disable.append(name)
    run("systemctl", "daemon-reload")
    for name in mask:
        run("systemctl", "mask", name)
    for name in disable:
        # zincati.service (FCOS's updater) does not exist here.
        subprocess.run(["systemctl", "disable", name], check=False, capture_output=True)
    for name in enable:
        run("systemctl", "enable", name)
    # The boot transaction was computed before these units existed: queue them.
    for name in enable:
        run("systemctl", "start", "--no-block", name)
    log(f"units enabled: {' '.join(enable) or '-'}; masked: {' '.join(mask) or '-'}")


def main():
    subprocess.run(["modprobe", "qemu_fw_cfg"], check=False)
    if not os.path.exists(FW_CFG):
        log(f"no Ignition config at {FW_CFG}")
        return 1
    with open(FW_CFG, "rb") as f:
        cfg = json.load(f)
    log(f"ignition version {cfg.get('ignition', {}).get('version')}")
    users(cfg)
    storage(cfg)
    units(cfg)
    with open(DONE, "w", encoding="utf-8") as f:
        f.write("applied\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
