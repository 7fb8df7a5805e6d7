//! The `run_code` tool: a cell in a stateful context of the code interpreter, answered as
//! JSON text (stdout, stderr, results' text, error) cut to the session's cap, with the
//! images the code showed as MCP image content, so a multimodal model sees its own chart.

use reqwest::Method;
use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::{json, Value};

use super::args::{CodeArgs, CreateArgs};
use super::output;
use super::HutchMcp;

/// Images one answer carries at most.
const MAX_IMAGES: usize = 4;
/// Largest image (its base64) an answer carries.
const MAX_IMAGE_BASE64: usize = 4 << 20;
/// Text of one result kept at most (a DataFrame's repr is short; a huge list is cut).
const MAX_RESULT_TEXT: usize = 4_000;
/// The template a new sandbox of `run_code` gets.
const CODE_TEMPLATE: &str = "code-interpreter";

impl HutchMcp {
    /// Run `args` and build the tool's answer.
    pub(super) async fn code_cell(&self, args: CodeArgs) -> anyhow::Result<CallToolResult> {
        let id = match args.sandbox_id {
            Some(id) => id,
            None => match self.session.lock_owned().last() {
                Some(last) => last.id.clone(),
                None => String::new(),
            },
        };
        let id = if id.is_empty() {
            let created = self
                .create(CreateArgs {
                    template: Some(CODE_TEMPLATE.into()),
                    ..CreateArgs::default()
                })
                .await?;
            created["id"].as_str().unwrap_or_default().to_string()
        } else {
            id
        };
        let mut body = json!({ "code": args.code });
        if let Some(l) = args.language {
            body["language"] = json!(l);
        }
        if let Some(t) = args.timeout_seconds {
            body["timeout_seconds"] = json!(t);
        }
        let api = self.api()?;
        let out = api
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{id}/code"),
                Some(&body),
            )
            .await?;
        Ok(self.code_answer(&id, &out))
    }

    fn code_answer(&self, id: &str, out: &Value) -> CallToolResult {
        let joined = |k: &str| -> String {
            out["logs"][k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect()
        };
        let (stdout, stderr) = (joined("stdout"), joined("stderr"));
        let mut images = Vec::new();
        let mut notes = Vec::new();
        let mut results = Vec::new();
        for r in out["results"].as_array().into_iter().flatten() {
            let data = &r["data"];
            let formats: Vec<&str> = data
                .as_object()
                .map(|m| m.keys().map(String::as_str).collect())
                .unwrap_or_default();
            for mime in ["image/png", "image/jpeg"] {
                let Some(b64) = data[mime].as_str() else {
                    continue;
                };
                if images.len() >= MAX_IMAGES {
                    notes.push(format!(
                        "an image left out: more than {MAX_IMAGES} in one answer"
                    ));
                } else if b64.len() > MAX_IMAGE_BASE64 {
                    notes.push(format!(
                        "a {mime} of {} bytes left out: save it to a file instead",
                        b64.len()
                    ));
                } else {
                    images.push(ContentBlock::image(
                        b64.trim().to_string(),
                        mime.to_string(),
                    ));
                }
            }
            let text = data["text/plain"].as_str().unwrap_or_default();
            results.push(json!({
                "text": output::cut(text, MAX_RESULT_TEXT, output::answer_marker),
                "formats": formats,
                "is_main_result": r["is_main_result"],
            }));
        }
        let mut answer = json!({
            "sandbox_id": id,
            "context_id": out["context_id"],
            "results": results,
            "stdout": "",
            "stderr": "",
            "error": out["error"],
            "execution_count": out["execution_count"],
            "context_restarted": out["context_restarted"],
        });
        if !notes.is_empty() {
            answer["notes"] = json!(notes);
        }
        // What is left of the cap after everything but the streams goes to them.
        let cap = self.config.max_output_bytes;
        let rest = serde_json::to_string_pretty(&answer).map_or(0, |s| s.len());
        let mut room = cap.saturating_sub(rest + 200);
        loop {
            let (b_out, b_err) = output::split_budget(stdout.len(), stderr.len(), room);
            answer["stdout"] = json!(output::cut(&stdout, b_out, output::code_marker));
            answer["stderr"] = json!(output::cut(&stderr, b_err, output::code_marker));
            let len = serde_json::to_string_pretty(&answer).map_or(0, |s| s.len());
            if len <= cap || room < 200 {
                break;
            }
            room = room.saturating_sub(len - cap + 100);
        }
        let text = serde_json::to_string_pretty(&answer).unwrap_or_else(|_| answer.to_string());
        let text = output::cut(&text, cap, output::answer_marker);
        let mut content = vec![ContentBlock::text(text)];
        content.extend(images);
        CallToolResult::success(content)
    }
}
