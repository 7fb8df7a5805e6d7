//! `hutch serve --config FILE`: settings from a TOML file (`docs/configuration.md`).
//!
//! Each key of the file is a long flag name of `hutch serve` (`listen`, `object-store`;
//! `_` may stand for `-`) and its value what that flag takes: a string, an integer or a
//! float, `true` for a switch (`false` leaves it off), an array for a flag given several
//! times. The file only fills in what neither the command line nor the flag's environment
//! variable gave: **command line > environment > file > default**. It is read with the
//! `toml` crate and turned into the flags it stands for, so clap checks every value exactly
//! as it checks a flag (the same messages, the same types); an unknown key is an error naming
//! it, and so is a flag the file cannot set (`config` itself).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::parser::ValueSource;
use clap::{ArgAction, CommandFactory};

/// `raw` (the process's arguments) with the settings of `hutch serve --config FILE` added
/// as flags after `serve`; `raw` itself for any other command, or when it does not parse
/// (clap then reports why).
pub fn with_config_file(raw: Vec<OsString>) -> anyhow::Result<Vec<OsString>> {
    let cmd = crate::cli::Cli::command();
    let Ok(matches) = cmd.clone().try_get_matches_from(&raw) else {
        return Ok(raw);
    };
    let Some(("serve", serve)) = matches.subcommand() else {
        return Ok(raw);
    };
    let Some(path) = serve.get_one::<PathBuf>("config") else {
        return Ok(raw);
    };
    let serve_cmd = serve_flags(&cmd)?;
    let extra = flags_from_file(path, &serve_cmd, |id| {
        matches!(
            serve.value_source(id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        )
    })?;
    let at = raw
        .iter()
        .position(|a| a == "serve")
        .context("no serve in the arguments")?;
    let mut out = raw;
    out.splice(at + 1..at + 1, extra);
    Ok(out)
}

/// `serve` with its own flags and the global ones of `hutch` (`--state-dir`): what a file
/// may set.
fn serve_flags(cli: &clap::Command) -> anyhow::Result<clap::Command> {
    let mut serve = cli
        .find_subcommand("serve")
        .context("the serve command")?
        .clone();
    for global in cli.get_arguments().filter(|a| a.is_global_set()) {
        serve = serve.arg(global.clone());
    }
    Ok(serve)
}

/// The flags the TOML file at `path` stands for, for the flags of `cmd` that `given` (by
/// argument id) says were not given otherwise.
fn flags_from_file(
    path: &Path,
    cmd: &clap::Command,
    given: impl Fn(&str) -> bool,
) -> anyhow::Result<Vec<OsString>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--config {}: reading it", path.display()))?;
    let table: toml::Table = text
        .parse()
        .with_context(|| format!("--config {}: not valid TOML", path.display()))?;
    flags_from_table(&table, cmd, given).with_context(|| format!("--config {}", path.display()))
}

fn flags_from_table(
    table: &toml::Table,
    cmd: &clap::Command,
    given: impl Fn(&str) -> bool,
) -> anyhow::Result<Vec<OsString>> {
    let mut out = Vec::new();
    for (key, value) in table {
        let long = key.replace('_', "-");
        let Some(arg) = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()))
        else {
            bail!("`{key}` is not a flag of hutch serve (see hutch serve --help)");
        };
        if long == "config" {
            bail!("`config`: a configuration file cannot name another one");
        }
        if given(arg.get_id().as_str()) {
            continue;
        }
        let flag = format!("--{long}");
        let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
        match value {
            toml::Value::Boolean(on) if switch => {
                if *on {
                    out.push(flag.into());
                }
            }
            _ if switch => bail!("`{key}` is a switch: give it true or false"),
            toml::Value::Array(items) => {
                for item in items {
                    out.push(flag.clone().into());
                    out.push(scalar(key, item)?.into());
                }
            }
            v => {
                out.push(flag.into());
                out.push(scalar(key, v)?.into());
            }
        }
    }
    Ok(out)
}

/// A value as the flag's text.
fn scalar(key: &str, v: &toml::Value) -> anyhow::Result<String> {
    Ok(match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => bail!(
            "`{key}`: a {} is not a flag's value (give a string, a number, a boolean or an array of them)",
            other.type_str()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_cmd() -> clap::Command {
        serve_flags(&crate::cli::Cli::command()).expect("serve")
    }

    fn flags(toml_text: &str, given: &[&str]) -> anyhow::Result<Vec<String>> {
        let table: toml::Table = toml_text.parse().expect("TOML");
        let out = flags_from_table(&table, &serve_cmd(), |id| given.contains(&id))?;
        Ok(out
            .into_iter()
            .map(|s| s.into_string().expect("utf-8"))
            .collect())
    }

    #[test]
    fn keys_become_the_flags_they_name() {
        let got = flags(
            "listen = \"0.0.0.0:7700\"\ndefault_ttl = 900\nno-build-base = true\nvm-warm = 0\n\
             allowed-registry = [\"ghcr.io\", \"registry.internal:5000\"]\n\
             usage-interval-seconds = 2.5\nobject-store = \"file:///srv/objects\"\n\
             state-dir = \"/var/lib/hutch\"",
            &[],
        )
        .expect("flags");
        for pair in [
            ["--listen", "0.0.0.0:7700"],
            ["--default-ttl", "900"],
            ["--vm-warm", "0"],
            ["--usage-interval-seconds", "2.5"],
            ["--object-store", "file:///srv/objects"],
            ["--state-dir", "/var/lib/hutch"],
            ["--allowed-registry", "ghcr.io"],
            ["--allowed-registry", "registry.internal:5000"],
        ] {
            assert!(got.windows(2).any(|w| w == pair), "{pair:?} in {got:?}");
        }
        assert!(got.contains(&"--no-build-base".to_string()), "{got:?}");
    }

    #[test]
    fn what_the_command_line_or_environment_gave_is_left_alone() {
        let got =
            flags("listen = \"0.0.0.0:7700\"\ndefault-ttl = 900", &["listen"]).expect("flags");
        assert_eq!(got, ["--default-ttl", "900"]);
        let off = flags("no-build-base = false", &[]).expect("flags");
        assert!(off.is_empty(), "{off:?}");
    }

    #[test]
    fn bad_keys_and_values_are_named() {
        let err = |t: &str| flags(t, &[]).expect_err(t).to_string();
        assert!(err("lisen = \"x\"").contains("`lisen` is not a flag of hutch serve"));
        assert!(err("config = \"/etc/other.toml\"").contains("cannot name another"));
        assert!(err("no-build-base = \"yes\"").contains("is a switch"));
        assert!(err("[server]\nnode-id = \"a\"").contains("`server` is not a flag"));
        assert!(err("listen = { host = \"x\" }").contains("a table is not a flag's value"));
    }
}
