//! The shared harness of Hutch's integration tests (a dev-dependency, never shipped).
//!
//! - [`TestServer`]: a real `hutch serve` on `127.0.0.1:0` with a temporary state
//!   directory, the shared templates, its admin key and an HTTP client; dropping it deletes
//!   every sandbox and snapshot through the API, stops the server and removes the state
//!   directory (it panics if mounts are left under it).
//!   [`TestServer::tenant`] and [`TestServer::tenant_key`] make tenants and keys through the
//!   API, [`TestServer::request_as`] calls with another key.
//! - [`SmallDisk`]: a small loop-mounted filesystem of the test's own, to fill (a full
//!   state disk), unmounted and detached when dropped.
//! - [`TestCa`]: a CA of the test's own and a server certificate it signed, for
//!   `hutch serve --tls-cert` ([`TestServer::trust_root`] makes the clients trust it).
//! - [`PrivatePostgres`]: a PostgreSQL server of the test's own (cluster-mode tests).
//! - [`wait_until`]: polling instead of sleeping (and [`wait_until_blocking`] for tests
//!   without a runtime).
//! - [`both_backends!`]: one behaviour case, an `ns` and a `vm` test; the `vm` one skips,
//!   saying why, where `hutch doctor` says the vm backend cannot run.
//! - Paths of what is under test ([`hutch_bin`], [`agent_bin`]) and of the caches shared by
//!   every test on the machine ([`templates_dir`], [`vm_cache_dir`]), and programs for the
//!   tests ([`static_c_binary`], [`path_without`]).
//!
//! See `docs/testing.md`.

mod backends;
mod builds;
mod e2b;
mod host;
mod paths;
mod postgres;
mod programs;
mod s3;
mod server;
mod small_disk;
mod tenants;
mod tls;
mod wait;

pub use backends::{on, skip_without_vm, vm_unavailable};
pub use builds::{context_of, dockerfile_context};
pub use e2b::{e2b_python, e2b_scenario};
pub use host::{
    assert_no_processes_or_cgroups, cgroup_frozen, cgroups_of, loop_devices_under, processes_of,
};
pub use paths::{
    agent_bin, ensure_template, hutch_bin, private_templates, repo_root, templates_dir,
    vm_cache_dir,
};
pub use postgres::PrivatePostgres;
pub use programs::{path_without, static_c_binary};
pub use s3::S3Server;
pub use server::TestServer;
pub use small_disk::SmallDisk;
pub use tls::TestCa;
pub use wait::{wait_until, wait_until_blocking};
