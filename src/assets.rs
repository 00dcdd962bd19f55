//! Files compiled into the binary from `assets/`: the mitmproxy addon that
//! enforces policy and injects secrets inside mitmdump. Embedded (also in
//! debug builds) so the installed `ppp` is one file; the proxy supervisor
//! writes the addon out content-addressed before starting mitmdump.

/// The `assets/` directory, embedded.
#[derive(rust_embed::Embed)]
#[folder = "assets/"]
struct Assets;

/// The addon's file name inside `assets/`.
pub const ADDON: &str = "addon.py";

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
}
