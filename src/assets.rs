//! Files compiled into the binary from `assets/`: the mitmproxy addon that
//! enforces policy and injects secrets inside mitmdump, the script that
//! provisions a sandbox VM, and the agents' Containerfiles. Embedded (also
//! in debug builds) so the installed `ppp` is one file.

/// The `assets/` directory, embedded.
#[derive(rust_embed::Embed)]
#[folder = "assets/"]
struct Assets;

/// The addon's directory inside `assets/`: a package (`ppp_addon/`) and
/// the one entry file `mitmdump -s` loads.
pub const ADDON_DIR: &str = "addon/";

/// The addon's entry file, relative to [`ADDON_DIR`].
pub const ADDON_ENTRY: &str = "addon.py";

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

/// The mitmproxy addon's files, written out whole before `mitmdump -s`
/// loads its entry file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addon {
    /// (path relative to the addon's directory, bytes), sorted by path:
    /// the entry file [`ADDON_ENTRY`] and the package beside it.
    pub files: Vec<(String, Vec<u8>)>,
}

impl Addon {
    /// An addon of just these files (tests: an entry file that does nothing).
    pub fn from_files<'a>(files: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> Self {
        let mut files: Vec<_> = files.into_iter().map(|(p, b)| (p.to_owned(), b.to_vec())).collect();
        files.sort();
        Self { files }
    }
}

/// The embedded addon: every `.py` file under `assets/addon/`. Bytecode a
/// Python run left in the source tree (`__pycache__`) is not the addon's.
pub fn addon() -> Addon {
    let mut files: Vec<(String, Vec<u8>)> = Assets::iter()
        .filter_map(|name| {
            let rel = name.strip_prefix(ADDON_DIR)?;
            // Python imports only `.py` (in that case) as source.
            let is_source = std::path::Path::new(rel).extension().is_some_and(|e| e == "py")
                && !rel.split('/').any(|part| part == "__pycache__");
            is_source.then(|| (rel.to_owned(), get(&name).unwrap_or_default()))
        })
        .collect();
    files.sort();
    Addon { files }
}

#[cfg(test)]
mod tests {
    #[test]
    fn addon_is_embedded() {
        let a = super::addon();
        let file = |p: &str| {
            let (_, bytes) = a.files.iter().find(|(n, _)| n == p).unwrap_or_else(|| panic!("{p} is not embedded"));
            String::from_utf8(bytes.clone()).unwrap()
        };
        assert!(file(super::ADDON_ENTRY).contains("addons = [PppAddon()]"));
        // The package the entry file loads, one module per concern.
        for m in ["__init__", "decisions", "inject", "scrubber", "dns_guard", "limits", "scheduler", "holds", "flowlog"]
        {
            assert!(!file(&format!("ppp_addon/{m}.py")).is_empty());
        }
        let py = |n: &str| std::path::Path::new(n).extension().is_some_and(|e| e == "py");
        assert!(a.files.iter().all(|(n, _)| py(n) && !n.contains("__pycache__")), "{:?}", a.files);
        assert!(a.files.windows(2).all(|w| w[0].0 < w[1].0), "sorted");
    }

    #[test]
    fn provision_is_embedded() {
        let p = super::provision();
        let text = std::str::from_utf8(&p).unwrap();
        assert!(text.starts_with("#!/usr/bin/env bash\n"));
        assert!(text.contains("cmd_verify"));
    }
}
