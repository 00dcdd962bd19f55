//! ppp runs AI coding agents in isolated Podman Machine microVMs. All guest
//! egress is tunnelled over WireGuard to one host mitmdump, where ppp's addon
//! enforces network policy and injects API keys that never enter the guest.
//!
//! The binary is `src/main.rs`; this library exists so benchmarks and fuzz
//! targets can reach the pure modules (policy matching above all).

pub mod dirs;
pub mod env;
pub mod error;
pub mod secret;
pub mod state;
