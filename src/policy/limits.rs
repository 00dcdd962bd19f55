//! Body-size limits as policy, per direction.
//!
//! Every body is streamed (nothing is buffered to be measured), and a limit
//! is a count that cuts the flow when crossed. Which count applies is policy,
//! decided here like the rules are: the allow rule that let the flow through
//! may carry its own limit (`ppp policy allow network --upload 64MiB
//! host`), else the sandbox's policy file, else the global one, else the
//! built-in default. The defaults fit what agents do: downloads (container
//! layers, packages, clones) are unlimited, uploads stop at 1 MiB as an
//! exfiltration gate, except to a host ppp injects a key into (the LLM APIs
//! take requests of tens of MiB), which the addon knows and the built-in
//! default therefore leaves open.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The built-in upload limit for hosts ppp injects no key into.
pub const DEFAULT_UPLOAD: u64 = 1024 * 1024;

/// A limit: a number of bytes, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Size {
    Bytes(u64),
    Unlimited,
}

impl Size {
    /// The bytes, or `None` for no limit.
    #[must_use]
    pub fn bytes(self) -> Option<u64> {
        match self {
            Size::Bytes(b) => Some(b),
            Size::Unlimited => None,
        }
    }
}

impl FromStr for Size {
    type Err = String;

    /// `none` (or `unlimited`), or a size: `512KiB`, `64MiB`, `1.5GiB`,
    /// `1048576` (bytes), decimal and binary unit spellings alike meaning
    /// binary units, as podman's sizes do.
    fn from_str(s: &str) -> Result<Size, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("none") || t.eq_ignore_ascii_case("unlimited") {
            return Ok(Size::Unlimited);
        }
        crate::podman::parse_bytes(t, 1).map(Size::Bytes).ok_or_else(|| {
            format!("`{s}` is not a size; use a number with a unit such as `512KiB`, `64MiB` or `2GiB`, or `none`")
        })
    }
}

impl fmt::Display for Size {
    /// The largest binary unit that divides the size exactly: `64MiB`,
    /// `1536KiB`, `100B`; `none` for no limit. Parses back to the same size.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Size::Bytes(b) = *self else { return f.write_str("none") };
        for (unit, scale) in [("TiB", 1u64 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if b >= scale && b % scale == 0 {
                return write!(f, "{}{unit}", b / scale);
            }
        }
        write!(f, "{b}B")
    }
}

impl Serialize for Size {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Size {
    /// A YAML integer is bytes; text is parsed as [`Size::from_str`]. A
    /// visitor rather than an untagged enum, so an error keeps its line.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as `64MiB`, or `none`")
            }
            fn visit_u64<E: serde::de::Error>(self, b: u64) -> Result<Size, E> {
                if b == 0 { Err(E::custom("a limit of 0 bytes; use `none` for no limit")) } else { Ok(Size::Bytes(b)) }
            }
            fn visit_i64<E: serde::de::Error>(self, b: i64) -> Result<Size, E> {
                u64::try_from(b).map_err(|_| E::custom("a negative size")).and_then(|b| self.visit_u64(b))
            }
            fn visit_str<E: serde::de::Error>(self, t: &str) -> Result<Size, E> {
                t.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

/// The limits a rule or a policy file sets; unset directions fall through
/// to the next level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Request bodies (guest to the internet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload: Option<Size>,
    /// Response bodies (the internet to the guest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download: Option<Size>,
}

impl Limits {
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.upload.is_none() && self.download.is_none()
    }

    /// `self`, with `other`'s directions where `other` sets them.
    #[must_use]
    pub fn overlay(self, other: Limits) -> Limits {
        Limits { upload: other.upload.or(self.upload), download: other.download.or(self.download) }
    }

    /// `upload 64MiB, download none`, or empty when nothing is set.
    #[must_use]
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(u) = self.upload {
            parts.push(format!("upload {u}"));
        }
        if let Some(d) = self.download {
            parts.push(format!("download {d}"));
        }
        parts.join(", ")
    }
}

/// Where an applied limit came from, for the 413's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum From {
    /// The allow rule that let the flow through.
    Rule,
    /// The sandbox's policy file.
    Sandbox,
    /// The global policy file.
    Global,
    /// ppp's built-in default.
    Default,
}

/// One direction's limit for a flow, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// `None`: no limit.
    pub bytes: Option<u64>,
    pub from: From,
}

/// Both directions' limits for a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowLimits {
    pub upload: Applied,
    pub download: Applied,
}

/// The limits for a flow: the rule's, else the sandbox's, else the global
/// file's, else the built-in defaults. Pure.
#[must_use]
pub fn resolve(rule: Option<Limits>, sandbox: Option<Limits>, global: Limits) -> FlowLimits {
    let pick = |get: fn(&Limits) -> Option<Size>, default: Option<u64>| {
        for (level, from) in [(rule, From::Rule), (sandbox, From::Sandbox), (Some(global), From::Global)] {
            if let Some(size) = level.as_ref().and_then(get) {
                return Applied { bytes: size.bytes(), from };
            }
        }
        Applied { bytes: default, from: From::Default }
    };
    FlowLimits { upload: pick(|l| l.upload, Some(DEFAULT_UPLOAD)), download: pick(|l| l.download, None) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print_back() {
        for (text, want) in [
            ("64MiB", Size::Bytes(64 << 20)),
            ("64m", Size::Bytes(64 << 20)),
            ("1.5GiB", Size::Bytes(3 << 29)),
            ("512KiB", Size::Bytes(512 << 10)),
            ("1000", Size::Bytes(1000)),
            ("none", Size::Unlimited),
            ("Unlimited", Size::Unlimited),
        ] {
            let got: Size = text.parse().unwrap();
            assert_eq!(got, want, "{text}");
            assert_eq!(got.to_string().parse::<Size>().unwrap(), got, "{text}");
        }
        assert_eq!(Size::Bytes(64 << 20).to_string(), "64MiB");
        assert_eq!(Size::Bytes(1536 << 10).to_string(), "1536KiB");
        assert_eq!(Size::Bytes(100).to_string(), "100B");
        for bad in ["", "0", "-1", "12XB", "1..2MiB", "MiB"] {
            assert!(bad.parse::<Size>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_rule_then_the_sandbox_then_the_global_file_then_the_default() {
        let l = |u: Option<Size>, d: Option<Size>| Limits { upload: u, download: d };
        let none = Limits::default();
        let r = resolve(None, None, none);
        assert_eq!(r.upload, Applied { bytes: Some(DEFAULT_UPLOAD), from: From::Default });
        assert_eq!(r.download, Applied { bytes: None, from: From::Default });
        let global = l(Some(Size::Bytes(2 << 20)), Some(Size::Bytes(1 << 30)));
        let sandbox = l(Some(Size::Unlimited), None);
        let rule = l(None, Some(Size::Bytes(5)));
        let r = resolve(Some(rule), Some(sandbox), global);
        assert_eq!(r.upload, Applied { bytes: None, from: From::Sandbox });
        assert_eq!(r.download, Applied { bytes: Some(5), from: From::Rule });
        let r = resolve(None, None, global);
        assert_eq!((r.upload.from, r.download.bytes), (From::Global, Some(1 << 30)));
    }
}
