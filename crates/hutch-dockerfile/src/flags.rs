//! Instruction options (`--from=…`, `--chmod=…`): each instruction names the ones it
//! takes; an unknown or repeated option is refused naming the instruction.

use std::collections::BTreeMap;

use parse_dockerfile::Flag;

use crate::error::DockerfileError;
use crate::source::Located;

/// The options given to one instruction, checked against the ones it takes.
pub(crate) struct Flags {
    values: BTreeMap<String, Option<String>>,
    /// Options that may be given more than once (`RUN --mount`), in order.
    repeated: BTreeMap<String, Vec<Option<String>>>,
}

impl Flags {
    /// Checks `options` against `known` (names without `--`). Names in `unsupported` are
    /// Docker options Hutch does not build; they are refused with `why`.
    pub(crate) fn check(
        options: &[Flag<'_>],
        keyword: &str,
        known: &[&str],
        unsupported: &[(&str, &str)],
        at: &Located,
    ) -> Result<Self, DockerfileError> {
        Self::check_repeatable(options, keyword, known, &[], unsupported, at)
    }

    /// [`Flags::check`], where the names in `repeatable` (also in `known`) may be given
    /// more than once ([`Flags::all`] reads them).
    pub(crate) fn check_repeatable(
        options: &[Flag<'_>],
        keyword: &str,
        known: &[&str],
        repeatable: &[&str],
        unsupported: &[(&str, &str)],
        at: &Located,
    ) -> Result<Self, DockerfileError> {
        let mut values = BTreeMap::new();
        let mut repeated: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
        for flag in options {
            let name = flag.name.value.as_ref();
            if let Some((_, why)) = unsupported.iter().find(|(n, _)| *n == name) {
                return Err(at.unsupported(&format!("{keyword} --{name}"), why));
            }
            if !known.contains(&name) {
                let takes = if known.is_empty() {
                    format!("{keyword} takes no options")
                } else {
                    let list: Vec<String> = known.iter().map(|k| format!("--{k}")).collect();
                    format!("{keyword} takes {}", list.join(", "))
                };
                return Err(at.invalid(format!("unknown option --{name} ({takes})")));
            }
            let value = flag.value.as_ref().map(|v| v.value.to_string());
            if repeatable.contains(&name) {
                repeated.entry(name.to_owned()).or_default().push(value);
            } else if values.insert(name.to_owned(), value).is_some() {
                return Err(at.invalid(format!("--{name} is given twice")));
            }
        }
        Ok(Self { values, repeated })
    }

    /// Every value of a repeatable option, in order; a bare one is an error.
    pub(crate) fn all(&self, name: &str, at: &Located) -> Result<Vec<&str>, DockerfileError> {
        let Some(given) = self.repeated.get(name) else {
            return Ok(Vec::new());
        };
        given
            .iter()
            .map(|v| {
                v.as_deref()
                    .ok_or_else(|| at.invalid(format!("--{name} needs a value (--{name}=…)")))
            })
            .collect()
    }

    /// An option that needs a value: `None` when absent, an error when given bare.
    pub(crate) fn value(&self, name: &str, at: &Located) -> Result<Option<&str>, DockerfileError> {
        match self.values.get(name) {
            None => Ok(None),
            Some(Some(v)) => Ok(Some(v.as_str())),
            Some(None) => Err(at.invalid(format!("--{name} needs a value (--{name}=…)"))),
        }
    }

    /// Whether a (boolean) option is present, and its raw value.
    pub(crate) fn raw(&self, name: &str) -> Option<Option<&str>> {
        self.values.get(name).map(|v| v.as_deref())
    }
}
