//! `hutch doctor`: what isolation this host supports, and why.

use std::path::Path;

use serde_json::{json, Value};

use super::output::print_json;

/// Print the host report; exit code 0 when `ns` sandboxes can run here.
pub async fn doctor(state_dir: &Path, json_out: bool) -> anyhow::Result<i32> {
    let report = tokio::task::spawn_blocking(hutch_jail::host_report).await?;
    let report_json = serde_json::to_value(&report)?;
    let agent = crate::paths::find_agent(None);
    let agent_json = match &agent {
        Ok(p) => json!({"ok": true, "detail": format!("static agent at {}", p.display())}),
        Err(e) => json!({"ok": false, "detail": format!("{e:#}")}),
    };
    let templates_dir = state_dir.join("templates");
    let templates: Vec<Value> = hutch_template::TemplateStore::open(&templates_dir)
        .and_then(|s| s.list())
        .map(|l| {
            l.into_iter()
                .map(|t| json!({"name": t.name, "ready": t.ready}))
                .collect()
        })
        .unwrap_or_default();
    let ns_ok = report.ns_supported() && agent.is_ok();
    let out = json!({
        "host": report_json,
        "agent": agent_json,
        "templates": templates,
        "isolation": {
            "ns": ns_ok,
            "vm": false,
            "auto": if ns_ok { "ns" } else { "none" },
            "why": report.isolation_summary(),
        }
    });
    if json_out {
        print_json(&out);
    } else {
        for line in report.human_lines() {
            println!("{line}");
        }
        println!(
            "{} agent: {}",
            if agent.is_ok() { "ok  " } else { "FAIL" },
            agent_json["detail"].as_str().unwrap_or("")
        );
        if templates.is_empty() {
            println!(
                "--   templates: none built in {} (hutch template build minimal)",
                templates_dir.display()
            );
        }
        for t in &templates {
            println!(
                "{} template {}",
                if t["ready"] == true { "ok  " } else { "--  " },
                t["name"].as_str().unwrap_or("?")
            );
        }
        println!("isolation: {}", report.isolation_summary());
    }
    Ok(if ns_ok { 0 } else { 1 })
}
