//! Pinned tool versions, read from `versions.env` at build time so the
//! binary, the scripts and the dev container share one source of truth.

const FILE: &str = include_str!("../versions.env");

/// The value of `key` in `versions.env`.
pub fn get(key: &str) -> Option<&'static str> {
    FILE.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// A key that must exist; its absence is a build mistake caught by tests.
fn required(key: &str) -> &'static str {
    get(key).unwrap_or_else(|| panic!("versions.env lacks {key}"))
}

/// The mitmproxy release ppp runs.
pub fn mitmproxy() -> &'static str {
    required("MITMPROXY_VERSION")
}

/// The oldest Python mitmproxy accepts, e.g. `3.12`.
pub fn python_min() -> &'static str {
    required("PYTHON_MIN_VERSION")
}

/// The podman release ppp was checked against.
pub fn podman_tested() -> &'static str {
    required("PODMAN_TESTED_VERSION")
}

/// The git revision ppp was built from (`git rev-parse --short HEAD`), or
/// `unknown`; set by `build.rs`.
pub const GIT_REVISION: &str = env!("PPP_GIT_REVISION");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_present() {
        assert_eq!(mitmproxy(), "12.2.3");
        assert_eq!(python_min(), "3.12");
        assert!(podman_tested().starts_with(char::is_numeric));
        // Issue 24: images pinned here were never published, and every
        // first run failed. ppp builds its agents' images from the embedded
        // Containerfiles; an image pinned here again must come with a
        // release check that it exists (docs/setup.md, "Agent images").
        for agent in ["opencode", "claude", "codex", "gemini"] {
            assert_eq!(get(&format!("{}_IMAGE", agent.to_ascii_uppercase())), None, "{agent}");
        }
    }
}
