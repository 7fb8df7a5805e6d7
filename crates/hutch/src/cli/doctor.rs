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
    let vm = vm_line(agent.is_ok());
    let auto = match (&vm, ns_ok) {
        (Ok(true), _) => "vm",
        (_, true) => "ns",
        _ => "none",
    };
    let out = json!({
        "host": report_json,
        "agent": agent_json,
        "templates": templates,
        "isolation": {
            "ns": ns_ok,
            "vm": vm.is_ok(),
            "vm_detail": match &vm { Ok(_) => vm_why(), Err(e) => e.clone() },
            "auto": auto,
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
        match &vm {
            Ok(_) => println!("ok   vm: {}", vm_why()),
            Err(e) => println!("--   vm: {e}"),
        }
        println!("auto isolation: {auto}");
    }
    Ok(if ns_ok { 0 } else { 1 })
}

/// Whether vm sandboxes can run here (`Ok(true)` when KVM is likely, so `auto` may pick vm
/// once the server's probe guest boots), or why not.
fn vm_line(agent_ok: bool) -> Result<bool, String> {
    let version = hutch_vm::qemu::check_version(std::path::Path::new(hutch_vm::qemu::QEMU_BINARY))
        .map_err(|e| format!("unavailable: {e}"))?;
    if !agent_ok {
        return Err(format!(
            "QEMU {version} found but the static agent is missing"
        ));
    }
    let host = hutch_vm::accel::host_virt();
    Ok(hutch_vm::accel::choose_without_probe(&host).is_none())
}

/// The one-line acceleration explanation.
fn vm_why() -> String {
    let host = hutch_vm::accel::host_virt();
    match hutch_vm::accel::choose_without_probe(&host) {
        Some(choice) => format!("{}; so auto = ns, vm is opt-in", choice.why),
        None => "the CPU has hardware virtualization and /dev/kvm opens; `hutch serve` boots a probe guest and uses KVM (and auto = vm) if it answers".into(),
    }
}
