//! The MCP tools. Descriptions are written for a model to read.

use std::collections::BTreeMap;

use base64::Engine;
use reqwest::Method;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ErrorData as McpError, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{HutchMcp, Owned};
use crate::client::{encode, Api};

/// `create_sandbox` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateArgs {
    /// Template: `base` (Debian 12 with python3, pip, git, curl, build tools) or `minimal` (busybox). Default: the server's default.
    pub template: Option<String>,
    /// Keep the sandbox after this session ends and never expire it. Default false.
    pub persistent: Option<bool>,
    /// Seconds of inactivity before an ephemeral sandbox is destroyed. Default 300.
    pub ttl_seconds: Option<u64>,
    /// Memory limit in MiB.
    pub memory_mib: Option<u64>,
    /// CPU limit (may be fractional).
    pub cpus: Option<f64>,
    /// Environment variables for every command.
    pub env: Option<BTreeMap<String, String>>,
}

/// `run_command` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct RunArgs {
    /// The sandbox to use. If omitted, the sandbox this session used last (one is created if there is none).
    pub sandbox_id: Option<String>,
    /// A shell command line, run with `/bin/sh -c`. Give either this or `argv`.
    pub command: Option<String>,
    /// A program and its arguments, run directly without a shell. Give either this or `command`.
    pub argv: Option<Vec<String>>,
    /// Working directory (absolute path).
    pub cwd: Option<String>,
    /// Text to send on the command's standard input.
    pub stdin: Option<String>,
    /// Kill the command after this many seconds (default 60). It then reports exit code 124.
    pub timeout_seconds: Option<f64>,
}

/// `run_python` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct PythonArgs {
    /// The sandbox to use (default: the last one used; created if none).
    pub sandbox_id: Option<String>,
    /// Python source code to run with `python3`.
    pub code: String,
    /// Kill it after this many seconds (default 60).
    pub timeout_seconds: Option<f64>,
}

/// `read_file` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReadArgs {
    /// The sandbox (default: the last one used).
    pub sandbox_id: Option<String>,
    /// Absolute path inside the sandbox.
    pub path: String,
}

/// `write_file` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct WriteArgs {
    /// The sandbox (default: the last one used; created if none).
    pub sandbox_id: Option<String>,
    /// Absolute path inside the sandbox; parent directories are created.
    pub path: String,
    /// The file's full new content (text).
    pub content: String,
    /// Permission bits in octal, e.g. "0755" for a script. Default "0644".
    pub mode: Option<String>,
}

/// `list_files` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListArgs {
    /// The sandbox (default: the last one used).
    pub sandbox_id: Option<String>,
    /// Absolute directory path inside the sandbox.
    pub path: String,
    /// How many levels to descend (default 1).
    pub depth: Option<u32>,
}

/// Arguments naming one sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SandboxArg {
    /// The sandbox id (`sbx_…`).
    pub sandbox_id: String,
}

/// `snapshot_sandbox` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SnapshotArgs {
    /// The sandbox id.
    pub sandbox_id: String,
    /// A name for the snapshot.
    pub name: String,
}

/// `fork_sandbox` arguments.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ForkArgs {
    /// The sandbox id to copy.
    pub sandbox_id: String,
    /// How many copies (1-16).
    pub count: Option<u32>,
}

fn ok_json(v: &Value) -> Result<CallToolResult, McpError> {
    Ok(CallToolResult::success(vec![ContentBlock::text(
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()),
    )]))
}

fn fail(e: impl std::fmt::Display) -> Result<CallToolResult, McpError> {
    Ok(CallToolResult::error(vec![ContentBlock::text(format!(
        "{e:#}"
    ))]))
}

impl HutchMcp {
    /// A server over a Hutch API client.
    pub fn new(api: Api) -> Self {
        Self {
            api,
            session: crate_random_token(),
            owned: Default::default(),
            tool_router: Self::tool_router(),
        }
    }

    async fn create(&self, args: CreateArgs) -> anyhow::Result<Value> {
        let mut body = json!({
            "metadata": {"created_by": "hutch-mcp", "mcp_session": self.session},
        });
        let persistent = args.persistent.unwrap_or(false);
        for (k, v) in [
            ("template", args.template.map(Value::from)),
            ("ttl_seconds", args.ttl_seconds.map(Value::from)),
            ("memory_mib", args.memory_mib.map(Value::from)),
            ("cpus", args.cpus.map(Value::from)),
            ("env", args.env.map(|e| json!(e))),
            ("persistent", Some(Value::from(persistent))),
        ] {
            if let Some(v) = v {
                body[k] = v;
            }
        }
        let sb = self
            .api
            .call(Method::POST, "/v1/sandboxes", Some(&body))
            .await?;
        if let Some(id) = sb["id"].as_str() {
            self.lock_owned().push(Owned {
                id: id.to_string(),
                persistent,
            });
        }
        Ok(sb)
    }

    /// The sandbox to act on: the given one, else the last one this session used, else a new one.
    async fn target(&self, given: Option<String>) -> anyhow::Result<String> {
        if let Some(id) = given {
            return Ok(id);
        }
        if let Some(last) = self.lock_owned().last() {
            return Ok(last.id.clone());
        }
        let sb = self
            .create(CreateArgs {
                template: None,
                persistent: None,
                ttl_seconds: None,
                memory_mib: None,
                cpus: None,
                env: None,
            })
            .await?;
        Ok(sb["id"].as_str().unwrap_or_default().to_string())
    }

    async fn exec(&self, id: &str, body: Value) -> anyhow::Result<Value> {
        let mut out = self
            .api
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(&body),
            )
            .await?;
        out["sandbox_id"] = json!(id);
        Ok(out)
    }

    fn api(&self) -> &Api {
        &self.api
    }
}

fn crate_random_token() -> String {
    hutch_core::ids::random_token(12)
}

#[tool_router(router = tool_router)]
impl HutchMcp {
    #[tool(
        description = "Create a new isolated Linux sandbox (a disposable computer) and return its id. \
Commands you run there cannot affect the host or other sandboxes. Ephemeral sandboxes are destroyed \
when this session ends or after ttl_seconds of inactivity."
    )]
    async fn create_sandbox(
        &self,
        Parameters(args): Parameters<CreateArgs>,
    ) -> Result<CallToolResult, McpError> {
        match self.create(args).await {
            Ok(v) => ok_json(&v),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Run a command in a sandbox and return its stdout, stderr and exit code \
(exit_code 124 with timed_out=true means it was killed by the timeout; 127 means the program was \
not found). Use `command` for a shell line (pipes, redirects) or `argv` to run a program with exact \
arguments. Without sandbox_id the last sandbox is used, or a new one is created."
    )]
    async fn run_command(
        &self,
        Parameters(args): Parameters<RunArgs>,
    ) -> Result<CallToolResult, McpError> {
        let cmd = match (args.command, args.argv) {
            (Some(c), None) => json!(c),
            (None, Some(a)) => json!(a),
            _ => return fail("give exactly one of `command` (a shell line) or `argv` (a list)"),
        };
        let run = async {
            let id = self.target(args.sandbox_id).await?;
            let mut body = json!({ "cmd": cmd });
            if let Some(c) = args.cwd {
                body["cwd"] = json!(c);
            }
            if let Some(s) = args.stdin {
                body["stdin"] = json!(s);
            }
            if let Some(t) = args.timeout_seconds {
                body["timeout_seconds"] = json!(t);
            }
            self.exec(&id, body).await
        };
        match run.await {
            Ok(v) => ok_json(&v),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Run Python 3 code in a sandbox (python3 reads the code from stdin) and \
return stdout, stderr and exit code. Print what you want to see. Needs a template with Python \
(`base`)."
    )]
    async fn run_python(
        &self,
        Parameters(args): Parameters<PythonArgs>,
    ) -> Result<CallToolResult, McpError> {
        let run = async {
            let id = self.target(args.sandbox_id).await?;
            let mut body = json!({ "cmd": ["python3", "-"], "stdin": args.code });
            if let Some(t) = args.timeout_seconds {
                body["timeout_seconds"] = json!(t);
            }
            self.exec(&id, body).await
        };
        match run.await {
            Ok(v) => ok_json(&v),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Read a file from a sandbox. Text is returned as is; binary content is \
returned base64-encoded with a note."
    )]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadArgs>,
    ) -> Result<CallToolResult, McpError> {
        let run = async {
            let id = self.target(args.sandbox_id).await?;
            let resp = self
                .api()
                .raw(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/files?path={}", encode(&args.path)),
                    None,
                    None,
                )
                .await?;
            let bytes = resp.bytes().await?;
            Ok::<_, anyhow::Error>(match String::from_utf8(bytes.to_vec()) {
                Ok(text) => text,
                Err(_) => format!(
                    "(binary file, {} bytes, base64)\n{}",
                    bytes.len(),
                    base64::engine::general_purpose::STANDARD.encode(&bytes)
                ),
            })
        };
        match run.await {
            Ok(text) => Ok(CallToolResult::success(vec![ContentBlock::text(text)])),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Write a text file in a sandbox (replacing it if it exists; parent \
directories are created). Use mode \"0755\" for scripts you want to execute."
    )]
    async fn write_file(
        &self,
        Parameters(args): Parameters<WriteArgs>,
    ) -> Result<CallToolResult, McpError> {
        let run = async {
            let id = self.target(args.sandbox_id).await?;
            let mode = args.mode.unwrap_or_else(|| "0644".into());
            let n = args.content.len();
            self.api()
                .raw(
                    Method::PUT,
                    &format!(
                        "/v1/sandboxes/{id}/files?path={}&mode={}",
                        encode(&args.path),
                        encode(&mode)
                    ),
                    Some(reqwest::Body::from(args.content)),
                    None,
                )
                .await?;
            Ok::<_, anyhow::Error>(json!({"sandbox_id": id, "path": args.path, "bytes_written": n}))
        };
        match run.await {
            Ok(v) => ok_json(&v),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "List a directory in a sandbox: name, path, type (file/dir/symlink), size \
and mode of each entry, down to `depth` levels."
    )]
    async fn list_files(
        &self,
        Parameters(args): Parameters<ListArgs>,
    ) -> Result<CallToolResult, McpError> {
        let run = async {
            let id = self.target(args.sandbox_id).await?;
            self.api()
                .call(
                    Method::GET,
                    &format!(
                        "/v1/sandboxes/{id}/files/list?path={}&depth={}",
                        encode(&args.path),
                        args.depth.unwrap_or(1)
                    ),
                    None,
                )
                .await
        };
        match run.await {
            Ok(v) => ok_json(&v),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Save a named snapshot of a sandbox (its filesystem on namespace \
sandboxes) that new sandboxes can start from."
    )]
    async fn snapshot_sandbox(
        &self,
        Parameters(args): Parameters<SnapshotArgs>,
    ) -> Result<CallToolResult, McpError> {
        match self
            .api()
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{}/snapshots", args.sandbox_id),
                Some(&json!({"name": args.name})),
            )
            .await
        {
            Ok(v) => ok_json(&v),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Copy a sandbox into `count` new independent sandboxes (its files are \
copied; on namespace sandboxes running processes are not). Useful to try several approaches \
from the same starting point."
    )]
    async fn fork_sandbox(
        &self,
        Parameters(args): Parameters<ForkArgs>,
    ) -> Result<CallToolResult, McpError> {
        let result = self
            .api()
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{}/fork", args.sandbox_id),
                Some(&json!({"count": args.count.unwrap_or(1), "mode": "disk"})),
            )
            .await;
        match result {
            Ok(v) => {
                for sb in v["sandboxes"].as_array().cloned().unwrap_or_default() {
                    if let Some(id) = sb["id"].as_str() {
                        self.lock_owned().push(Owned {
                            id: id.into(),
                            persistent: false,
                        });
                    }
                }
                ok_json(&v)
            }
            Err(e) => fail(e),
        }
    }

    #[tool(description = "Destroy a sandbox and everything in it.")]
    async fn kill_sandbox(
        &self,
        Parameters(args): Parameters<SandboxArg>,
    ) -> Result<CallToolResult, McpError> {
        match self
            .api()
            .call(
                Method::DELETE,
                &format!("/v1/sandboxes/{}", args.sandbox_id),
                None,
            )
            .await
        {
            Ok(_) => {
                self.lock_owned().retain(|o| o.id != args.sandbox_id);
                ok_json(&json!({"killed": args.sandbox_id}))
            }
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "List the sandboxes this session created that still exist, with their state."
    )]
    async fn list_sandboxes(&self) -> Result<CallToolResult, McpError> {
        match self
            .api()
            .call(
                Method::GET,
                &format!("/v1/sandboxes?metadata.mcp_session={}", self.session),
                None,
            )
            .await
        {
            Ok(v) => ok_json(&v),
            Err(e) => fail(e),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for HutchMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(rmcp::model::Implementation::new("hutch", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Hutch gives you isolated Linux sandboxes. Create one with create_sandbox (or just call \
run_command / run_python / write_file, which create one on first use), run commands and code \
in it, read and write its files. Nothing you do there can harm the host.",
            )
    }
}
