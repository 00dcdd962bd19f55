//! Every environment variable ppp reads, as a documented constant, so the
//! full list is greppable and `ppp diagnose` can report them.

/// Overrides the config root (default `$XDG_CONFIG_HOME/ppp`).
pub const PPP_CONFIG: &str = "PPP_CONFIG";
/// Overrides the data root (default `$XDG_DATA_HOME/ppp`).
pub const PPP_DATA: &str = "PPP_DATA";
/// Overrides the cache root (default `$XDG_CACHE_HOME/ppp`).
pub const PPP_CACHE: &str = "PPP_CACHE";
/// Path of the `podman` binary to use instead of the one on PATH.
pub const PPP_PODMAN: &str = "PPP_PODMAN";
/// Path of the `mitmdump` binary to use instead of ppp's own venv.
pub const PPP_MITMDUMP: &str = "PPP_MITMDUMP";
/// Path of the Python (>= 3.12) used to build ppp's mitmproxy venv.
pub const PPP_PYTHON: &str = "PPP_PYTHON";
/// PEM bundle mitmproxy verifies upstream servers against.
pub const PPP_UPSTREAM_CA: &str = "PPP_UPSTREAM_CA";
/// Directory of the host's CA trust anchors that `ppp setup` copies
/// mitmproxy's CA into (default: the distro's, `/etc/pki/ca-trust/source/anchors`
/// on Fedora, else `/usr/local/share/ca-certificates`).
pub const PPP_CA_ANCHORS: &str = "PPP_CA_ANCHORS";
/// pyenv's root (default `~/.pyenv`), searched for a Python to build the
/// mitmproxy venv with.
pub const PYENV_ROOT: &str = "PYENV_ROOT";
/// Forces the secret backend: `keychain` or `file`.
pub const PPP_SECRET_BACKEND: &str = "PPP_SECRET_BACKEND";
/// Path of the age identity for the file secret store.
pub const PPP_AGE_IDENTITY: &str = "PPP_AGE_IDENTITY";
/// Log filter for ppp's own diagnostics (tracing `EnvFilter` syntax).
pub const PPP_LOG: &str = "PPP_LOG";
/// Seconds `ppp diagnose` waits for each external probe (podman, mitmdump,
/// Python, the keychain) before reporting it as timed out; default 10.
pub const PPP_PROBE_TIMEOUT: &str = "PPP_PROBE_TIMEOUT";
/// The conventional Rust log filter, honoured when `PPP_LOG` is unset.
pub const RUST_LOG: &str = "RUST_LOG";
/// Disables colour when set to anything (<https://no-color.org>).
pub const NO_COLOR: &str = "NO_COLOR";

/// The address a guest's WireGuard client sends to (the host as the VM sees
/// it); wins over `wireguard.endpoint_host` in config.yaml and the
/// provider's default, gvproxy's `192.168.127.254`.
pub const PPP_ENDPOINT_HOST: &str = "PPP_ENDPOINT_HOST";

/// All variables above, for `ppp diagnose`.
pub const ALL: &[&str] = &[
    PPP_CONFIG,
    PPP_DATA,
    PPP_CACHE,
    PPP_PODMAN,
    PPP_MITMDUMP,
    PPP_PYTHON,
    PPP_UPSTREAM_CA,
    PPP_CA_ANCHORS,
    PYENV_ROOT,
    PPP_SECRET_BACKEND,
    PPP_AGE_IDENTITY,
    PPP_LOG,
    PPP_PROBE_TIMEOUT,
    PPP_ENDPOINT_HOST,
    RUST_LOG,
    NO_COLOR,
];
