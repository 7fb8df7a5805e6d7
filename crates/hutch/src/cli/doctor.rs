//! `hutch doctor`: what isolation this host supports, and why.

use std::path::Path;

use serde_json::{json, Value};

use super::output::print_json;

/// A program a part of Hutch runs, and the Debian package that provides it.
struct Tool {
    command: &'static str,
    package: &'static str,
    /// What needs it: `ns`, `vm`, `network`, `ns_disk_quota`, `volumes`, `templates`.
    needed_for: &'static str,
}

/// Every program the server runs on the host, by the feature that needs it.
const TOOLS: &[Tool] = &[
    Tool {
        command: "qemu-system-x86_64",
        package: "qemu-system-x86",
        needed_for: "vm",
    },
    Tool {
        command: "qemu-img",
        package: "qemu-utils",
        needed_for: "vm",
    },
    Tool {
        command: "mkfs.ext4",
        package: "e2fsprogs",
        needed_for: "vm",
    },
    Tool {
        command: "apt-get",
        package: "apt",
        needed_for: "vm",
    },
    Tool {
        command: "nft",
        package: "nftables",
        needed_for: "network",
    },
    Tool {
        command: "mkfs.btrfs",
        package: "btrfs-progs",
        needed_for: "ns_disk_quota",
    },
    Tool {
        command: "mkfs.ext4",
        package: "e2fsprogs",
        needed_for: "volumes",
    },
    Tool {
        command: "e2fsck",
        package: "e2fsprogs",
        needed_for: "volumes",
    },
    Tool {
        command: "tune2fs",
        package: "e2fsprogs",
        needed_for: "volumes",
    },
    Tool {
        command: "setpriv",
        package: "util-linux",
        needed_for: "volumes",
    },
    Tool {
        command: "bwrap",
        package: "bubblewrap",
        needed_for: "volumes",
    },
    Tool {
        command: "busybox",
        package: "busybox-static",
        needed_for: "templates",
    },
    Tool {
        command: "debootstrap",
        package: "debootstrap",
        needed_for: "templates",
    },
];

/// The tools `needed_for` lacks, as "command (apt-get install package)" lines.
fn missing_for(needed_for: &str) -> Vec<String> {
    TOOLS
        .iter()
        .filter(|t| {
            t.needed_for == needed_for && hutch_core::host::find_program(t.command).is_none()
        })
        .map(|t| format!("{} (apt-get install {})", t.command, t.package))
        .collect()
}

/// Print the host report; exit code 0 when `ns` sandboxes can run here.
pub async fn doctor(state_dir: &Path, json_out: bool) -> anyhow::Result<i32> {
    let report = tokio::task::spawn_blocking(hutch_core::host::report).await?;
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
    let network = network_line();
    let disk = disk_quota_line(state_dir);
    let tools: Vec<Value> = TOOLS
        .iter()
        .map(|t| {
            let found = hutch_core::host::find_program(t.command);
            json!({
                "command": t.command,
                "package": t.package,
                "needed_for": t.needed_for,
                "found": found.is_some(),
                "path": found.map(|p| p.display().to_string()),
            })
        })
        .collect();
    let backend = |available: bool, why: String| json!({"available": available, "detail": why});
    let backends = json!({
        "ns": backend(ns_ok, if ns_ok { report.isolation_summary() } else {
            format!("unavailable: {}", if agent.is_ok() { report.isolation_summary() } else { agent_json["detail"].as_str().unwrap_or("").to_string() })
        }),
        "vm": backend(vm.is_ok(), match &vm { Ok(_) => vm_why(), Err(e) => e.clone() }),
    });
    let volumes_missing = missing_for("volumes");
    let templates_missing = missing_for("templates");
    let out = json!({
        "backends": backends,
        "tools": tools,
        "volumes": {"ok": volumes_missing.is_empty(), "missing": volumes_missing},
        "template_builds": {"ok": templates_missing.is_empty(), "missing": templates_missing},
        "network": {"ok": network.is_ok(), "detail": match &network { Ok(d) | Err(d) => d.clone() }},
        "ns_disk_quota": {"enforced": disk.is_ok(), "detail": match &disk { Ok(d) | Err(d) => d.clone() }},
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
        match &network {
            Ok(d) => println!("ok   network: {d}"),
            Err(d) => println!("--   network: {d}"),
        }
        match &disk {
            Ok(d) => println!("ok   ns disk quota: {d}"),
            Err(d) => println!("--   ns disk quota: {d}"),
        }
        match volumes_missing.as_slice() {
            [] => println!("ok   volumes: e2fsprogs, util-linux and bubblewrap found"),
            m => println!("--   volumes: missing {}", m.join(", ")),
        }
        match templates_missing.as_slice() {
            [] => println!("ok   template builds: busybox and debootstrap found"),
            m => println!("--   template builds: missing {}", m.join(", ")),
        }
        println!("auto isolation: {auto}");
    }
    Ok(if ns_ok { 0 } else { 1 })
}

/// Whether vm sandboxes can run here (`Ok(true)` when KVM is likely, so `auto` may pick vm
/// once the server's probe guest boots), or why not.
fn vm_line(agent_ok: bool) -> Result<bool, String> {
    hutch_core::host::vm_support(&missing_for("vm"), agent_ok)
}

/// The one-line acceleration explanation.
fn vm_why() -> String {
    hutch_core::host::vm_acceleration()
}

/// Whether `hutch serve --network on` can give sandboxes a network here: `nft` (the egress
/// policy), network namespaces, IPv4 forwarding.
fn network_line() -> Result<String, String> {
    let nft = std::process::Command::new("nft")
        .arg("--version")
        .output()
        .map_err(|_| {
            "nft is missing (apt-get install nftables); run hutch serve --network off or install it"
                .to_string()
        })?;
    let version = String::from_utf8_lossy(&nft.stdout).trim().to_string();
    let netns = std::thread::spawn(|| {
        // SAFETY: unshare(CLONE_NEWNET) moves only this short-lived thread.
        unsafe { libc::unshare(libc::CLONE_NEWNET) == 0 }
    })
    .join()
    .unwrap_or(false);
    if !netns {
        return Err("cannot create network namespaces (needs root); sandboxes get loopback only with --network off".into());
    }
    let forward = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap_or_default();
    Ok(format!(
        "{version}; a namespace, veth and /30 per sandbox, policy in table inet hutch; IPv4 forwarding is {} (hutch serve turns it on)",
        if forward.trim() == "1" { "on" } else { "off" }
    ))
}

/// Whether `hutch serve` on `state_dir` enforces `disk_mib` on ns sandboxes, or why not.
/// Reads `HUTCH_NS_DISK_POOL_GIB` as `hutch serve --ns-disk-pool-gib` does.
fn disk_quota_line(state_dir: &Path) -> Result<String, String> {
    let gib = std::env::var("HUTCH_NS_DISK_POOL_GIB")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    hutch_core::host::ns_disk_quota(state_dir, gib)
}
