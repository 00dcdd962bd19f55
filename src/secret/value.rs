//! [`Value`]: a secret's plaintext, held so that it cannot leak by accident.
//!
//! A `Value` has no `Serialize`, no `PartialEq` and no `Deref`: the only way to
//! the text is [`Value::expose`], so every place a secret leaves the process
//! (a keychain call, the age plaintext, the daemon's reply) is greppable.
//! Its `Debug` and `Display` print `[redacted]`, and its buffer is zeroized on
//! drop. This module must never format the text into anything.

use std::fmt;

use zeroize::Zeroize;

use crate::error::fail;

/// What `Debug` and `Display` print in place of a secret.
pub const REDACTED: &str = "[redacted]";

/// A secret value: an API key, a token, a custom substitution.
///
/// Cloning copies the text into a second buffer, which is zeroized on its own
/// drop.
#[derive(Clone)]
pub struct Value(String);

impl Value {
    /// Take ownership of `text`. The caller's `String` moves in, so no
    /// un-zeroized copy is left behind by this call.
    #[must_use]
    pub fn new(text: String) -> Value {
        Value(text)
    }

    /// The plaintext. Call this only where the secret must leave the process.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Length in bytes, for callers that show "(40 characters)" and the like.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for the empty value (which [`Value::check`] rejects).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Reject values that cannot be stored and injected safely: empty ones,
    /// and ones with control characters (a CR or LF in a header value would
    /// let the value inject headers of its own) or surrounding whitespace
    /// (almost always a paste accident, and HTTP strips it anyway).
    ///
    /// The error never quotes the value.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.0.is_empty() {
            return Err(fail("the secret value is empty").code(2).into());
        }
        if let Some(i) = self.0.chars().position(char::is_control) {
            return Err(fail(format!(
                "the secret value contains a control character (such as a line break) at character {}",
                i + 1
            ))
            .hint("paste the value on one line, without the trailing newline")
            .code(2)
            .into());
        }
        if self.0.trim() != self.0 {
            return Err(fail("the secret value starts or ends with whitespace")
                .hint("remove the surrounding spaces; no API key contains them")
                .code(2)
                .into());
        }
        Ok(())
    }
}

impl Drop for Value {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;
    use proptest::prelude::*;

    const KEY: &str = "sk-ant-api03-SECRETSECRET";

    #[test]
    fn debug_and_display_are_redacted() {
        let v = Value::new(KEY.to_owned());
        assert_eq!(format!("{v}"), REDACTED);
        assert_eq!(format!("{v:?}"), REDACTED);
        assert_eq!(format!("{v:#?}"), REDACTED);
        assert_eq!(format!("{v:>40}"), REDACTED, "padding must not reach the text either");
        assert_eq!(v.expose(), KEY);
        assert_eq!(v.len(), KEY.len());
    }

    #[test]
    fn containers_and_errors_stay_redacted() {
        #[derive(Debug)]
        #[allow(dead_code)]
        struct Holder {
            name: &'static str,
            value: Value,
            values: Vec<Option<Value>>,
        }
        let v = Value::new(KEY.to_owned());
        let h = Holder { name: "anthropic", value: v.clone(), values: vec![Some(v.clone()), None] };
        let text = format!("{h:?} {h:#?}");
        assert!(!text.contains(KEY), "{text}");
        assert!(text.contains("anthropic"));

        let err: anyhow::Result<()> = Err(anyhow::anyhow!("backend said {v}")).context(format!("value {v:?}"));
        let err = err.unwrap_err();
        for rendered in [format!("{err}"), format!("{err:#}"), format!("{err:?}"), format!("{err:#?}")] {
            assert!(!rendered.contains(KEY), "{rendered}");
        }
        let (rendered, _) = crate::error::render(&err);
        assert!(!rendered.contains(KEY), "{rendered}");
    }

    #[test]
    fn check_rejects_unsafe_values_without_quoting_them() {
        assert!(Value::new(KEY.to_owned()).check().is_ok());
        for bad in ["", "sk-ant\n", "sk-ant\r\nx-evil: 1", " sk-ant", "sk-ant\t", "a\0b"] {
            let err = Value::new(bad.to_owned()).check().unwrap_err();
            let (text, _) = crate::error::render(&err);
            if !bad.trim().is_empty() {
                assert!(!text.contains(bad.trim()), "{text}");
            }
        }
        let (text, _) = crate::error::render(&Value::new("ab\ncd".to_owned()).check().unwrap_err());
        assert!(text.contains("at character 3"), "{text}");
        assert!(text.contains("hint:"), "{text}");
    }

    proptest! {
        #[test]
        fn no_format_reveals_the_value(s in "\\PC{1,64}") {
            // Compared with the exact expected text, so even a one-letter
            // value that also occurs in the marker cannot slip through.
            let v = Value::new(s.clone());
            let out = format!("{v} {v:?} {v:#?} {:?} {v:>9}", Some(vec![v.clone()]));
            prop_assert_eq!(out, "[redacted] [redacted] [redacted] Some([[redacted]]) [redacted]");
            prop_assert_eq!(v.expose(), s.as_str());
        }
    }
}
