//! WireGuard client configs: capturing the ones mitmdump prints, keeping
//! them in `wg/client-confs.json`, and rendering a sandbox's `wg0.conf`.
//!
//! mitmdump prints one config per WireGuard server on stdout, fenced by a
//! line of 60 hyphens, in no particular order (spec A.3). A block is keyed by
//! the port on its own `Endpoint` line, never by the order of `--mode` flags.
//! This module only parses and renders text; it never starts anything.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use anyhow::{Context, Result};
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::dirs::Dirs;
use crate::state;

/// The fence around a client config block.
pub const FENCE: &str = "------------------------------------------------------------";

/// The address under which a Podman Machine guest reaches the host (gvproxy's
/// host alias). The LAN address silently drops handshakes (spec A.2). The
/// daemon renders every wg0.conf with it; provisioning puts the machine's
/// own endpoint host in (`proxy::endpoint`).
pub const PODMAN_HOST_ALIAS: &str = super::endpoint::GVPROXY_HOST_ALIAS;

/// A block longer than this is a stray fence swallowing log lines, not a
/// config (a real one has 9 lines).
pub const MAX_BLOCK_LINES: usize = 32;

/// One client config as mitmdump printed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientConf {
    /// `[Interface] PrivateKey`: the guest's key. It must reach wg0.conf,
    /// or wg-quick invents one and the server rejects the handshake (A.2).
    pub private_key: String,
    /// `[Interface] Address`, e.g. `10.0.0.1/32`.
    pub address: String,
    /// `[Interface] DNS`, if printed. Never written to wg0.conf (A.4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<String>,
    /// `[Peer] PublicKey`: the server's key.
    pub public_key: String,
    /// `[Peer] AllowedIPs`.
    pub allowed_ips: String,
    /// `[Peer] Endpoint`, `host:port` as printed.
    pub endpoint: String,
}

impl ClientConf {
    /// The port on the `Endpoint` line: the server this block belongs to.
    pub fn port(&self) -> Option<u16> {
        self.endpoint.rsplit_once(':').and_then(|(_, p)| p.trim().parse().ok())
    }
}

/// Every well-formed client config block in `log`, keyed by its endpoint
/// port. A later block for a port wins: mitmdump restarted and printed the
/// current one. Partial or garbled blocks are skipped.
pub fn parse(log: &str) -> BTreeMap<u16, ClientConf> {
    let mut found = BTreeMap::new();
    // Lines of the block being read; `None` outside a block.
    let mut block: Option<Vec<&str>> = None;
    for raw in log.lines() {
        let line = raw.trim_end_matches('\r').trim_end();
        let fence = fence_kind(line);
        match (&mut block, fence) {
            // A prefixed fence always opens: whatever was open was cut short.
            (_, Some(Fence::Opening)) | (None, Some(Fence::Bare)) => block = Some(Vec::new()),
            (Some(lines), Some(Fence::Bare)) => {
                // A block with no section yet means the previous fence was a
                // stray one (a closing fence seen out of sync). Treat this
                // fence as the real opening so one glitch cannot shift every
                // later block.
                if lines.iter().any(|l| l.trim().starts_with('[') && l.trim().ends_with(']')) {
                    if let Some(conf) = parse_block(lines)
                        && let Some(port) = conf.port()
                    {
                        found.insert(port, conf);
                    }
                    block = None;
                } else {
                    lines.clear();
                }
            }
            (Some(lines), None) => {
                lines.push(line);
                if lines.len() > MAX_BLOCK_LINES {
                    block = None;
                }
            }
            (None, None) => {}
        }
    }
    found
}

enum Fence {
    /// `[HH:MM:SS.mmm] ----…`: only an opening fence carries a timestamp.
    Opening,
    /// A bare fence: closing, or an opening without a timestamp.
    Bare,
}

fn fence_kind(line: &str) -> Option<Fence> {
    if line == FENCE {
        return Some(Fence::Bare);
    }
    let rest = line.strip_suffix(FENCE)?.strip_suffix(' ')?;
    let stamp = rest.strip_prefix('[')?.strip_suffix(']')?;
    let b = stamp.as_bytes();
    let shape = b.len() == 12
        && b.iter().enumerate().all(|(i, c)| match i {
            2 | 5 => *c == b':',
            8 => *c == b'.',
            _ => c.is_ascii_digit(),
        });
    shape.then_some(Fence::Opening)
}

/// Parse the INI lines of one block. Section and key names compare without
/// case, like wg(8) does; lines that are neither are ignored (a log line
/// that slipped in), but every required field must be there and keys must
/// be real WireGuard keys.
fn parse_block(lines: &[&str]) -> Option<ClientConf> {
    #[derive(PartialEq)]
    enum Section {
        None,
        Interface,
        Peer,
        Other,
    }
    let mut section = Section::None;
    let mut fields: BTreeMap<(bool, String), String> = BTreeMap::new();
    for line in lines {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = match name.trim().to_ascii_lowercase().as_str() {
                "interface" => Section::Interface,
                "peer" => Section::Peer,
                _ => Section::Other,
            };
            continue;
        }
        let Some((k, v)) = line.split_once('=') else { continue };
        let peer = match section {
            Section::Interface => false,
            Section::Peer => true,
            Section::None | Section::Other => continue,
        };
        fields.insert((peer, k.trim().to_ascii_lowercase()), v.trim().to_owned());
    }
    let mut take = |peer: bool, k: &str| fields.remove(&(peer, k.to_owned())).filter(|v| !v.is_empty());
    let conf = ClientConf {
        private_key: take(false, "privatekey")?,
        address: take(false, "address")?,
        dns: take(false, "dns"),
        public_key: take(true, "publickey")?,
        allowed_ips: take(true, "allowedips")?,
        endpoint: take(true, "endpoint")?,
    };
    (is_key(&conf.private_key) && is_key(&conf.public_key) && conf.port().is_some()).then_some(conf)
}

/// A WireGuard key: base64 of exactly 32 bytes.
fn is_key(s: &str) -> bool {
    base64::engine::general_purpose::STANDARD.decode(s).is_ok_and(|b| b.len() == 32)
}

/// The guest's private key in a key file mitmdump wrote (`{"server_key":
/// …, "client_key": …}`), or `None` while it is missing or unreadable. A
/// printed config is used only when its `PrivateKey` is this: the port's
/// current keys, never a former claim's still in the log.
pub fn client_key_of(key_file: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(key_file).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("client_key")?.as_str().filter(|k| is_key(k)).map(ToOwned::to_owned)
}

/// Save the captured configs to `wg/client-confs.json` (atomic, 0600: they
/// hold the guests' private keys).
pub fn save(dirs: &Dirs, confs: &BTreeMap<u16, ClientConf>) -> Result<()> {
    state::write_json(&dirs.wg_client_confs(), confs)
}

/// The configs saved by [`save`]; empty when none were saved yet.
pub fn load(dirs: &Dirs) -> Result<BTreeMap<u16, ClientConf>> {
    let path = dirs.wg_client_confs();
    match state::read_optional(&path)? {
        None => Ok(BTreeMap::new()),
        Some(text) => serde_json::from_str(&text).with_context(|| format!("`{}` is not valid", path.display())),
    }
}

/// The guest's `wg0.conf` for the server on `port`.
///
/// - `Address` is the sandbox's own inner address, not the `10.0.0.1` every
///   server prints.
/// - `Endpoint` is `endpoint_host` (normally [`PODMAN_HOST_ALIAS`]).
/// - `Table = off`: provisioning adds the off-tunnel /32 route first and the
///   default route itself, which avoids the routing loop (A.2).
/// - No `DNS =` line: it makes wg-quick run resolvconf, which aborts on
///   Fedora CoreOS (A.4).
pub fn render_wg0(conf: &ClientConf, inner_ip: Ipv4Addr, endpoint_host: &str, port: u16) -> String {
    let host = if endpoint_host.contains(':') && !endpoint_host.starts_with('[') {
        format!("[{endpoint_host}]")
    } else {
        endpoint_host.to_owned()
    };
    let mut out = String::new();
    let _ = writeln!(out, "[Interface]");
    let _ = writeln!(out, "PrivateKey = {}", conf.private_key);
    let _ = writeln!(out, "Address = {inner_ip}/32");
    let _ = writeln!(out, "Table = off");
    let _ = writeln!(out);
    let _ = writeln!(out, "[Peer]");
    let _ = writeln!(out, "PublicKey = {}", conf.public_key);
    let _ = writeln!(out, "AllowedIPs = 0.0.0.0/0");
    let _ = writeln!(out, "Endpoint = {host}:{port}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A distinct valid key per seed.
    fn key(seed: u8) -> String {
        base64::engine::general_purpose::STANDARD.encode([seed; 32])
    }

    fn block(port: u16, seed: u8, stamp: bool) -> String {
        let prefix = if stamp { "[11:37:42.593] " } else { "" };
        format!(
            "{prefix}{FENCE}\n[Interface]\nPrivateKey = {}\nAddress = 10.0.0.1/32\nDNS = 10.0.0.53\n\n[Peer]\n\
             PublicKey = {}\nAllowedIPs = 0.0.0.0/0\nEndpoint = 192.0.2.2:{port}\n{FENCE}\n",
            key(seed),
            key(seed.wrapping_add(100)),
        )
    }

    #[test]
    fn blocks_in_any_order_keyed_by_endpoint() {
        let log = format!(
            "[11:37:42.100] HTTP(S) proxy listening\n{}[11:37:42.600] WireGuard server listening at *:51822\n{}{}",
            block(51822, 3, true),
            block(51820, 1, true),
            block(51821, 2, false),
        );
        let confs = parse(&log);
        assert_eq!(confs.keys().copied().collect::<Vec<_>>(), [51820, 51821, 51822]);
        let c = &confs[&51821];
        assert_eq!(c.private_key, key(2));
        assert_eq!(c.public_key, key(102));
        assert_eq!(c.address, "10.0.0.1/32");
        assert_eq!(c.dns.as_deref(), Some("10.0.0.53"));
        assert_eq!(c.allowed_ips, "0.0.0.0/0");
        assert_eq!(c.endpoint, "192.0.2.2:51821");
    }

    #[test]
    fn crlf_and_odd_spacing_and_case() {
        let log = format!(
            "[00:00:00.000] {FENCE}\r\n[interface]\r\n  privatekey=  {}\r\nADDRESS = 10.0.0.1/32\r\n[Peer]\r\n\
             PublicKey ={}\r\nAllowedIPs = 0.0.0.0/0\r\nEndpoint = 192.0.2.2:51830 \r\n{FENCE}\r\n",
            key(7),
            key(8)
        );
        let confs = parse(&log);
        assert_eq!(confs[&51830].private_key, key(7));
        assert_eq!(confs[&51830].dns, None);
    }

    #[test]
    fn later_block_for_a_port_wins() {
        let log = format!("{}{}", block(51820, 1, true), block(51820, 9, true));
        assert_eq!(parse(&log)[&51820].private_key, key(9));
    }

    #[test]
    fn truncated_and_garbage_blocks_are_skipped() {
        let full = block(51821, 2, true);
        let cut: String = block(51820, 1, true).lines().take(5).flat_map(|l| [l, "\n"]).collect();
        // Cut short, then the next block opens with a timestamped fence.
        assert_eq!(parse(&format!("{cut}{full}")).keys().copied().collect::<Vec<_>>(), [51821]);
        // Cut short at the end of the log.
        assert_eq!(parse(&format!("{full}{cut}")).keys().copied().collect::<Vec<_>>(), [51821]);
        // A bad key, a missing field, a bad port.
        let bad_key = block(51822, 3, true).replace(&key(3), "not-a-key");
        let no_peer_key = block(51823, 4, true).replace(&format!("PublicKey = {}\n", key(104)), "");
        let bad_port = block(51824, 5, true).replace(":51824", ":99999");
        let confs = parse(&format!("{bad_key}{no_peer_key}{bad_port}{full}"));
        assert_eq!(confs.keys().copied().collect::<Vec<_>>(), [51821]);
        // Not fences: 59 or 61 hyphens, a timestamp of the wrong shape.
        assert!(parse(&block(51820, 1, false).replace(FENCE, &FENCE[1..])).is_empty());
        assert!(parse(&block(51820, 1, false).replace(FENCE, &format!("{FENCE}-"))).is_empty());
        assert!(fence_kind(&format!("[1:37:42.593] {FENCE}")).is_none());
        assert!(parse("").is_empty());
    }

    #[test]
    fn a_stray_fence_does_not_shift_later_blocks() {
        // A closing fence with no opening one, then log lines, then bare-fenced blocks.
        let log = format!("{FENCE}\nsome log line\n{}{}", block(51820, 1, false), block(51821, 2, false));
        assert_eq!(parse(&log).keys().copied().collect::<Vec<_>>(), [51820, 51821]);
    }

    #[test]
    fn log_lines_inside_a_block_are_ignored() {
        let log = block(51820, 1, true).replace("[Peer]\n", "[Peer]\n[11:37:42.700] client connected\n");
        assert_eq!(parse(&log)[&51820].endpoint, "192.0.2.2:51820");
    }

    #[test]
    fn save_and_load_round_trip() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dirs = Dirs { config: tmp.path().join("c"), data: tmp.path().to_owned(), cache: tmp.path().join("k") };
        assert!(load(&dirs).unwrap().is_empty());
        let confs = parse(&format!("{}{}", block(51821, 2, true), block(51820, 1, true)));
        save(&dirs, &confs).unwrap();
        assert_eq!(load(&dirs).unwrap(), confs);
        let mode = std::fs::metadata(dirs.wg_client_confs()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn wg0_rendering() {
        let conf = parse(&block(51822, 3, true)).remove(&51822).unwrap();
        let text = render_wg0(&conf, crate::sandbox::inner_ip(51822), PODMAN_HOST_ALIAS, 51822);
        insta::assert_snapshot!(text, @r"
        [Interface]
        PrivateKey = AwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwMDAwM=
        Address = 10.0.0.4/32
        Table = off

        [Peer]
        PublicKey = Z2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2dnZ2c=
        AllowedIPs = 0.0.0.0/0
        Endpoint = 192.168.127.254:51822
        ");
        // What the renderer writes must parse back to the same keys.
        let back = parse(&format!("{FENCE}\n{text}{FENCE}\n"));
        assert_eq!(back[&51822].private_key, conf.private_key);
        assert_eq!(back[&51822].public_key, conf.public_key);
        assert!(render_wg0(&conf, Ipv4Addr::new(10, 0, 0, 1), "fd00::1", 51820).contains("Endpoint = [fd00::1]:51820"));
    }

    proptest! {
        #[test]
        fn recovers_every_port_in_any_order(
            ports in prop::collection::btree_set(crate::sandbox::POOL_START..=crate::sandbox::POOL_END, 1..12),
            shuffle in any::<prop::sample::Index>(),
            noise in prop::collection::vec("[ -~]{0,40}", 0..12),
            stamps in any::<u16>(),
            crlf in any::<bool>(),
        ) {
            let mut blocks: Vec<(u16, String)> = ports
                .iter()
                .enumerate()
                .map(|(i, &p)| (p, block(p, u8::try_from(i).unwrap(), stamps & (1 << (i % 16)) != 0)))
                .collect();
            // Rotate then reverse halves: an order unrelated to the ports.
            let k = shuffle.index(blocks.len());
            blocks.rotate_left(k);
            if k % 2 == 1 {
                blocks.reverse();
            }
            let mut log = String::new();
            for (i, (_, b)) in blocks.iter().enumerate() {
                if let Some(n) = noise.get(i) {
                    // Noise between blocks, never itself a fence.
                    let _ = writeln!(log, "[11:00:00.000] {}", n.replace('-', "_"));
                }
                log.push_str(b);
            }
            if crlf {
                log = log.replace('\n', "\r\n");
            }
            let confs = parse(&log);
            prop_assert_eq!(confs.keys().copied().collect::<Vec<_>>(), ports.iter().copied().collect::<Vec<_>>());
            for (i, p) in ports.iter().enumerate() {
                prop_assert_eq!(&confs[p].private_key, &key(u8::try_from(i).unwrap()));
            }
        }
    }
}
