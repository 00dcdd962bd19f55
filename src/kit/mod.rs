//! Kits: declarative sandbox extensions. Placeholder for the kit module;
//! on this branch it holds only the OCI transport, [`oci`].

pub mod oci;
