//! Built-in recipes: how each named template's root filesystem is produced.
//!
//! A recipe fills an empty `rootfs` directory, reporting steps and tool output through a
//! [`BuildContext`]; the store takes care of the build directory, metadata, atomic
//! publication and cleanup.

mod apt_sources;
mod base;
pub(crate) mod command;
pub(crate) mod layout;
mod minimal;

use std::collections::BTreeMap;
use std::path::Path;

use crate::build::BuildContext;
use crate::error::Result;
use crate::info::ResourceDefaults;

/// One built-in recipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recipe {
    /// Static busybox on an empty root.
    Minimal,
    /// Debian 12 via debootstrap.
    Base,
    /// `base` plus a Python Jupyter kernel with numpy, pandas and matplotlib, and Node.js:
    /// the code interpreter's template.
    CodeInterpreter,
}

impl Recipe {
    /// The recipe for a built-in template name.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        match name {
            "minimal" => Some(Self::Minimal),
            "base" => Some(Self::Base),
            "code-interpreter" => Some(Self::CodeInterpreter),
            _ => None,
        }
    }

    /// The recipe's name, recorded in `template.json`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Minimal => "minimal",
            Self::Base => "base",
            Self::CodeInterpreter => "code-interpreter",
        }
    }

    /// Bumped whenever the recipe's output or defaults change, so cached builds are redone.
    pub(crate) fn revision(self) -> u32 {
        match self {
            // 2: PATH includes /usr/local.
            Self::Minimal => 2,
            Self::Base => 1,
            // 2: the kernel driver in the template, started (with the Python kernel) by its
            // start command. 3: JavaScript cells declare again and await at the top.
            // 4: R and IRkernel, and `r` contexts in the driver. 5: the driver's kernel base
            // class is abstract (no behaviour change).
            // The driver is in the template: any change of it needs a new revision (the
            // test `a_driver_change_comes_with_a_new_revision` says so).
            Self::CodeInterpreter => 5,
        }
    }

    /// One-line description shown by the API.
    pub(crate) fn description(self) -> String {
        match self {
            Self::Minimal => String::from("BusyBox (static) on an empty root: /bin/sh and core utilities"),
            Self::Base => format!(
                "Debian 12 ({}) with python3, pip, venv, git, curl, ca-certificates and build-essential",
                base::SUITE
            ),
            Self::CodeInterpreter => format!(
                "Debian 12 ({}) like base, with a Python Jupyter kernel (ipykernel), numpy, pandas, matplotlib, R with IRkernel, and Node.js",
                base::SUITE
            ),
        }
    }

    /// Default sandbox resources.
    pub(crate) fn defaults(self) -> ResourceDefaults {
        let env = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        match self {
            Self::Minimal => ResourceDefaults {
                cpus: 1.0,
                memory_mib: 256,
                disk_mib: 512,
                pids_max: 256,
                env: env(&[(
                    "PATH",
                    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                )]),
                isolation: None,
                exec: hutch_proto::ExecDefaults::default(),
            },
            Self::Base | Self::CodeInterpreter => ResourceDefaults {
                cpus: 1.0,
                memory_mib: if self == Self::Base { 512 } else { 1024 },
                disk_mib: 2048,
                pids_max: 1024,
                env: env(&[
                    (
                        "PATH",
                        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    ),
                    ("LANG", "C.UTF-8"),
                ])
                .into_iter()
                // Charts render to files (PNG), never to a display.
                .chain((self == Self::CodeInterpreter).then(|| ("MPLBACKEND".into(), "Agg".into())))
                .collect(),
                isolation: None,
                exec: hutch_proto::ExecDefaults::default(),
            },
        }
    }

    /// The start command the recipe gives its template when the build names none.
    pub(crate) fn start(self) -> Option<hutch_proto::ServiceSpec> {
        (self == Self::CodeInterpreter).then(crate::interp::driver_service)
    }

    /// Fills the empty directory `rootfs`.
    pub(crate) fn build(self, rootfs: &Path, ctx: &mut BuildContext<'_>) -> Result<()> {
        match self {
            Self::Minimal => minimal::build(rootfs, ctx),
            Self::Base => base::build(rootfs, ctx),
            Self::CodeInterpreter => {
                base::build_with(rootfs, base::CODE_INTERPRETER_PACKAGES, ctx)?;
                ctx.step("installing the kernel driver")?;
                let rel = crate::interp::DRIVER_PATH.trim_start_matches('/');
                layout::write_file(rootfs, rel, crate::interp::driver_program(), 0o644)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Recipe;

    /// FNV-1a of the driver the `code-interpreter` template carries, at its revision.
    const DRIVER_AT_REVISION: (u32, u64) = (5, 0xd164_b7ff_e822_2ac1);

    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }

    #[test]
    fn a_driver_change_comes_with_a_new_revision() {
        let hash = fnv1a(crate::interp::driver_program().as_bytes());
        assert_eq!(
            (Recipe::CodeInterpreter.revision(), hash),
            DRIVER_AT_REVISION,
            "the kernel driver changed: bump Recipe::CodeInterpreter's revision (templates built \
             with the old driver are then rebuilt) and set DRIVER_AT_REVISION to ({}, {hash:#x})",
            Recipe::CodeInterpreter.revision() + 1
        );
    }
}
