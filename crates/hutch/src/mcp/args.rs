//! The tools' arguments. Field docs are the schema descriptions a model reads. Every type
//! rejects unknown fields, and every optional field takes `null` (strict tool schemas list
//! every property as required: see `schema.rs`).

use schemars::JsonSchema;
use serde::Deserialize;

use super::policy::EgressChoice;

/// Where a sandbox runs.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    // The server picks.
    Auto,
    // Linux namespaces (fast; shares the host kernel).
    Ns,
    // A microVM with its own kernel.
    Vm,
}

impl Isolation {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::Auto => "auto",
            Isolation::Ns => "ns",
            Isolation::Vm => "vm",
        }
    }
}

/// One environment variable.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    /// Variable name, e.g. `PYTHONUNBUFFERED`.
    pub name: String,
    /// Its value.
    pub value: String,
}

/// `create_sandbox` arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateArgs {
    /// Template: `base` (Debian 12 with python3, pip, git, curl, build tools) or `minimal` (busybox). null: this MCP server's default.
    pub template: Option<String>,
    /// Start from this snapshot's files (a `snap_…` id from snapshot_sandbox) instead of the bare template.
    pub snapshot: Option<String>,
    /// `ns` (namespaces), `vm` (microVM) or `auto`. null: the server's default.
    pub isolation: Option<Isolation>,
    /// Network default for destinations no list names: `none` (loopback only), `deny` (only `allow` entries are reachable) or `allow`. null: this MCP server's default (see the tool description). You cannot ask for more than that default allows.
    pub egress: Option<EgressChoice>,
    /// Destinations always reachable: domain names (`pypi.org`), `*.suffix` wildcards, IPv4 addresses or CIDRs. Only entries this MCP server allows are accepted. null: the server's allow list.
    pub allow: Option<Vec<String>>,
    /// Destinations never reachable (unless allowed), added to the server's deny list.
    pub deny: Option<Vec<String>>,
    /// Keep the sandbox after this session ends and never expire it. null: false.
    pub persistent: Option<bool>,
    /// Seconds of inactivity before an ephemeral sandbox is destroyed. null: 300.
    pub ttl_seconds: Option<u64>,
    /// CPU limit (may be fractional, e.g. 0.5).
    pub cpus: Option<f64>,
    /// Memory limit in MiB.
    pub memory_mib: Option<u64>,
    /// Disk limit in MiB for what the sandbox writes.
    pub disk_mib: Option<u64>,
    /// Environment variables for every command, as name/value pairs.
    pub env: Option<Vec<EnvVar>>,
}

/// `run_command` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunArgs {
    /// The sandbox to use. null: the sandbox this session used last (one is created if there is none).
    pub sandbox_id: Option<String>,
    /// A shell command line, run with `/bin/sh -c`. Give either this or `argv`.
    pub command: Option<String>,
    /// A program and its arguments, run directly without a shell. Give either this or `command`.
    pub argv: Option<Vec<String>>,
    /// Working directory (absolute path).
    pub cwd: Option<String>,
    /// Text to send on the command's standard input.
    pub stdin: Option<String>,
    /// Kill the command after this many seconds (null: 60). It then reports exit code 124.
    pub timeout_seconds: Option<f64>,
}

/// `run_python` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PythonArgs {
    /// The sandbox to use (null: the last one used; created if none).
    pub sandbox_id: Option<String>,
    /// Python source code to run with `python3`.
    pub code: String,
    /// Kill it after this many seconds (null: 60).
    pub timeout_seconds: Option<f64>,
}

/// `run_code` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeArgs {
    /// The sandbox to use (null: the last one used; a `code-interpreter` sandbox is created if none).
    pub sandbox_id: Option<String>,
    /// The code: a notebook cell. Variables, imports and loaded data stay for the next call; the value of the last expression is returned.
    pub code: String,
    /// `python` (null), `r` (where the template has R), `bash` or `javascript`: each language
    /// has its own persistent session.
    pub language: Option<String>,
    /// Interrupt the cell after this many seconds; its variables are kept (null: 60).
    pub timeout_seconds: Option<f64>,
}

/// `read_file` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// The sandbox (null: the last one used).
    pub sandbox_id: Option<String>,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// First byte to read (null: 0).
    pub offset: Option<u64>,
    /// How many bytes to read from `offset` (null: to the end). Long answers are cut in the middle; the cut says which bytes to ask for next.
    pub length: Option<u64>,
}

/// `write_file` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// The sandbox (null: the last one used; created if none).
    pub sandbox_id: Option<String>,
    /// Absolute path inside the sandbox; parent directories are created.
    pub path: String,
    /// The file's full new content (text).
    pub content: String,
    /// Permission bits in octal, e.g. "0755" for a script. null: "0644".
    pub mode: Option<String>,
}

/// `list_files` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// The sandbox (null: the last one used).
    pub sandbox_id: Option<String>,
    /// Absolute directory path inside the sandbox.
    pub path: String,
    /// How many levels to descend (null: 1).
    pub depth: Option<u32>,
}

/// Arguments naming one sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArg {
    /// The sandbox id (`sbx_…`).
    pub sandbox_id: String,
}

/// `snapshot_sandbox` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotArgs {
    /// The sandbox id.
    pub sandbox_id: String,
    /// A name for the snapshot.
    pub name: String,
}

/// `fork_sandbox` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkArgs {
    /// The sandbox id to copy.
    pub sandbox_id: String,
    /// How many copies (1-16; null: 1).
    pub count: Option<u32>,
}

/// `list_sandboxes` takes nothing.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}
