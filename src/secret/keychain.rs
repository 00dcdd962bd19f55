//! The OS keychain backend, through the `keyring` crate: Secret Service on
//! Linux and the BSDs (pure-Rust D-Bus, no libdbus), Keychain on macOS,
//! Credential Manager on Windows.
//!
//! Every item is keychain service `<key>` (such as `ppp.anthropic`) with user
//! `ppp`. This module is the only place that talks to `keyring`, and it turns
//! `keyring::Error`s into messages that cannot carry a secret: two of its
//! variants hold the stored bytes, so the error is never passed on as is.
//!
//! `keyring` picks and connects its store once per process, on first use, so
//! whether the keychain is reachable is settled for the process's lifetime.

use anyhow::Result;
use keyring::Error as K;
use zeroize::Zeroize;

use crate::error::fail;
use crate::secret::{Error, Value};

/// The user half of every item.
const USER: &str = "ppp";

/// An item that is never written: asking for it is the cheapest round trip
/// that proves the store answers. Its user differs from [`USER`], so it
/// cannot collide with a service called `probe`.
const PROBE_SERVICE: &str = "ppp.probe";
const PROBE_USER: &str = "ppp-availability-probe";

/// Fits both a write (the backend was forced or picked) and a read of an
/// entry the index places in the keychain (only the keychain has it).
const HINT_UNAVAILABLE: &str = "start and unlock the keychain (on Linux: a Secret Service such as gnome-keyring \
     on the D-Bus session bus); to store new secrets in the age-encrypted file instead, \
     set `PPP_SECRET_BACKEND=file`";

/// `Ok` when the keychain answers; otherwise why not, in words that are safe
/// to print.
pub(crate) fn probe() -> std::result::Result<(), String> {
    let entry = keyring::Entry::new(PROBE_SERVICE, PROBE_USER).map_err(describe)?;
    match entry.get_secret() {
        Ok(mut bytes) => {
            bytes.zeroize();
            Ok(())
        }
        Err(K::NoEntry) => Ok(()),
        Err(e) => Err(describe(e)),
    }
}

/// The value stored under `key`, `None` when there is none.
pub(crate) fn get(key: &str) -> Result<Option<Value>> {
    let entry = entry(key)?;
    match entry.get_secret() {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => Ok(Some(Value::new(text))),
            Err(e) => {
                e.into_bytes().zeroize();
                Err(failure(key, "is not UTF-8 text", Error::Keychain))
            }
        },
        Err(K::NoEntry) => Ok(None),
        Err(e) => Err(map(key, e)),
    }
}

/// Store `value` under `key`, replacing any value there.
pub(crate) fn set(key: &str, value: &Value) -> Result<()> {
    entry(key)?.set_password(value.expose()).map_err(|e| map(key, e))
}

/// Delete `key`; `false` when it was not there.
pub(crate) fn delete(key: &str) -> Result<bool> {
    match entry(key)?.delete_credential() {
        Ok(()) => Ok(true),
        Err(K::NoEntry) => Ok(false),
        Err(e) => Err(map(key, e)),
    }
}

fn entry(key: &str) -> Result<keyring::Entry> {
    keyring::Entry::new(key, USER).map_err(|e| map(key, e))
}

/// Whether `e` means "there is no usable keychain here" rather than "this
/// operation failed".
fn is_unavailable(e: &K) -> bool {
    matches!(e, K::NoDefaultStore | K::PlatformFailure(_) | K::NoStorageAccess(_))
}

fn map(key: &str, e: K) -> anyhow::Error {
    let kind = if is_unavailable(&e) { Error::KeychainUnavailable } else { Error::Keychain };
    let detail = describe(e);
    failure(key, &detail, kind)
}

fn failure(key: &str, detail: &str, kind: Error) -> anyhow::Error {
    let mut f = fail(format!("keychain item `{key}`: {detail}"));
    if matches!(kind, Error::KeychainUnavailable) {
        f = f.hint(HINT_UNAVAILABLE);
    }
    anyhow::Error::new(f).context(kind)
}

/// A message for `e` that cannot contain secret bytes. Consumes `e` so the
/// bytes some variants carry are zeroized here rather than dropped as is.
pub(crate) fn describe(e: K) -> String {
    match e {
        K::NoEntry => "no such item".to_owned(),
        K::NoDefaultStore => match keyring::Entry::store_status() {
            Err(init) => format!("no keychain store could be opened: {}", describe_ref(init)),
            Ok(()) => "no keychain store could be opened".to_owned(),
        },
        K::PlatformFailure(inner) => format!("platform failure: {inner}"),
        K::NoStorageAccess(inner) => format!("locked or access denied: {inner}"),
        K::BadEncoding(mut bytes) => {
            bytes.zeroize();
            "the stored value is not UTF-8 text".to_owned()
        }
        K::BadDataFormat(mut bytes, _) => {
            bytes.zeroize();
            "the stored value is malformed".to_owned()
        }
        K::Ambiguous(items) => format!("{} keychain items match; remove the duplicates", items.len()),
        e @ (K::BadStoreFormat(_) | K::TooLong(..) | K::Invalid(..) | K::NotSupportedByStore(_)) => e.to_string(),
        // `keyring::Error` is non-exhaustive and a new variant might carry
        // data; print nothing of it.
        _ => "unrecognised keychain error".to_owned(),
    }
}

/// [`describe`] for the store-initialisation error, which `keyring` keeps
/// and lends out. It never holds secret bytes (no item was read yet).
fn describe_ref(e: &K) -> String {
    match e {
        K::PlatformFailure(inner) => format!("platform failure: {inner}"),
        K::NoStorageAccess(inner) => format!("locked or access denied: {inner}"),
        K::BadEncoding(_) | K::BadDataFormat(..) | K::Ambiguous(_) => "unexpected keychain error".to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_carrying_bytes_are_not_echoed() {
        let secret = b"sk-live-very-secret".to_vec();
        let text = describe(K::BadEncoding(secret.clone()));
        assert!(!text.contains("sk-live"), "{text}");
        let text = describe(K::BadDataFormat(secret, "bad".into()));
        assert!(!text.contains("sk-live"), "{text}");
    }

    #[test]
    fn unavailable_errors_are_typed_and_hinted() {
        let err = map("ppp.anthropic", K::PlatformFailure("no bus".into()));
        assert!(matches!(err.downcast_ref::<Error>(), Some(Error::KeychainUnavailable)));
        let (text, _) = crate::error::render(&err.context("could not read secret `anthropic`"));
        assert_eq!(
            text.lines().take(3).collect::<Vec<_>>(),
            [
                "error: could not read secret `anthropic`",
                "  caused by: the OS keychain is not reachable",
                "  caused by: keychain item `ppp.anthropic`: platform failure: no bus",
            ]
        );
        assert!(text.contains("hint: start and unlock the keychain"), "{text}");

        let err = map("ppp.x", K::Invalid("service".into(), "too long".into()));
        assert!(matches!(err.downcast_ref::<Error>(), Some(Error::Keychain)));
    }
}
