//! The MCP tools. Descriptions are written for a model to read; the ones of tools that may
//! create a sandbox end with the network it gets, as the operator set it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::anyhow;
use base64::Engine;
use reqwest::Method;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, tool_router, ErrorData as McpError, ServerHandler};
use serde_json::{json, Value};

use super::args::{
    CodeArgs, CreateArgs, ForkArgs, ListArgs, NoArgs, PythonArgs, ReadArgs, RunArgs, SandboxArg,
    SnapshotArgs, WriteArgs,
};
use super::output::{self, SAVED_OUTPUT_DIR};
use super::policy::NetworkRequest;
use super::{HutchMcp, McpConfig, Owned, Session};
use crate::client::{encode, Api, ApiFailure};

/// Tools that create a sandbox when none exists yet, whose descriptions say what network it gets.
const CREATING_TOOLS: [&str; 5] = [
    "create_sandbox",
    "run_command",
    "run_python",
    "run_code",
    "write_file",
];

fn fail(e: impl std::fmt::Display) -> Result<CallToolResult, McpError> {
    Ok(CallToolResult::error(vec![ContentBlock::text(format!(
        "{e:#}"
    ))]))
}

impl HutchMcp {
    /// A server for one session; `api` is `None` until an HTTP client's key is known.
    pub(super) fn new(config: Arc<McpConfig>, api: Option<Api>) -> Self {
        let mut router = Self::tool_router();
        let network = format!(
            " Network of new sandboxes unless you ask for less: {}.",
            config.network.describe()
        );
        for route in router.map.values_mut() {
            let mut schema = route.attr.input_schema.as_ref().clone();
            super::schema::strict(&mut schema);
            route.attr.input_schema = Arc::new(schema);
            if CREATING_TOOLS.contains(&route.attr.name.as_ref()) {
                let d = route.attr.description.clone().unwrap_or_default();
                route.attr.description = Some(format!("{d}{network}").into());
            }
        }
        let slot = OnceLock::new();
        if let Some(api) = api {
            let _ = slot.set(api);
        }
        Self {
            config,
            session: Arc::new(Session {
                token: hutch_core::ids::random_token(12),
                api: slot,
                owned: Mutex::new(Vec::new()),
                saved_outputs: Default::default(),
                server_networked: std::sync::atomic::AtomicBool::new(true),
            }),
            tool_router: router,
        }
    }

    /// Bind this session to the Hutch key its HTTP client authenticated with.
    pub(super) fn bind_key(&self, api: Api) {
        let _ = self.session.api.set(api);
    }

    pub(super) fn api(&self) -> anyhow::Result<&Api> {
        self.session
            .api
            .get()
            .ok_or_else(|| anyhow!("this MCP session has no Hutch API key"))
    }

    /// The text of a JSON answer, cut to the cap (listings and objects are small unless a
    /// listing is huge).
    fn answer(&self, v: &Value) -> Result<CallToolResult, McpError> {
        let text = serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
        let text = output::cut(&text, self.config.max_output_bytes, output::answer_marker);
        Ok(CallToolResult::success(vec![ContentBlock::text(text)]))
    }

    pub(super) async fn create(&self, args: CreateArgs) -> anyhow::Result<Value> {
        let request = NetworkRequest {
            egress: args.egress,
            allow: args.allow,
            deny: args.deny,
        };
        let mut network = self.config.network.resolve(&request)?;
        let persistent = args.persistent.unwrap_or(false);
        let mut body = json!({
            "metadata": {"created_by": "hutch-mcp", "mcp_session": self.session.token},
            "persistent": persistent,
        });
        let template = args.template.or_else(|| self.config.template.clone());
        for (k, v) in [
            ("template", template.map(Value::from)),
            ("snapshot", args.snapshot.map(Value::from)),
            ("isolation", args.isolation.map(|i| json!(i.as_str()))),
            ("ttl_seconds", args.ttl_seconds.map(Value::from)),
            ("cpus", args.cpus.map(Value::from)),
            ("memory_mib", args.memory_mib.map(Value::from)),
            ("disk_mib", args.disk_mib.map(Value::from)),
            (
                "env",
                args.env.map(|e| {
                    Value::Object(e.into_iter().map(|v| (v.name, json!(v.value))).collect())
                }),
            ),
        ] {
            if let Some(v) = v {
                body[k] = v;
            }
        }
        // On a server without networking only `none` exists, which is narrower than any
        // policy: the operator's default falls back to it, a model's explicit ask does not.
        let fallback = request.is_empty();
        if fallback && !self.session.server_networked.load(Ordering::Relaxed) {
            network = json!({"egress": "none"});
        }
        body["network"] = network;
        let api = self.api()?;
        let sb = match api.call(Method::POST, "/v1/sandboxes", Some(&body)).await {
            Err(e) if fallback && refused_for_no_network(&e) => {
                self.session
                    .server_networked
                    .store(false, Ordering::Relaxed);
                body["network"] = json!({"egress": "none"});
                api.call(Method::POST, "/v1/sandboxes", Some(&body)).await?
            }
            other => other?,
        };
        if let Some(id) = sb["id"].as_str() {
            self.session.lock_owned().push(Owned {
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
        if let Some(last) = self.session.lock_owned().last() {
            return Ok(last.id.clone());
        }
        let sb = self.create(CreateArgs::default()).await?;
        Ok(sb["id"].as_str().unwrap_or_default().to_string())
    }

    /// Run a command; stdout and stderr are cut to the cap, each cut stream saved whole in
    /// the sandbox first.
    async fn exec(&self, id: &str, body: Value) -> anyhow::Result<Value> {
        let api = self.api()?;
        let mut out = api
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/exec"),
                Some(&body),
            )
            .await?;
        out["sandbox_id"] = json!(id);
        let text = |k: &str| out[k].as_str().unwrap_or_default().to_string();
        let (stdout, stderr) = (text("stdout"), text("stderr"));
        // The JSON around the streams and its escapes take room too: shrink until it fits.
        let cap = self.config.max_output_bytes;
        let mut room = cap.saturating_sub(600);
        let mut saved: [Option<Result<String, String>>; 2] = [None, None];
        loop {
            let (b_out, b_err) = output::split_budget(stdout.len(), stderr.len(), room);
            for (i, (stream, whole, budget)) in
                [("stdout", &stdout, b_out), ("stderr", &stderr, b_err)]
                    .into_iter()
                    .enumerate()
            {
                if whole.len() <= budget {
                    out[stream] = json!(whole);
                    continue;
                }
                if saved[i].is_none() {
                    saved[i] = Some(self.save_output(api, id, &out, stream, whole).await);
                }
                let where_ = saved[i].as_ref().expect("saved just above");
                let marker = output::stream_marker(stream, whole.len(), where_);
                out[stream] = json!(output::cut(whole, budget, marker));
                out.as_object_mut()
                    .map(|o| o.remove(&format!("{stream}_b64")));
            }
            let len = serde_json::to_string_pretty(&out).map_or(0, |s| s.len());
            if len <= cap || room < 200 {
                break;
            }
            room = room.saturating_sub(len - cap + 100);
        }
        Ok(out)
    }

    /// Write a command's whole stream to `/tmp/hutch-mcp/<n>.<stream>` in the sandbox.
    async fn save_output(
        &self,
        api: &Api,
        id: &str,
        result: &Value,
        stream: &str,
        text: &str,
    ) -> Result<String, String> {
        let n = self.session.saved_outputs.fetch_add(1, Ordering::Relaxed) + 1;
        let path = format!("{SAVED_OUTPUT_DIR}/{n}.{stream}");
        let bytes = result[format!("{stream}_b64")]
            .as_str()
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .unwrap_or_else(|| text.as_bytes().to_vec());
        api.raw(
            Method::PUT,
            &format!("/v1/sandboxes/{id}/files?path={}&mode=0644", encode(&path)),
            Some(reqwest::Body::from(bytes)),
            None,
        )
        .await
        .map_err(|e| format!("{e:#}"))?;
        if result[format!("{stream}_truncated")] == true {
            return Ok(format!(
                "{path} (as far as the server kept it: it stores at most 16 MiB of a stream)"
            ));
        }
        Ok(path)
    }
}

fn refused_for_no_network(e: &anyhow::Error) -> bool {
    e.downcast_ref::<ApiFailure>().is_some_and(|f| {
        f.status == reqwest::StatusCode::UNPROCESSABLE_ENTITY
            && f.message.contains(hutch_core::NO_NETWORK_MESSAGE)
    })
}

#[tool_router(router = tool_router)]
impl HutchMcp {
    #[tool(
        description = "Create a new isolated Linux sandbox (a disposable computer) and return its id. \
Commands you run there cannot affect the host or other sandboxes. Ephemeral sandboxes are destroyed \
when this session ends or after ttl_seconds of inactivity. Give null for anything you do not care \
about."
    )]
    async fn create_sandbox(
        &self,
        Parameters(args): Parameters<CreateArgs>,
    ) -> Result<CallToolResult, McpError> {
        match self.create(args).await {
            Ok(v) => self.answer(&v),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Run a command in a sandbox and return its stdout, stderr and exit code \
(exit_code 124 with timed_out=true means it was killed by the timeout; 127 means the program was \
not found). Use `command` for a shell line (pipes, redirects) or `argv` to run a program with exact \
arguments. Without sandbox_id the last sandbox is used, or a new one is created. Long output is cut \
in the middle; the cut says where the whole output was saved in the sandbox."
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
            Ok(v) => self.answer(&v),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Run Python 3 code in a sandbox (python3 reads the code from stdin) and \
return stdout, stderr and exit code. Print what you want to see. Needs a template with Python \
(`base`). Long output is cut in the middle; the cut says where the whole output was saved."
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
            Ok(v) => self.answer(&v),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Run code in a persistent session, like a notebook cell: variables, \
imports and loaded data stay for your next call (Python through a Jupyter kernel, or bash, or \
javascript). Returns the value of the last expression, stdout, stderr and the error with its \
traceback; charts you show (matplotlib `plt.show()`) come back as images you can see. Needs the \
`code-interpreter` template (numpy, pandas, matplotlib), which a new sandbox of this tool gets. \
Long output is cut in the middle."
    )]
    async fn run_code(
        &self,
        Parameters(args): Parameters<CodeArgs>,
    ) -> Result<CallToolResult, McpError> {
        match self.code_cell(args).await {
            Ok(answer) => Ok(answer),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Read a file from a sandbox, or the byte range offset..offset+length of it. \
Text is returned as is; binary content base64-encoded with a note. A long answer is cut in the \
middle, and the cut names the byte range to ask for next."
    )]
    async fn read_file(
        &self,
        Parameters(args): Parameters<ReadArgs>,
    ) -> Result<CallToolResult, McpError> {
        let run = async {
            let id = self.target(args.sandbox_id).await?;
            let resp = self
                .api()?
                .raw(
                    Method::GET,
                    &format!("/v1/sandboxes/{id}/files?path={}", encode(&args.path)),
                    None,
                    None,
                )
                .await?;
            let bytes = resp.bytes().await?;
            let start = (args.offset.unwrap_or(0) as usize).min(bytes.len());
            let end = args.length.map_or(bytes.len(), |l| {
                start.saturating_add(l as usize).min(bytes.len())
            });
            let range = &bytes[start..end];
            let cap = self.config.max_output_bytes;
            Ok::<_, anyhow::Error>(match std::str::from_utf8(range) {
                Ok(text) => output::cut(text, cap, output::file_marker(&args.path, start)),
                Err(_) => {
                    // Base64 is 4/3 of the bytes: cut the bytes, then encode the pieces.
                    let keep = cap * 3 / 4 - 200;
                    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
                    if range.len() <= keep {
                        format!("(binary, {} bytes, base64)\n{}", range.len(), b64(range))
                    } else {
                        let half = keep / 2;
                        format!(
                            "(binary, {} bytes from offset {start}; base64 of the first and last \
                             {half} bytes)\n{}{}{}",
                            range.len(),
                            b64(&range[..half]),
                            output::file_marker(&args.path, start)(
                                range.len() - 2 * half,
                                half,
                                range.len() - half
                            ),
                            b64(&range[range.len() - half..])
                        )
                    }
                }
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
            self.api()?
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
            Ok(v) => self.answer(&v),
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
            self.api()?
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
            Ok(v) => self.answer(&v),
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "Save a named snapshot of a sandbox (its filesystem on namespace \
sandboxes) that new sandboxes can start from (create_sandbox's `snapshot`)."
    )]
    async fn snapshot_sandbox(
        &self,
        Parameters(args): Parameters<SnapshotArgs>,
    ) -> Result<CallToolResult, McpError> {
        let run = async {
            self.api()?
                .call(
                    Method::POST,
                    &format!("/v1/sandboxes/{}/snapshots", args.sandbox_id),
                    Some(&json!({"name": args.name})),
                )
                .await
        };
        match run.await {
            Ok(v) => self.answer(&v),
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
        let run = async {
            self.api()?
                .call(
                    Method::POST,
                    &format!("/v1/sandboxes/{}/fork", args.sandbox_id),
                    Some(&json!({"count": args.count.unwrap_or(1), "mode": "disk"})),
                )
                .await
        };
        match run.await {
            Ok(v) => {
                for sb in v["sandboxes"].as_array().cloned().unwrap_or_default() {
                    if let Some(id) = sb["id"].as_str() {
                        self.session.lock_owned().push(Owned {
                            id: id.into(),
                            persistent: false,
                        });
                    }
                }
                self.answer(&v)
            }
            Err(e) => fail(e),
        }
    }

    #[tool(description = "Destroy a sandbox and everything in it.")]
    async fn kill_sandbox(
        &self,
        Parameters(args): Parameters<SandboxArg>,
    ) -> Result<CallToolResult, McpError> {
        let run = async {
            self.api()?
                .call(
                    Method::DELETE,
                    &format!("/v1/sandboxes/{}", args.sandbox_id),
                    None,
                )
                .await
        };
        match run.await {
            Ok(_) => {
                self.session
                    .lock_owned()
                    .retain(|o| o.id != args.sandbox_id);
                self.answer(&json!({"killed": args.sandbox_id}))
            }
            Err(e) => fail(e),
        }
    }

    #[tool(
        description = "List the sandboxes this session created that still exist, with their state."
    )]
    async fn list_sandboxes(
        &self,
        Parameters(NoArgs {}): Parameters<NoArgs>,
    ) -> Result<CallToolResult, McpError> {
        let run = async {
            self.api()?
                .call(
                    Method::GET,
                    &format!("/v1/sandboxes?metadata.mcp_session={}", self.session.token),
                    None,
                )
                .await
        };
        match run.await {
            Ok(v) => self.answer(&v),
            Err(e) => fail(e),
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for HutchMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(rmcp::model::Implementation::new("hutch", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "Hutch gives you isolated Linux sandboxes. Create one with create_sandbox (or just call \
run_command / run_python / write_file, which create one on first use), run commands and code \
in it, read and write its files. Nothing you do there can harm the host. New sandboxes' network: {}.",
                self.config.network.describe()
            ))
    }

    async fn initialize(
        &self,
        request: rmcp::model::InitializeRequestParams,
        context: rmcp::service::RequestContext<rmcp::RoleServer>,
    ) -> Result<rmcp::model::InitializeResult, McpError> {
        if let Some(api) = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|p| p.extensions.get::<super::http::CallerApi>())
        {
            self.bind_key(api.0.clone());
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }
}
