//! Kits as OCI artifacts: `ppp kit push` and `ppp kit pull` (ADR 0014,
//! docs/kits-oci.md).
//!
//! A kit travels as an OCI 1.1 artifact: an image manifest whose
//! `artifactType` is [`ARTIFACT_TYPE`], whose config is the empty descriptor
//! ([`EMPTY_CONFIG_MEDIA_TYPE`], content `{}`), and whose single layer is the
//! packed kit zip ([`LAYER_MEDIA_TYPE`]). The registry protocol, Basic and
//! Bearer-token auth are `oci-client`'s; this module picks the media types,
//! the credentials (from ppp's secret store, `ppp.registry.<host>`), plain
//! HTTP for loopback registries only, and checks the layer's sha256 before
//! anything is written.
//!
//! It never prints and never puts a credential in an error: callers print.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{OciImageManifest, OciManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest as _, Sha256};

use crate::error::fail;
use crate::secret::Value;

/// The manifest's `artifactType`: this is a ppp kit, format version 1.
pub const ARTIFACT_TYPE: &str = "application/vnd.ppp.kit.v1";
/// The one layer: the kit directory packed as a zip (`ppp kit pack`).
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.ppp.kit.v1+zip";
/// The config: OCI 1.1's empty descriptor, as the artifact guidance asks
/// when an artifact has no config of its own.
pub const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// The empty descriptor's content.
const EMPTY_CONFIG: &[u8] = b"{}";
/// The manifest media type pushed and accepted.
const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// A parsed kit reference such as `registry.example.com/kits/tools:0.1.0`.
#[derive(Debug, Clone)]
pub struct Target {
    reference: Reference,
    text: String,
}

impl Target {
    /// Parse `text`. A reference must name its registry (no Docker Hub
    /// default) and a tag or a digest.
    pub fn parse(text: &str) -> Result<Target> {
        let bad = |why: &str| {
            fail(format!("`{text}` is not a kit reference: {why}"))
                .hint("write `REGISTRY/REPOSITORY:TAG`, such as `registry.example.com/kits/tools:0.1.0`")
                .code(2)
        };
        let first = text.split('/').next().unwrap_or_default();
        // Without this, `kits/tools:1` would silently mean Docker Hub.
        if !text.contains('/') || !(first.contains('.') || first.contains(':') || first == "localhost") {
            return Err(bad("it names no registry").into());
        }
        let reference: Reference = text.parse().map_err(|e| bad(&format!("{e}")))?;
        let last = text.rsplit('/').next().unwrap_or_default();
        if reference.digest().is_none() && !last.contains(':') {
            return Err(bad("it has no tag").into());
        }
        Ok(Target { reference, text: text.to_owned() })
    }

    /// The registry as `host[:port]`: the name credentials are stored under.
    pub fn registry(&self) -> &str {
        self.reference.resolve_registry()
    }

    /// The reference as the user wrote it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The file `ppp kit pull` writes by default: `<repo-name>-<tag>.zip`,
    /// or `<repo-name>-<first 12 hex of the digest>.zip` for a digest.
    pub fn default_file_name(&self) -> PathBuf {
        let repo = self.reference.repository().rsplit('/').next().unwrap_or("kit");
        let version = match (self.reference.tag(), self.reference.digest()) {
            (Some(tag), _) => tag.to_owned(),
            (None, Some(d)) => d.trim_start_matches("sha256:").chars().take(12).collect(),
            (None, None) => "latest".to_owned(),
        };
        PathBuf::from(format!("{repo}-{version}.zip"))
    }

    /// Whether the registry is on loopback, where plain HTTP is allowed
    /// (Docker's insecure-registry default makes the same exception).
    pub fn is_loopback(&self) -> bool {
        is_loopback(self.registry())
    }
}

/// Whether `registry` (`host[:port]`) is `localhost` or a loopback address.
pub fn is_loopback(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => registry.rsplit_once(':').map_or(registry, |(h, _)| h),
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// What a push stored.
#[derive(Debug, Clone)]
pub struct Pushed {
    /// `sha256:…` of the kit zip layer.
    pub layer_digest: String,
    /// The manifest's URL as the registry returned it.
    pub manifest_url: String,
}

/// What a pull fetched, already checked against the manifest.
#[derive(Debug)]
pub struct Pulled {
    /// The kit zip.
    pub zip: Vec<u8>,
    /// `sha256:…` of the zip, equal to the manifest's layer digest.
    pub layer_digest: String,
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in hash {
        use std::fmt::Write as _;
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Turn stored credentials into what the client sends: `user:password` is
/// HTTP Basic (exchanged for a token where the registry asks for one),
/// anything else is used as a bearer token.
fn auth(credentials: Option<&Value>) -> RegistryAuth {
    match credentials.map(Value::expose) {
        None => RegistryAuth::Anonymous,
        Some(text) => match text.split_once(':') {
            Some((user, password)) => RegistryAuth::Basic(user.to_owned(), password.to_owned()),
            None => RegistryAuth::Bearer(text.to_owned()),
        },
    }
}

fn client(target: &Target) -> Client {
    // reqwest is built without a default provider (ADR 0014); an `Err` means
    // one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let protocol = if target.is_loopback() {
        ClientProtocol::HttpsExcept(vec![target.registry().to_owned()])
    } else {
        ClientProtocol::Https
    };
    Client::new(ClientConfig {
        protocol,
        use_monolithic_push: true,
        connect_timeout: Some(std::time::Duration::from_secs(15)),
        read_timeout: Some(std::time::Duration::from_secs(120)),
        ..ClientConfig::default()
    })
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().context("could not start the async runtime")
}

/// The manifest ppp pushes for `zip`.
pub fn manifest(zip: &[u8]) -> OciImageManifest {
    let layer = ImageLayer::new(zip.to_vec(), LAYER_MEDIA_TYPE.to_owned(), None);
    let config = Config::new(EMPTY_CONFIG.to_vec(), EMPTY_CONFIG_MEDIA_TYPE.to_owned(), None);
    let mut m = OciImageManifest::build(&[layer], &config, None);
    m.media_type = Some(MANIFEST_MEDIA_TYPE.to_owned());
    m.artifact_type = Some(ARTIFACT_TYPE.to_owned());
    m.annotations = Some(BTreeMap::from([("org.opencontainers.image.title".to_owned(), "kit.zip".to_owned())]));
    m
}

/// Push `zip` (a packed kit) to `target` as a kit artifact.
pub fn push(target: &Target, zip: &[u8], credentials: Option<&Value>) -> Result<Pushed> {
    let layer = ImageLayer::new(zip.to_vec(), LAYER_MEDIA_TYPE.to_owned(), None);
    let config = Config::new(EMPTY_CONFIG.to_vec(), EMPTY_CONFIG_MEDIA_TYPE.to_owned(), None);
    let m = manifest(zip);
    let auth = auth(credentials);
    let client = client(target);
    let resp = runtime()?
        .block_on(client.push(&target.reference, &[layer], config, &auth, Some(m)))
        .map_err(|e| explain(e, target, credentials.is_some()))
        .with_context(|| format!("could not push the kit to `{}`", target.as_str()))?;
    Ok(Pushed { layer_digest: digest(zip), manifest_url: resp.manifest_url })
}

/// Pull the kit at `target`: fetch its manifest, check it is a kit, fetch
/// the layer and check its sha256 and size against the manifest.
pub fn pull(target: &Target, credentials: Option<&Value>) -> Result<Pulled> {
    let auth = auth(credentials);
    let client = client(target);
    let rt = runtime()?;
    let context = || format!("could not pull the kit `{}`", target.as_str());
    let (manifest, _) = rt
        .block_on(client.pull_manifest(&target.reference, &auth))
        .map_err(|e| explain(e, target, credentials.is_some()))
        .with_context(context)?;
    let OciManifest::Image(manifest) = manifest else {
        return Err(fail(format!("`{}` is an image index, not a ppp kit", target.as_str()))
            .hint(format!("a kit's manifest has artifactType `{ARTIFACT_TYPE}`; push one with `ppp kit push`"))
            .into());
    };
    let layer = kit_layer(&manifest).with_context(context)?;
    // A registry is not trusted with ppp's memory: the declared size must
    // be a kit's, and the download stops once it sends more than declared.
    let max = super::manifest::MAX_ARCHIVE_BYTES;
    let declared = u64::try_from(layer.size).unwrap_or(u64::MAX);
    if declared > max {
        return Err(fail(format!(
            "the kit layer of `{}` is {declared} bytes, more than a kit may be ({max} bytes)",
            target.as_str()
        ))
        .hint("nothing was downloaded; kits are pushed with `ppp kit push`, which stays within the limits")
        .into());
    }
    let mut zip = Bounded { bytes: Vec::new(), limit: declared };
    rt.block_on(client.pull_blob(&target.reference, &layer, &mut zip))
        .map_err(|e| explain(e, target, credentials.is_some()))
        .with_context(context)?;
    let zip = zip.bytes;
    // oci-client already compares as it streams; check again here so the
    // guarantee does not rest on a dependency's internals.
    let actual = digest(&zip);
    if actual != layer.digest || i64::try_from(zip.len()).ok() != Some(layer.size) {
        return Err(anyhow::Error::from(digest_mismatch(&layer.digest, &actual)).context(context()));
    }
    Ok(Pulled { zip, layer_digest: actual })
}

/// A buffer that refuses to grow past `limit` bytes: the write fails, so
/// the download stops there.
struct Bounded {
    bytes: Vec<u8>,
    limit: u64,
}

impl tokio::io::AsyncWrite for Bounded {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if (self.bytes.len() + buf.len()) as u64 > self.limit {
            let limit = self.limit;
            return std::task::Poll::Ready(Err(std::io::Error::other(format!(
                "the registry sent more than the {limit} bytes the manifest declares"
            ))));
        }
        self.bytes.extend_from_slice(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

fn digest_mismatch(expected: &str, actual: &str) -> crate::error::Failure {
    fail(format!("the kit's content does not match its manifest: expected `{expected}`, got `{actual}`"))
        .hint("the registry's copy is damaged or was altered; nothing was written. Push the kit again")
}

/// The one kit layer of `m`, after checking `m` describes a kit.
fn kit_layer(m: &OciImageManifest) -> Result<oci_client::manifest::OciDescriptor> {
    if m.artifact_type.as_deref() != Some(ARTIFACT_TYPE) {
        let got = m.artifact_type.as_deref().unwrap_or(&m.config.media_type);
        return Err(fail(format!("this is not a ppp kit: its type is `{got}`, not `{ARTIFACT_TYPE}`"))
            .hint("check the reference; kits are pushed with `ppp kit push`")
            .into());
    }
    match m.layers.as_slice() {
        [layer] if layer.media_type == LAYER_MEDIA_TYPE => Ok(layer.clone()),
        layers => {
            let types: Vec<&str> = layers.iter().map(|l| l.media_type.as_str()).collect();
            Err(fail(format!(
                "a kit has exactly one layer of type `{LAYER_MEDIA_TYPE}`, this one has [{}]",
                types.join(", ")
            ))
            .into())
        }
    }
}

/// Turn the client's error into ppp's: a hint for the usual causes, and
/// the client's own text kept as the cause.
fn explain(err: OciDistributionError, target: &Target, had_credentials: bool) -> anyhow::Error {
    let registry = target.registry();
    let text = err.to_string();
    let denied =
        matches!(err, OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_))
            || registry_code(&err, &["UNAUTHORIZED", "DENIED"])
            || matches!(&err, OciDistributionError::ServerError { code: 401 | 403, .. });
    let missing = matches!(err, OciDistributionError::ImageManifestNotFoundError(_))
        || registry_code(&err, &["MANIFEST_UNKNOWN", "NAME_UNKNOWN", "BLOB_UNKNOWN"])
        || matches!(&err, OciDistributionError::ServerError { code: 404, .. });
    let cause = anyhow::Error::new(err);
    if denied {
        let hint = if had_credentials {
            format!("the stored credentials were refused; store new ones with `ppp secret set --registry {registry}`")
        } else {
            format!("store credentials with `ppp secret set --registry {registry}` (user:password or a token)")
        };
        return cause.context(fail(format!("registry `{registry}` refused access")).hint(hint));
    }
    if missing {
        return cause.context(
            fail(format!("`{}` was not found in registry `{registry}`", target.as_str()))
                .hint("check the repository and tag; `ppp kit push DIR REFERENCE` publishes a kit"),
        );
    }
    if let Some(e) = find_digest_error(&text) {
        return cause.context(digest_mismatch(&e.0, &e.1));
    }
    if text.contains("error sending request") || text.contains("connect") {
        let hint = if target.is_loopback() {
            format!("is a registry listening on `{registry}`?")
        } else {
            format!("check that `{registry}` is reachable over HTTPS; plain HTTP is allowed only for loopback")
        };
        return cause.context(fail(format!("could not reach registry `{registry}`")).hint(hint));
    }
    cause
}

fn registry_code(err: &OciDistributionError, codes: &[&str]) -> bool {
    let OciDistributionError::RegistryError { envelope, .. } = err else {
        return false;
    };
    envelope.errors.iter().any(|e| {
        let code = serde_json::to_value(&e.code).ok();
        codes.iter().any(|c| code.as_ref().and_then(|v| v.as_str()) == Some(*c))
    })
}

/// `(expected, actual)` from the client's digest verification error.
fn find_digest_error(text: &str) -> Option<(String, String)> {
    if !text.to_ascii_lowercase().contains("digest") {
        return None;
    }
    let mut found = text.split(|c: char| !(c.is_ascii_alphanumeric() || c == ':')).filter(|w| w.starts_with("sha256:"));
    Some((found.next()?.to_owned(), found.next().unwrap_or("?").to_owned()))
}

/// Load and check the kit in `dir`, and pack it with the kit module's
/// deterministic packer ([`crate::kit::pack::pack`]): the bytes `ppp kit
/// pack` writes are the bytes pushed.
pub fn pack_dir(dir: &Path) -> Result<Vec<u8>> {
    if !dir.is_dir() {
        return Err(fail(format!("`{}` is not a directory", dir.display()))
            .hint("`ppp kit push` takes the kit's directory, the one holding kit.yaml")
            .code(2)
            .into());
    }
    let kit = crate::kit::manifest::load_dir(dir)?;
    crate::kit::pack::pack(&kit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_need_a_registry_and_a_tag() {
        let t = Target::parse("127.0.0.1:5000/kits/tools:0.1.0").unwrap();
        assert_eq!(t.registry(), "127.0.0.1:5000");
        assert_eq!(t.default_file_name(), PathBuf::from("tools-0.1.0.zip"));
        assert!(t.is_loopback());
        assert!(Target::parse("kits/tools:1").is_err(), "no registry would mean Docker Hub");
        assert!(Target::parse("registry.example.com/kits/tools").is_err(), "no tag");
        assert!(!Target::parse("registry.example.com/kits/tools:1").unwrap().is_loopback());
        assert!(Target::parse("localhost:5000/tools:1").unwrap().is_loopback());
    }

    #[test]
    fn loopback_is_only_loopback() {
        assert!(is_loopback("localhost"));
        assert!(is_loopback("127.0.0.2:80"));
        assert!(is_loopback("[::1]:5000"));
        assert!(!is_loopback("localhost.example.com:5000"));
        assert!(!is_loopback("10.0.0.1:5000"));
    }

    #[test]
    fn credentials_map_to_basic_or_bearer() {
        assert!(matches!(auth(None), RegistryAuth::Anonymous));
        let basic = auth(Some(&Value::new("me:pa:ss".into())));
        assert!(matches!(basic, RegistryAuth::Basic(u, p) if u == "me" && p == "pa:ss"));
        assert!(matches!(auth(Some(&Value::new("tok".into()))), RegistryAuth::Bearer(t) if t == "tok"));
    }

    #[test]
    fn manifest_is_an_oci_artifact() {
        let m = manifest(b"zip bytes");
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json["artifactType"], ARTIFACT_TYPE);
        assert_eq!(json["config"]["mediaType"], EMPTY_CONFIG_MEDIA_TYPE);
        assert_eq!(json["config"]["digest"], digest(b"{}"));
        assert_eq!(json["layers"][0]["mediaType"], LAYER_MEDIA_TYPE);
        assert_eq!(json["layers"][0]["digest"], digest(b"zip bytes"));
    }
}
