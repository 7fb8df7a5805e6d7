//! Tests of the crate's public behaviour: plans, errors, the build context and cache keys.

mod cache_keys;
mod context;
mod errors;
mod every_instruction;
mod run_mounts;
mod stages;
mod substitution;

use std::collections::BTreeMap;

use crate::{plan, BuildPlan, Instruction, Step};

/// Plans `dockerfile` without build args, for the last stage; panics on errors.
pub(super) fn plan_ok(dockerfile: &str) -> BuildPlan {
    plan(dockerfile, &BTreeMap::new(), None).expect("the Dockerfile plans")
}

/// Build args from pairs.
pub(super) fn args(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The target stage's steps.
pub(super) fn steps(plan: &BuildPlan) -> &[Step] {
    &plan.target().steps
}

/// The `ENV` pairs of an instruction.
pub(super) fn env_of(instruction: &Instruction) -> Vec<(String, String)> {
    match instruction {
        Instruction::Env(pairs) => pairs.clone(),
        other => panic!("expected ENV, got {other:?}"),
    }
}

/// Owned strings.
pub(super) fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}
