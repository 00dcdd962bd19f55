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

    /// The addon's host → service table mirrors the built-in services, so a
    /// host added in `services.rs` is not silently left without its key.
    #[test]
    fn addon_knows_every_builtin_service_host() {
        let a = super::addon();
        let text = std::str::from_utf8(&a).unwrap();
        let start = text.find("SERVICE_HOSTS: dict[str, str] = {").expect("SERVICE_HOSTS");
        let table = &text[start..start + text[start..].find("\n}").unwrap()];
        let mut n = 0;
        for s in crate::secret::services::all() {
            for h in s.hosts {
                let entry = format!("\"{h}\": \"{}\",", s.name);
                assert!(table.contains(&entry), "assets/addon.py SERVICE_HOSTS lacks {entry}");
                n += 1;
            }
        }
        assert_eq!(table.lines().count() - 1, n, "SERVICE_HOSTS has hosts services.rs does not:\n{table}");
    }
}
