//! Files compiled into the binary from `assets/`: the mitmproxy addon that
//! enforces policy and injects secrets inside mitmdump, the script that
//! provisions a sandbox VM, and the agents' Containerfiles. Embedded (also
//! in debug builds) so the installed `ppp` is one file.

/// The `assets/` directory, embedded.
#[derive(rust_embed::Embed)]
#[folder = "assets/"]
struct Assets;

/// The addon's file name inside `assets/`.
pub const ADDON: &str = "addon.py";

/// The provisioning script's file name inside `assets/`.
pub const PROVISION: &str = "provision.sh";

/// An embedded file by its name inside `assets/`.
pub fn get(name: &str) -> Option<Vec<u8>> {
    Assets::get(name).map(|f| f.data.into_owned())
}

/// The guest provisioning script, as `bash provision.sh up|verify` runs it
/// inside the sandbox VM (see docs/provisioning.md for its contract).
pub fn provision() -> Vec<u8> {
    get(PROVISION).unwrap_or_default()
}

/// The mitmproxy addon's source, as `mitmdump -s` loads it.
pub fn addon() -> Vec<u8> {
    // The file is embedded at compile time; a build without it does not compile
    // the test below, so this cannot fail at run time.
    Assets::get(ADDON).map(|f| f.data.into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn addon_is_embedded() {
        let a = super::addon();
        assert!(!a.is_empty());
        let text = std::str::from_utf8(&a).unwrap();
        assert!(text.contains("addons = [PppAddon()]"));
    }

    #[test]
    fn provision_is_embedded() {
        let p = super::provision();
        let text = std::str::from_utf8(&p).unwrap();
        assert!(text.starts_with("#!/usr/bin/env bash\n"));
        assert!(text.contains("cmd_verify"));
    }
}
