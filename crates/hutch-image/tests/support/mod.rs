//! Helpers shared by this crate's integration tests (and included by `crates/hutch`'s
//! image-template test): crafted layers, and a real registry on loopback.
#![allow(dead_code)]

pub mod layers;
pub mod oci;
pub mod registry;
