//! The code interpreter's kernel driver (`driver.py`, with `node_boot.js` for `javascript`
//! contexts): the program inside a sandbox that runs stateful code contexts and serves them
//! on [`DRIVER_PORT`] of its loopback (`hutch_core::interp` is the host's side).
//!
//! It lives here because the `code-interpreter` template carries it: the recipe writes
//! [`driver_program`] to [`DRIVER_PATH`] and makes it the template's start command with the
//! Python kernel started before it listens ([`driver_service`]), so a sandbox (and, on `vm`,
//! every restore of the template's bake and every warm-pool guest) comes up with the kernel
//! running. In any other sandbox the host starts the same program on the first code call,
//! sending it on `python3`'s stdin.

use hutch_proto::{Command, ReadyCheck, ReadyProbe, ServiceSpec};

/// The driver's Python source.
pub const DRIVER_SOURCE: &str = include_str!("driver.py");
/// The Node.js side of its `javascript` contexts.
pub const NODE_BOOT_SOURCE: &str = include_str!("node_boot.js");
/// TCP port of the sandbox's loopback the driver listens on (E2B's code interpreter uses
/// the same one).
pub const DRIVER_PORT: u16 = 49999;
/// Where the driver records the contexts, on the sandbox's disk (not its `/tmp`, which an
/// `ns` wake empties).
pub const DRIVER_STATE_DIR: &str = "/var/lib/hutch-interp";
/// Where the `code-interpreter` template keeps the driver.
pub const DRIVER_PATH: &str = "/usr/local/lib/hutch/interp-driver.py";
/// Longest the template's driver may take to start its Python kernel and listen (ipykernel
/// takes about a second on `ns`, up to a minute in a `vm` guest under TCG).
const READY_TIMEOUT_MS: u64 = 300_000;

/// The whole program: `NODE_BOOT = "<node_boot.js>"`, then the driver.
pub fn driver_program() -> &'static str {
    static PROGRAM: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PROGRAM.get_or_init(|| {
        // A JSON string is a valid Python string literal.
        let js = serde_json::Value::String(NODE_BOOT_SOURCE.to_owned()).to_string();
        format!("NODE_BOOT = {js}\n{DRIVER_SOURCE}")
    })
}

/// The driver's arguments after the program: its port and state directory.
pub fn driver_args() -> Vec<String> {
    vec![
        "--port".into(),
        DRIVER_PORT.to_string(),
        "--state-dir".into(),
        DRIVER_STATE_DIR.into(),
    ]
}

/// The `code-interpreter` template's start command: the driver from [`DRIVER_PATH`], with
/// the default Python context's kernel started before it listens; ready once it listens.
pub fn driver_service() -> ServiceSpec {
    let mut argv = vec![
        "python3".to_owned(),
        "-u".to_owned(),
        DRIVER_PATH.to_owned(),
    ];
    argv.extend(driver_args());
    argv.extend(["--prestart".to_owned(), "python".to_owned()]);
    ServiceSpec {
        cmd: Command::Argv(argv),
        env: Default::default(),
        cwd: Some("/".into()),
        user: None,
        ready: Some(ReadyCheck {
            timeout_ms: READY_TIMEOUT_MS,
            ..ReadyCheck::new(ReadyProbe::Port(DRIVER_PORT))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_templates_start_command_runs_the_installed_driver_with_the_python_kernel() {
        let spec = driver_service();
        let Command::Argv(argv) = &spec.cmd else {
            panic!("argv")
        };
        assert_eq!(argv[2], DRIVER_PATH);
        assert!(argv.ends_with(&["--prestart".to_owned(), "python".to_owned()]));
    }
}
