//! `hutch template build|ls`: local template management.

use std::path::{Path, PathBuf};

use hutch_template::TemplateStore;

use super::output::{print_json, table};

/// Template subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TemplateCommand {
    /// Build a built-in template (`minimal`, `base`).
    Build {
        /// Template name.
        name: String,
        /// Templates directory (default `<state-dir>/templates`).
        #[arg(long)]
        templates_dir: Option<PathBuf>,
        /// Rebuild even if it is ready.
        #[arg(long)]
        force: bool,
    },
    /// Set the isolation of sandboxes created from a template when the request says
    /// `auto` or nothing (`auto` removes the default).
    SetIsolation {
        /// Template name.
        name: String,
        /// `auto`, `ns` or `vm`.
        isolation: String,
        /// Templates directory (default `<state-dir>/templates`).
        #[arg(long)]
        templates_dir: Option<PathBuf>,
    },
    /// List templates.
    Ls {
        /// Templates directory (default `<state-dir>/templates`).
        #[arg(long)]
        templates_dir: Option<PathBuf>,
    },
}

/// Run a template subcommand.
pub async fn run(cmd: TemplateCommand, state_dir: &Path, json_out: bool) -> anyhow::Result<()> {
    match cmd {
        TemplateCommand::Build {
            name,
            templates_dir,
            force,
        } => {
            let dir = templates_dir.unwrap_or_else(|| state_dir.join("templates"));
            std::fs::create_dir_all(&dir)?;
            let store = TemplateStore::open(&dir)?;
            let info = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
                crate::serve::build_template(&store, &name, false, force)?;
                Ok(store.get(&name))
            })
            .await??;
            if json_out {
                print_json(&serde_json::to_value(info)?);
            }
            Ok(())
        }
        TemplateCommand::SetIsolation {
            name,
            isolation,
            templates_dir,
        } => {
            let dir = templates_dir.unwrap_or_else(|| state_dir.join("templates"));
            let info = TemplateStore::open(&dir)?.set_isolation(&name, &isolation)?;
            if json_out {
                print_json(&serde_json::to_value(&info)?);
            } else {
                println!(
                    "template {name}: default isolation {}",
                    info.defaults.isolation.as_deref().unwrap_or("auto")
                );
            }
            Ok(())
        }
        TemplateCommand::Ls { templates_dir } => {
            let dir = templates_dir.unwrap_or_else(|| state_dir.join("templates"));
            let list = if dir.exists() {
                TemplateStore::open(&dir)?.list()?
            } else {
                vec![]
            };
            if json_out {
                print_json(&serde_json::json!({ "templates": list }));
                return Ok(());
            }
            let known = hutch_template::builtin_names();
            let mut rows: Vec<Vec<String>> = list
                .iter()
                .map(|t| {
                    vec![
                        t.name.clone(),
                        if t.ready { "ready" } else { "not ready" }.to_string(),
                        format!("{:.1} MiB", t.size_bytes as f64 / 1048576.0),
                        t.isolations.join(","),
                    ]
                })
                .collect();
            for k in known {
                if !list.iter().any(|t| t.name == *k) {
                    rows.push(vec![
                        k.to_string(),
                        "not built".into(),
                        "-".into(),
                        "-".into(),
                    ]);
                }
            }
            table(&["NAME", "STATUS", "SIZE", "ISOLATION"], &rows);
            Ok(())
        }
    }
}
