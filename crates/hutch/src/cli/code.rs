//! `hutch run-code ID [-l LANGUAGE] [-c CONTEXT] CODE|-`: run a cell in a stateful context of
//! the code interpreter (`docs/code-interpreter.md`). Output is printed as it comes, the
//! cell's value and text results go to stdout, images (PNG, JPEG, SVG, PDF) are saved to
//! files; an error prints its traceback and exits 1.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use base64::Engine;
use serde_json::{json, Value};

use super::stream::for_each_event;
use crate::client::Api;

/// `hutch run-code`.
#[derive(Debug, clap::Args)]
pub struct RunCodeArgs {
    /// Sandbox id (of the `code-interpreter` template).
    id: String,
    /// The code, or `-` to read it from stdin.
    code: Option<String>,
    /// Read the code from this file.
    #[arg(long, short = 'f', conflicts_with = "code")]
    file: Option<PathBuf>,
    /// Language of the default context: python, r (where the template has R), bash or javascript.
    #[arg(long, short = 'l', conflicts_with = "context")]
    language: Option<String>,
    /// Run in this context (from `POST /v1/sandboxes/{id}/contexts`) instead of the default.
    #[arg(long, short = 'c')]
    context: Option<String>,
    /// Interrupt the cell after this many seconds (its context keeps its state; 0: no limit).
    #[arg(long)]
    timeout: Option<f64>,
    /// Environment `KEY=VALUE` for this cell (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Where images the code shows are saved (default: the current directory).
    #[arg(long, default_value = ".")]
    out_dir: PathBuf,
}

/// File extensions of the binary and vector formats saved to files.
const SAVED: [(&str, &str, bool); 4] = [
    ("image/png", "png", true),
    ("image/jpeg", "jpg", true),
    ("application/pdf", "pdf", true),
    ("image/svg+xml", "svg", false),
];

impl RunCodeArgs {
    fn code(&self) -> anyhow::Result<String> {
        if let Some(path) = &self.file {
            return std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()));
        }
        match self.code.as_deref() {
            Some("-") | None => {
                let mut code = String::new();
                std::io::stdin()
                    .read_to_string(&mut code)
                    .context("reading the code from stdin")?;
                Ok(code)
            }
            Some(code) => Ok(code.to_string()),
        }
    }

    fn body(&self) -> anyhow::Result<Value> {
        let mut body = json!({ "code": self.code()? });
        if let Some(l) = &self.language {
            body["language"] = json!(l);
        }
        if let Some(c) = &self.context {
            body["context_id"] = json!(c);
        }
        if let Some(t) = self.timeout {
            body["timeout_seconds"] = json!(t);
        }
        if !self.env.is_empty() {
            let mut env = serde_json::Map::new();
            for pair in &self.env {
                let Some((k, v)) = pair.split_once('=') else {
                    bail!("--env must be KEY=VALUE, got {pair:?}");
                };
                env.insert(k.to_string(), json!(v));
            }
            body["env"] = Value::Object(env);
        }
        Ok(body)
    }
}

/// Save the images of a result; returns the files written.
fn save_images(data: &Value, dir: &Path, n: &mut usize) -> anyhow::Result<Vec<PathBuf>> {
    let mut saved = Vec::new();
    for (mime, ext, base64) in SAVED {
        let Some(content) = data.get(mime).and_then(Value::as_str) else {
            continue;
        };
        let bytes = if base64 {
            base64::engine::general_purpose::STANDARD
                .decode(content.trim())
                .with_context(|| format!("a {mime} result that is not base64"))?
        } else {
            content.as_bytes().to_vec()
        };
        *n += 1;
        let path = dir.join(format!("result-{n}.{ext}"));
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        saved.push(path);
    }
    Ok(saved)
}

/// `hutch run-code`: 0 when the cell ran without error, 1 otherwise.
pub async fn run_code(args: RunCodeArgs, state_dir: &Path, json_out: bool) -> anyhow::Result<i32> {
    let api = Api::from_env(state_dir)?;
    let body = args.body()?;
    let path = format!("/v1/sandboxes/{}/code", args.id);
    if json_out {
        let out = api.call(reqwest::Method::POST, &path, Some(&body)).await?;
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(if out["error"].is_null() { 0 } else { 1 });
    }
    let resp = api.post_streamed(&path, &body, "text/event-stream").await?;
    let mut images = 0;
    let mut outcome: Option<anyhow::Result<i32>> = None;
    let mut failed = false;
    for_each_event(resp, |ev| {
        let data: Value = serde_json::from_str(&ev.data).unwrap_or(Value::Null);
        let text = data["text"].as_str().unwrap_or("");
        match ev.event.as_str() {
            "stdout" => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(text.as_bytes());
                let _ = out.flush();
            }
            "stderr" => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(text.as_bytes());
                let _ = err.flush();
            }
            "result" | "display" => {
                let bundle = &data["data"];
                match save_images(bundle, &args.out_dir, &mut images) {
                    Ok(files) if !files.is_empty() => {
                        for f in files {
                            eprintln!("hutch: saved {}", f.display());
                        }
                    }
                    Ok(_) => {
                        if let Some(t) = bundle["text/plain"].as_str() {
                            println!("{t}");
                        }
                    }
                    Err(e) => {
                        outcome = Some(Err(e));
                        return false;
                    }
                }
            }
            "error" => {
                failed = true;
                let mut err = std::io::stderr().lock();
                for line in data["traceback"].as_array().into_iter().flatten() {
                    let _ = writeln!(err, "{}", line.as_str().unwrap_or(""));
                }
                let _ = writeln!(
                    err,
                    "{}: {}",
                    data["name"].as_str().unwrap_or("Error"),
                    data["value"].as_str().unwrap_or("")
                );
            }
            "end" => {
                if data["context_restarted"] == true {
                    eprintln!(
                        "hutch: the context's kernel was started afresh (earlier state is gone)"
                    );
                }
                if data["truncated"] == true {
                    eprintln!("hutch: output was cut at the server's output cap");
                }
                outcome = Some(Ok(if failed { 1 } else { 0 }));
                return false;
            }
            "failed" => {
                outcome = Some(Err(anyhow::anyhow!(
                    "{}",
                    data["message"]
                        .as_str()
                        .unwrap_or("the code interpreter failed")
                )));
                return false;
            }
            _ => {}
        }
        true
    })
    .await?;
    outcome.unwrap_or_else(|| bail!("the stream ended before the cell finished"))
}
