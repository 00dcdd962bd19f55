//! The file backend: every secret in one age-encrypted file,
//! `$PPP_DATA/secrets.age` (0600, in a 0700 directory), for hosts without a
//! reachable OS keychain.
//!
//! The file is encrypted to an x25519 identity, not a passphrase: scrypt costs
//! 0.5–2 s per decryption, and ppp decrypts on every command and on every
//! daemon cache miss; x25519 takes well under a millisecond. The identity is
//! kept in the *config* root (`$PPP_CONFIG/age-identity.txt`, or the file
//! named by `PPP_AGE_IDENTITY`), away from the data root, so a copy of the
//! data directory alone does not carry the key. See `docs/secrets.md`.
//!
//! The plaintext is a small JSON object that exists only in memory, in
//! buffers zeroized after use. Writers must hold `state.lock`; this module
//! does not take it (the [`Store`](crate::secret::Store) does).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use age::secrecy::ExposeSecret as _;
use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};
use zeroize::{Zeroize as _, Zeroizing};

use crate::error::fail;
use crate::secret::{Error, Value};
use crate::state;

/// Plaintext format version inside the encrypted file.
const VERSION: u32 = 1;

/// Where the age file and its identity live.
#[derive(Debug, Clone)]
pub(crate) struct FileStore {
    path: PathBuf,
    identity: PathBuf,
    /// The identity path came from `PPP_AGE_IDENTITY`: never create it, the
    /// user named a key they have.
    identity_given: bool,
}

/// The decrypted contents. Values are zeroized on drop and whenever one is
/// replaced or removed.
#[derive(Serialize, Deserialize)]
struct Vault {
    version: u32,
    secrets: BTreeMap<String, String>,
}

impl Drop for Vault {
    fn drop(&mut self) {
        for v in self.secrets.values_mut() {
            v.zeroize();
        }
    }
}

impl FileStore {
    pub(crate) fn new(path: PathBuf, identity: PathBuf, identity_given: bool) -> FileStore {
        FileStore { path, identity, identity_given }
    }

    /// The value stored under `key`.
    pub(crate) fn get(&self, key: &str) -> Result<Option<Value>> {
        let Some(mut vault) = self.load()? else {
            return Ok(None);
        };
        Ok(vault.secrets.remove(key).map(Value::new))
    }

    /// Store `value` under `key`. Creates the file, and the identity if
    /// neither exists yet. The caller holds `state.lock`.
    pub(crate) fn set(&self, key: &str, value: &Value) -> Result<()> {
        let (mut vault, identity) = match self.load_with_identity()? {
            Some(loaded) => loaded,
            None => (Vault { version: VERSION, secrets: BTreeMap::new() }, self.identity_for_new_file()?),
        };
        if let Some(mut old) = vault.secrets.insert(key.to_owned(), value.expose().to_owned()) {
            old.zeroize();
        }
        self.save(&vault, &identity)
    }

    /// Remove `key`; `false` when it was not stored. The caller holds
    /// `state.lock`.
    pub(crate) fn remove(&self, key: &str) -> Result<bool> {
        let Some((mut vault, identity)) = self.load_with_identity()? else {
            return Ok(false);
        };
        let Some(mut old) = vault.secrets.remove(key) else {
            return Ok(false);
        };
        old.zeroize();
        self.save(&vault, &identity)?;
        Ok(true)
    }

    fn load(&self) -> Result<Option<Vault>> {
        Ok(self.load_with_identity()?.map(|(v, _)| v))
    }

    /// Decrypt the file, `None` when it does not exist yet.
    fn load_with_identity(&self) -> Result<Option<(Vault, age::x25519::Identity)>> {
        let ciphertext = match std::fs::read(&self.path) {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(e).with_context(|| format!("could not read `{}`", self.path.display()));
            }
        };
        let Some(identity) = self.read_identity()? else {
            return Err(self.locked(
                format!("the age identity `{}` does not exist", self.identity.display()),
                "restore the identity file from your backup (or point `PPP_AGE_IDENTITY` at it); \
                 without it the secrets in the file are lost, and deleting the file lets you start over",
            ));
        };
        let plaintext = Zeroizing::new(age::decrypt(&identity, &ciphertext).map_err(|e| {
            self.locked(
                format!("age: {e}"),
                "the file was encrypted to a different identity than the one ppp found, or it is damaged",
            )
        })?);
        let vault: Vault = serde_json::from_slice(&plaintext).map_err(|e| {
            // serde_json's message may quote the text near the error, which
            // is secret here: report the position only.
            self.locked(
                format!("the decrypted contents are not valid (line {}, column {})", e.line(), e.column()),
                "the file is damaged; restore it from a backup",
            )
        })?;
        if vault.version != VERSION {
            return Err(self.locked(
                format!("the file has format version {}, this ppp reads {VERSION}", vault.version),
                "upgrade ppp",
            ));
        }
        Ok(Some((vault, identity)))
    }

    fn locked(&self, detail: String, hint: &str) -> anyhow::Error {
        anyhow::Error::new(fail(detail).hint(hint)).context(Error::FileLocked(self.path.clone()))
    }

    fn save(&self, vault: &Vault, identity: &age::x25519::Identity) -> Result<()> {
        // Sized for the worst case of JSON escaping so the buffer is never
        // reallocated, which would leave an unzeroized copy behind.
        let worst: usize = vault.secrets.iter().map(|(k, v)| 6 * (k.len() + v.len()) + 8).sum();
        let mut plaintext = Zeroizing::new(Vec::with_capacity(64 + worst));
        serde_json::to_writer(&mut *plaintext, vault).context("could not serialise the secret store")?;
        let ciphertext = encrypt(&identity.to_public(), &plaintext)?;
        if let Some(dir) = self.path.parent() {
            state::tighten_dir(dir)?;
        }
        state::write_atomic(&self.path, &ciphertext)
    }

    /// The identity to encrypt a brand-new file to: the existing one, or a
    /// fresh one written to the default path.
    fn identity_for_new_file(&self) -> Result<age::x25519::Identity> {
        if let Some(id) = self.read_identity()? {
            return Ok(id);
        }
        if self.identity_given {
            return Err(fail(format!(
                "the age identity `{}` named by `PPP_AGE_IDENTITY` does not exist",
                self.identity.display()
            ))
            .hint("create it with `age-keygen -o <file>`, or unset `PPP_AGE_IDENTITY` to let ppp create one")
            .into());
        }
        let id = age::x25519::Identity::generate();
        // Sized so the buffer never reallocates (see `save`).
        let mut text = Zeroizing::new(String::with_capacity(512));
        let now =
            time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
        // The layout `age-keygen` writes, so `age -d -i` reads it too.
        writeln!(
            &mut *text,
            "# created: {now}\n# public key: {}\n# ppp secret store key; keep it private and back it up \
             apart from secrets.age\n{}",
            id.to_public(),
            id.to_string().expose_secret()
        )
        .context("could not format the age identity")?;
        if let Some(dir) = self.identity.parent() {
            state::tighten_dir(dir)?;
        }
        state::write_atomic(&self.identity, text.as_bytes()).context("could not save the new age identity")?;
        Ok(id)
    }

    /// Read and parse the identity, `None` when the file does not exist.
    fn read_identity(&self) -> Result<Option<age::x25519::Identity>> {
        let path = &self.identity;
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(e).with_context(|| format!("could not read `{}`", path.display()));
            }
        };
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(anyhow::Error::new(
                fail(format!(
                    "the age identity `{}` is readable by other users (mode {:o})",
                    path.display(),
                    mode & 0o777
                ))
                .hint(format!("run `chmod 600 {}`", path.display())),
            )
            .context(Error::FileLocked(self.path.clone())));
        }
        let text = Zeroizing::new(
            std::fs::read_to_string(path).with_context(|| format!("could not read `{}`", path.display()))?,
        );
        parse_identity(path, &text).map(Some)
    }
}

/// The first x25519 identity in an `age-keygen`-style file. Errors give the
/// line number, never the line.
fn parse_identity(path: &Path, text: &str) -> Result<age::x25519::Identity> {
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        return line.parse::<age::x25519::Identity>().map_err(|_| {
            fail(format!("`{}` line {}: not an age x25519 identity (`AGE-SECRET-KEY-1…`)", path.display(), i + 1))
                .into()
        });
    }
    Err(fail(format!("`{}` holds no age identity", path.display())).into())
}

fn encrypt(recipient: &age::x25519::Recipient, plaintext: &[u8]) -> Result<Vec<u8>> {
    age::encrypt(recipient, plaintext).context("could not encrypt the secret store")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path) -> FileStore {
        FileStore::new(dir.join("data/secrets.age"), dir.join("config/age-identity.txt"), false)
    }

    #[test]
    fn round_trip_creates_key_and_file_privately() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        assert!(s.get("ppp.x").unwrap().is_none());
        assert!(!s.remove("ppp.x").unwrap());
        assert!(!dir.path().join("config").exists(), "reads must not create the identity");

        s.set("ppp.x", &Value::new("sekrit-value-1".into())).unwrap();
        s.set("ppp.y", &Value::new("sekrit-value-2".into())).unwrap();
        s.set("ppp.x", &Value::new("sekrit-value-3".into())).unwrap();
        assert_eq!(s.get("ppp.x").unwrap().unwrap().expose(), "sekrit-value-3");
        assert_eq!(s.get("ppp.y").unwrap().unwrap().expose(), "sekrit-value-2");
        assert!(s.remove("ppp.y").unwrap());
        assert!(s.get("ppp.y").unwrap().is_none());

        for p in [&s.path, &s.identity] {
            let mode = std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", p.display());
        }
        let bytes = std::fs::read(&s.path).unwrap();
        assert!(bytes.starts_with(b"age-encryption.org/v1\n"));
        assert!(!bytes.windows(6).any(|w| w == b"sekrit"));
    }

    #[test]
    fn missing_or_wrong_identity_is_locked_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        s.set("ppp.x", &Value::new("v".into())).unwrap();

        // A different identity: decryption fails and says so.
        let other = age::x25519::Identity::generate();
        let text = format!("{}\n", other.to_string().expose_secret());
        state::write_atomic(&s.identity, text.as_bytes()).unwrap();
        let err = s.get("ppp.x").unwrap_err();
        assert!(matches!(err.downcast_ref::<Error>(), Some(Error::FileLocked(_))), "{err:#}");
        // Writing must not silently replace the file under a new key.
        assert!(s.set("ppp.y", &Value::new("v".into())).is_err());

        std::fs::remove_file(&s.identity).unwrap();
        let (text, _) = crate::error::render(&s.get("ppp.x").unwrap_err());
        assert!(text.contains("does not exist"), "{text}");
        assert!(s.set("ppp.y", &Value::new("v".into())).is_err(), "must not mint a new key over old data");
        assert!(!s.identity.exists());
    }

    #[test]
    fn identity_checks() {
        let dir = tempfile::tempdir().unwrap();
        let given = FileStore::new(dir.path().join("s.age"), dir.path().join("nope.txt"), true);
        let (text, _) = crate::error::render(&given.set("ppp.x", &Value::new("v".into())).unwrap_err());
        assert!(text.contains("PPP_AGE_IDENTITY"), "{text}");
        assert!(!dir.path().join("nope.txt").exists());

        let id = dir.path().join("id.txt");
        std::fs::write(&id, "# comment\n\nAGE-SECRET-KEY-1NOTAKEY\n").unwrap();
        std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = FileStore::new(dir.path().join("s.age"), id.clone(), true);
        let (text, _) = crate::error::render(&s.set("ppp.x", &Value::new("v".into())).unwrap_err());
        assert!(text.contains("line 3"), "{text}");
        assert!(!text.contains("NOTAKEY"), "{text}");

        std::fs::set_permissions(&id, std::fs::Permissions::from_mode(0o644)).unwrap();
        let (text, _) = crate::error::render(&s.set("ppp.x", &Value::new("v".into())).unwrap_err());
        assert!(text.contains("chmod 600"), "{text}");
    }
}
