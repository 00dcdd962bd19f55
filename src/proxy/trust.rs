//! The PEM bundle mitmproxy verifies upstream servers against (spec A.6).
//!
//! mitmproxy only trusts its own bundle (certifi), never the OS store, so on
//! a TLS-inspecting network every upstream connection fails even though the
//! host trusts the inspection CA. ppp hands it the host's own trust store,
//! exported as it is: no filtering, and verification is never turned off.
//! `PPP_UPSTREAM_CA` names a bundle to use instead.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::dirs::Dirs;
use crate::env;
use crate::error::fail;
use crate::exec::{self, Invocation};
use crate::state;

/// Distro CA bundles, most common first; the first that exists is used.
pub const LINUX_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// macOS keychains whose certificates make up the trust store: Apple's roots
/// and the admin-installed ones (where an inspection CA lands).
pub const MACOS_KEYCHAINS: &[&str] =
    &["/System/Library/Keychains/SystemRootCertificates.keychain", "/Library/Keychains/System.keychain"];

const BEGIN: &str = "-----BEGIN CERTIFICATE-----";

/// The command that prints every certificate of [`MACOS_KEYCHAINS`] as PEM.
pub fn macos_export() -> Invocation {
    Invocation::new("/usr/bin/security")
        .args(["find-certificate", "-a", "-p"])
        .args(MACOS_KEYCHAINS.iter().copied())
        .timeout(Duration::from_secs(30))
}

/// Where the bundle comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A user-supplied bundle, used as it is.
    Override(PathBuf),
    /// The first existing file of these.
    Files(Vec<PathBuf>),
    /// The output of this command.
    Command(Invocation),
}

impl Source {
    /// The source for this OS, or the `PPP_UPSTREAM_CA` override.
    pub fn from_env() -> Self {
        match std::env::var_os(env::PPP_UPSTREAM_CA).filter(|v| !v.is_empty()) {
            Some(p) => Self::Override(PathBuf::from(p)),
            None if cfg!(target_os = "macos") => Self::Command(macos_export()),
            None => Self::Files(LINUX_BUNDLES.iter().map(PathBuf::from).collect()),
        }
    }
}

/// The bundle path to pass as `ssl_verify_upstream_trusted_ca`: the override
/// itself, or the host store written to `$PPP_DATA/wg/upstream-ca.pem`.
pub fn export(dirs: &Dirs, source: &Source) -> Result<PathBuf> {
    let pem = match source {
        Source::Override(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                fail(format!("cannot read `{}` ({}): {e}", path.display(), env::PPP_UPSTREAM_CA))
                    .hint(format!("point `{}` at a PEM bundle of CA certificates", env::PPP_UPSTREAM_CA))
            })?;
            check(&text, path)?;
            // mitmdump may run from another directory than the one the
            // variable was set in.
            return Ok(std::path::absolute(path)?);
        }
        Source::Files(candidates) => {
            let Some(path) = candidates.iter().find(|p| p.is_file()) else {
                let tried = candidates.iter().map(|p| format!("`{}`", p.display())).collect::<Vec<_>>().join(", ");
                return Err(fail(format!("found no CA bundle of this system (tried {tried})"))
                    .hint(format!("install the ca-certificates package, or set `{}`", env::PPP_UPSTREAM_CA))
                    .into());
            };
            let text = fs_err::read_to_string(path)?;
            check(&text, path)?;
            text
        }
        Source::Command(inv) => {
            let out = exec::run(inv).with_context(|| "could not export the system trust store".to_owned())?;
            check(&out.stdout, Path::new(&inv.to_string()))?;
            out.stdout
        }
    };
    let dest = dirs.upstream_ca();
    // Unchanged content keeps its file, so a running mitmdump's bundle is
    // never replaced under it for nothing.
    if std::fs::read_to_string(&dest).is_ok_and(|old| old == pem) {
        return Ok(dest);
    }
    state::write_atomic_mode(&dest, pem.as_bytes(), 0o644)?;
    Ok(dest)
}

fn check(text: &str, from: &Path) -> Result<()> {
    if text.contains(BEGIN) {
        Ok(())
    } else {
        Err(fail(format!("`{}` holds no PEM certificate", from.display()))
            .hint(format!("a bundle needs at least one `{BEGIN}` block; set `{}` to one", env::PPP_UPSTREAM_CA))
            .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn dirs(tmp: &Path) -> Dirs {
        Dirs { config: tmp.join("c"), data: tmp.join("d"), cache: tmp.join("k") }
    }

    #[test]
    fn first_existing_bundle_is_copied() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dirs(tmp.path());
        let second = tmp.path().join("b.pem");
        std::fs::write(&second, CERT).unwrap();
        let src = Source::Files(vec![tmp.path().join("missing.pem"), second]);
        let out = export(&d, &src).unwrap();
        assert_eq!(out, d.upstream_ca());
        assert_eq!(std::fs::read_to_string(&out).unwrap(), CERT);
        // Idempotent.
        assert_eq!(export(&d, &src).unwrap(), out);
    }

    #[test]
    fn override_is_used_as_is_and_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dirs(tmp.path());
        let own = tmp.path().join("corp.pem");
        std::fs::write(&own, CERT).unwrap();
        assert_eq!(export(&d, &Source::Override(own.clone())).unwrap(), own);
        assert!(!d.upstream_ca().exists());

        std::fs::write(&own, "not a cert\n").unwrap();
        let (text, _) = crate::error::render(&export(&d, &Source::Override(own)).unwrap_err());
        assert!(text.contains("holds no PEM certificate"), "{text}");
        let (text, _) = crate::error::render(&export(&d, &Source::Override(tmp.path().join("nope"))).unwrap_err());
        assert!(text.contains("PPP_UPSTREAM_CA"), "{text}");
    }

    #[test]
    fn no_bundle_names_what_was_tried() {
        let tmp = tempfile::tempdir().unwrap();
        let err = export(&dirs(tmp.path()), &Source::Files(vec![PathBuf::from("/nonexistent/ca.pem")])).unwrap_err();
        let (text, _) = crate::error::render(&err);
        assert!(text.contains("/nonexistent/ca.pem") && text.contains("hint:"), "{text}");
    }

    #[test]
    fn command_output_is_exported() {
        let tmp = tempfile::tempdir().unwrap();
        let d = dirs(tmp.path());
        let src = tmp.path().join("printed.pem");
        std::fs::write(&src, CERT).unwrap();
        let inv = Invocation::new("/bin/cat").arg(&src);
        export(&d, &Source::Command(inv)).unwrap();
        assert_eq!(std::fs::read_to_string(d.upstream_ca()).unwrap(), CERT);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_host_store_has_certificates() {
        // This machine's own store, through the same path ppp takes.
        let tmp = tempfile::tempdir().unwrap();
        let d = dirs(tmp.path());
        let src = Source::Files(LINUX_BUNDLES.iter().map(PathBuf::from).collect());
        let text = std::fs::read_to_string(export(&d, &src).unwrap()).unwrap();
        assert!(text.matches(BEGIN).count() > 10);
    }

    #[test]
    fn macos_command() {
        insta::assert_snapshot!(macos_export().to_string(), @"security find-certificate -a -p /System/Library/Keychains/SystemRootCertificates.keychain /Library/Keychains/System.keychain");
    }
}
