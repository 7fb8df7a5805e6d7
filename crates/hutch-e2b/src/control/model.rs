//! The control plane's JSON, in E2B's names (`spec/openapi.yml`: camelCase, except
//! `allow_internet_access` in requests, as E2B spells it).

use std::collections::BTreeMap;

use hutch_core::model::{SandboxState, SandboxView};
use serde::{Deserialize, Serialize};

use crate::target::PRIVATE_TRAFFIC_KEY;
use crate::{E2bState, ENVD_VERSION};

/// Metadata keys this adapter keeps for itself on a sandbox (never shown to E2B clients).
pub const ADAPTER_PREFIX: &str = "e2b.";
/// The metadata key naming the template as the client asked for it (an alias such as
/// `code-interpreter-v1`, or a snapshot id).
pub const TEMPLATE_KEY: &str = "e2b.template";

/// `NewSandbox` / `NewSandboxV2`.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// Template (a Hutch template name, an E2B alias, or a snapshot id).
    #[serde(rename = "templateID")]
    pub template_id: Option<String>,
    /// Seconds until it is killed.
    pub timeout: Option<u64>,
    /// Pause instead of kill at the timeout (not supported).
    pub auto_pause: Option<bool>,
    /// Whether envd requests need the access token: always, in Hutch (as in E2B's v2 API,
    /// "always secured"), so it is accepted and not read.
    #[allow(dead_code)]
    pub secure: Option<bool>,
    /// `false`: no egress at all.
    #[serde(rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// Egress policy.
    pub network: Option<NetworkConfig>,
    /// Free-form metadata.
    pub metadata: Option<BTreeMap<String, String>>,
    /// Environment of every process.
    pub env_vars: Option<BTreeMap<String, String>>,
    /// Volumes (names) to mount.
    pub volume_mounts: Option<Vec<VolumeMount>>,
    /// Everything else E2B knows (`mcp`, `iam`, `autoResume`, …): refused when set.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// `SandboxNetworkConfig` (and the update form).
#[derive(Debug, Deserialize, Serialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// Reachable whatever `denyOut` says: CIDRs, IPs, domains (`*.example.com`).
    #[serde(default)]
    pub allow_out: Option<Vec<String>>,
    /// Unreachable: CIDRs, IPs (`0.0.0.0/0`: everything not allowed).
    #[serde(default)]
    pub deny_out: Option<Vec<String>>,
    /// Whether the sandbox's ports are reachable without the traffic token (default true).
    #[serde(default)]
    pub allow_public_traffic: Option<bool>,
    /// Everything else (`egressProxy`, `rules`, `maskRequestHost`, …): refused when set.
    #[serde(flatten, skip_serializing)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// A volume mount.
#[derive(Debug, Deserialize, Serialize, Clone)]
pub struct VolumeMount {
    /// Volume name or id.
    pub name: String,
    /// Where inside.
    pub path: String,
}

/// `Sandbox`: what create and connect answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    envd_version: &'static str,
    envd_access_token: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    traffic_access_token: Option<String>,
    domain: String,
}

/// `ListedSandbox` and `SandboxDetail` (the detail adds the token, network and lifecycle).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxInfo {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    started_at: String,
    end_at: String,
    cpu_count: u64,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    metadata: BTreeMap<String, String>,
    state: &'static str,
    envd_version: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    envd_access_token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allow_internet_access: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    domain: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lifecycle: Option<serde_json::Value>,
}

/// The template a client knows a sandbox by.
pub fn template_of(view: &SandboxView) -> String {
    view.metadata
        .get(TEMPLATE_KEY)
        .cloned()
        .unwrap_or_else(|| view.template.clone())
}

/// E2B's state of a Hutch sandbox: `paused` for frozen and hibernated ones.
pub fn state_of(state: SandboxState) -> &'static str {
    match state {
        SandboxState::Paused | SandboxState::Hibernated => "paused",
        _ => "running",
    }
}

/// The client's metadata: without the adapter's keys and the tenant.
pub fn client_metadata(view: &SandboxView) -> BTreeMap<String, String> {
    view.metadata
        .iter()
        .filter(|(k, _)| {
            !k.starts_with(ADAPTER_PREFIX) && k.as_str() != hutch_core::model::TENANT_KEY
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl Sandbox {
    /// The create/connect answer for `view`.
    pub fn of(state: &E2bState, view: &SandboxView) -> Self {
        let private = view.metadata.get(PRIVATE_TRAFFIC_KEY).map(String::as_str) == Some("true");
        Self {
            template_id: template_of(view),
            sandbox_id: view.id.to_string(),
            client_id: "hutch",
            envd_version: ENVD_VERSION,
            envd_access_token: state.access_token(&view.id),
            traffic_access_token: private.then(|| crate::target::traffic_token(state, &view.id)),
            domain: state.public_domain(),
        }
    }
}

impl SandboxInfo {
    /// The listing row (`detail`: the `GET /sandboxes/{id}` answer) for `view`.
    pub fn of(state: &E2bState, view: &SandboxView, detail: bool) -> Self {
        let end_at = view
            .expires_at
            .clone()
            // A persistent sandbox is never reaped: E2B has no such thing, so a far end.
            .unwrap_or_else(|| "9999-12-31T23:59:59Z".to_string());
        let spec = view.network.network.policy.to_spec();
        let internet = spec.egress == hutch_core::net::policy::Egress::Allow;
        Self {
            template_id: template_of(view),
            sandbox_id: view.id.to_string(),
            client_id: "hutch",
            started_at: view.created_at.clone(),
            end_at,
            cpu_count: view.cpus.ceil().max(1.0) as u64,
            memory_mb: view.memory_mib,
            disk_size_mb: view.disk_mib,
            metadata: client_metadata(view),
            state: state_of(view.state),
            envd_version: ENVD_VERSION,
            envd_access_token: detail.then(|| state.access_token(&view.id)),
            allow_internet_access: detail.then_some(internet),
            domain: detail.then(|| state.public_domain()),
            network: detail.then(|| {
                let mut deny = spec.deny.clone();
                if spec.egress != hutch_core::net::policy::Egress::Allow {
                    deny.push(ALL_TRAFFIC.to_string());
                }
                serde_json::json!({"allowOut": spec.allow, "denyOut": deny})
            }),
            lifecycle: detail
                .then(|| serde_json::json!({"autoResume": false, "onTimeout": "kill"})),
        }
    }
}

/// E2B's name for every address.
pub const ALL_TRAFFIC: &str = "0.0.0.0/0";
