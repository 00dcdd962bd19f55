//! Files embedded in the binary: the mitmproxy addon and the guest
//! provisioning script.

/// The embedded `assets/` directory.
#[derive(rust_embed::Embed)]
#[folder = "assets/"]
struct Assets;

/// The mitmproxy addon's source.
pub fn addon() -> Vec<u8> {
    Assets::get("addon.py").expect("assets/addon.py is embedded").data.into_owned()
}
