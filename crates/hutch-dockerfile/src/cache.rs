//! Step cache keys: a step's key names its result, so an unchanged step after an
//! unchanged parent is a cache hit, and the first changed step (and every step after it)
//! is rebuilt.
//!
//! **Encoding (version 1).** A key is the hex sha256 of a sequence of fields, each written
//! as its name, a NUL byte, its length as 8 bytes big-endian, and its bytes:
//!
//! | field | bytes |
//! |---|---|
//! | `format` | `hutch-dockerfile step key v1` |
//! | `parent` | the parent key (the previous step's, or [`base_key`] for the first step) |
//! | `instruction` | the evaluated [`Instruction`] as JSON (so not its line or spacing) |
//! | `env` | the environment the step sees ([`Step::environment`]: ENV and ARGs, without the proxy build args), `KEY=value` joined by NUL |
//! | `workdir`, `user`, `shell` | the stage's, after the step (`shell` joined by NUL) |
//! | `config` | the whole configuration after the step as JSON (labels, ports, cmd…) |
//! | `inputs` | the hash of the files the step reads (`COPY`/`ADD`), or empty |
//!
//! A metadata step (`ENV`, `LABEL`…) has a key too, and it is the parent of the next step,
//! so changing it changes the keys of all later steps, as in Docker. Changing the version
//! string invalidates every key made before.

use sha2::{Digest, Sha256};

use crate::eval::PROXY_ARGS;
use crate::step::{Instruction, Step};

/// The version tag inside every key.
pub const STEP_KEY_FORMAT: &str = "hutch-dockerfile step key v1";

/// The key of step `step` after the step whose key is `parent_key`; `inputs_hash` is what
/// it reads ([`crate::Context::hash_entries`] for the context; for `COPY --from`, a hash of
/// the files taken from the other stage or image; for `ADD <url>`, of the download).
pub fn step_key(parent_key: &str, step: &Step, inputs_hash: Option<&str>) -> String {
    let mut hasher = Sha256::new();
    field(&mut hasher, "format", STEP_KEY_FORMAT.as_bytes());
    field(&mut hasher, "parent", parent_key.as_bytes());
    field(&mut hasher, "instruction", &json(&step.instruction));
    let env: Vec<String> = step
        .environment()
        .into_iter()
        .filter(|(name, _)| !PROXY_ARGS.contains(&name.as_str()))
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    field(&mut hasher, "env", env.join("\0").as_bytes());
    let config = &step.config;
    field(&mut hasher, "workdir", config.workdir.as_bytes());
    field(
        &mut hasher,
        "user",
        config.user.as_deref().unwrap_or_default().as_bytes(),
    );
    field(&mut hasher, "shell", config.shell.join("\0").as_bytes());
    field(&mut hasher, "config", &json(config));
    field(
        &mut hasher,
        "inputs",
        inputs_hash.unwrap_or_default().as_bytes(),
    );
    hex(&hasher.finalize())
}

/// The parent key of a stage's first step: a hash of what the stage starts from (the base
/// image's manifest digest, `scratch`, or the key of the last step of the base stage).
pub fn base_key(base_identity: &str) -> String {
    let mut hasher = Sha256::new();
    field(&mut hasher, "format", STEP_KEY_FORMAT.as_bytes());
    field(&mut hasher, "base", base_identity.as_bytes());
    hex(&hasher.finalize())
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("plan types serialize without maps keyed by non-strings")
}

/// Writes one named, length-prefixed field.
pub(crate) fn field(hasher: &mut Sha256, name: &str, bytes: &[u8]) {
    hasher.update(name.as_bytes());
    hasher.update([0u8]);
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

/// Lowercase hex of bytes.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

/// Whether a step's key needs an inputs hash: `COPY`/`ADD` with anything but
/// here-documents.
pub fn needs_inputs(step: &Step) -> bool {
    match &step.instruction {
        Instruction::Copy(copy) => copy
            .sources
            .iter()
            .any(|s| !matches!(s, crate::step::CopySource::Inline { .. })),
        _ => false,
    }
}
