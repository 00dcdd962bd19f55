//! Kits: declarative sandbox extensions. A kit is a directory holding
//! `kit.yaml` (network rules, environment, files, startup commands and the
//! secrets it needs) plus the files it ships; see `docs/kits.md`.
//!
//! This module owns the schema, the loader and every check on a kit
//! ([`manifest`]), where a kit comes from ([`source`]: a directory, a zip,
//! a git URL), the deterministic zip ([`pack`]) and applying a kit to a
//! sandbox ([`apply`]). Loading never touches ppp's state; only
//! [`apply::apply`] does, after every check has passed.
//!
//! OCI references (`ppp kit push|pull`) belong to a separate `oci` module;
//! until it lands, an OCI reference is refused with a hint.

pub mod apply;
pub mod manifest;
pub mod oci;
pub mod pack;
pub mod source;

pub use apply::apply;
pub use manifest::{File, Kit, Manifest};
pub use source::{Loaded, load};
