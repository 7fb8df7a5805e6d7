//! The names of the built-in templates: a leaf that the recipes (looked up by these names)
//! and the error messages (which list them) both read.

/// Names of the built-in templates, in the order they are documented.
pub fn builtin_names() -> &'static [&'static str] {
    &["minimal", "base", "code-interpreter"]
}
