//! The code interpreter (`docs/code-interpreter.md`): stateful contexts with real kernels
//! (ipykernel for Python, IRkernel for R, a persistent bash, a persistent Node.js) in `code-interpreter`
//! sandboxes, `POST /v1/sandboxes/{id}/code` as JSON and as SSE, timeouts, crashes, and what
//! an `ns` wake does to a context.

use std::time::Duration;

use base64::Engine;
use hutch_testkit::TestServer;
use reqwest::Method;
use serde_json::{json, Value};

async fn sandbox(s: &TestServer) -> String {
    hutch_testkit::ensure_template("code-interpreter");
    s.create_id(json!({"template": "code-interpreter", "isolation": "ns"}))
        .await
}

/// Run a cell (JSON answer); 200 expected.
async fn run(s: &TestServer, id: &str, body: Value) -> Value {
    let (status, v) = s.post(&format!("/v1/sandboxes/{id}/code"), body).await;
    assert_eq!(status, 200, "{v}");
    v
}

/// The `text/plain` of the run's main result.
fn main_text(v: &Value) -> String {
    v["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|r| r["is_main_result"] == true)
        .and_then(|r| r["data"]["text/plain"].as_str())
        .unwrap_or_else(|| panic!("no main result with text/plain: {v}"))
        .to_string()
}

fn stdout(v: &Value) -> String {
    v["logs"]["stdout"]
        .as_array()
        .expect("stdout")
        .iter()
        .filter_map(Value::as_str)
        .collect()
}

/// Run a cell as SSE and return its events (name, data) in order.
async fn run_events(s: &TestServer, id: &str, body: Value) -> Vec<(String, Value)> {
    let resp = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/code", s.url))
        .bearer_auth(&s.key)
        .header("Accept", "text/event-stream")
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .starts_with("text/event-stream"));
    let text = resp.text().await.expect("body");
    let mut events = Vec::new();
    for block in text.split("\n\n") {
        let mut name = None;
        let mut data = String::new();
        for line in block.lines() {
            if let Some(n) = line.strip_prefix("event:") {
                name = Some(n.trim().to_string());
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push_str(d.trim_start());
            }
        }
        if let Some(name) = name {
            events.push((
                name,
                serde_json::from_str(&data).expect("event data is JSON"),
            ));
        }
    }
    events
}

/// The first `image/png` of a run's results, decoded.
fn first_png(run: &Value) -> Vec<u8> {
    let png = run["results"]
        .as_array()
        .expect("results")
        .iter()
        .find_map(|r| r["data"]["image/png"].as_str())
        .unwrap_or_else(|| panic!("no image/png: {run}"));
    base64::engine::general_purpose::STANDARD
        .decode(png.trim())
        .expect("base64")
}

/// Width and height from a PNG's IHDR chunk, after checking its signature.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG signature");
    assert_eq!(&png[12..16], b"IHDR", "IHDR first");
    let word = |at: usize| u32::from_be_bytes(png[at..at + 4].try_into().expect("4 bytes"));
    (word(16), word(20))
}

#[tokio::test]
async fn python_keeps_state_and_returns_rich_results() {
    let s = TestServer::start().await;
    let id = sandbox(&s).await;
    let first = run(&s, &id, json!({"code": "x = 41"})).await;
    assert_eq!(first["context_id"], "default-python", "{first}");
    assert_eq!(first["results"], json!([]), "an assignment has no result");
    assert!(first["error"].is_null(), "{first}");
    let second = run(&s, &id, json!({"code": "x + 1"})).await;
    assert_eq!(main_text(&second), "42");
    // IPython's own history of the session: the last value and the inputs.
    let history = run(&s, &id, json!({"code": "(_ * 2, In[-2])"})).await;
    assert_eq!(main_text(&history), "(84, 'x + 1')");
    assert_eq!(second["context_restarted"], false);
    assert!(
        second["execution_count"].as_u64() > first["execution_count"].as_u64(),
        "{first} then {second}"
    );
    assert_eq!(
        history["execution_count"].as_u64(),
        second["execution_count"].as_u64().map(|n| n + 1)
    );

    // A chart: the inline backend sends it as display data with a PNG.
    let chart = run(
        &s,
        &id,
        json!({"code": "import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(4, 3), dpi=100)\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"}),
    )
    .await;
    let (w, h) = png_size(&first_png(&chart));
    assert!(
        (200..=500).contains(&w) && (150..=400).contains(&h),
        "a 4×3 in figure at 100 dpi (cropped to its content): {w}×{h}"
    );

    // A DataFrame: text and HTML.
    let frame = run(
        &s,
        &id,
        json!({"code": "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})"}),
    )
    .await;
    let main = frame["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|r| r["is_main_result"] == true)
        .unwrap_or_else(|| panic!("{frame}"));
    assert!(main["data"]["text/html"]
        .as_str()
        .is_some_and(|h| h.contains("<table")));
    assert!(main["data"]["text/plain"]
        .as_str()
        .is_some_and(|t| t.contains('a') && t.contains('4')));
}

#[tokio::test]
async fn events_stream_in_order_and_errors_carry_a_traceback() {
    let s = TestServer::start().await;
    let id = sandbox(&s).await;
    let events = run_events(
        &s,
        &id,
        json!({"code": "import sys\nprint('one', flush=True)\nprint('two', file=sys.stderr, flush=True)\nprint('three', flush=True)\n6 * 7"}),
    )
    .await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["stdout", "stderr", "stdout", "result", "end"],
        "{events:?}"
    );
    assert_eq!(events[0].1["text"], "one\n");
    assert_eq!(events[1].1["text"], "two\n");
    assert_eq!(events[3].1["data"]["text/plain"], "42");
    assert_eq!(events[3].1["is_main_result"], true);
    assert_eq!(events[4].1["context_id"], "default-python");

    // An error comes after what the cell printed before raising, then the end.
    let raised = run_events(
        &s,
        &id,
        json!({"code": "print('before', flush=True)\nraise KeyError('k')"}),
    )
    .await;
    let names: Vec<&str> = raised.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["stdout", "error", "end"], "{raised:?}");
    assert_eq!(raised[1].1["name"], "KeyError");

    let failed = run(&s, &id, json!({"code": "y = 5\n1 / 0"})).await;
    let error = &failed["error"];
    assert_eq!(error["name"], "ZeroDivisionError", "{failed}");
    assert_eq!(error["value"], "division by zero");
    let traceback = error["traceback"].as_array().expect("traceback").clone();
    assert!(!traceback.is_empty());
    assert!(
        traceback
            .iter()
            .all(|l| !l.as_str().unwrap_or("").contains('\u{1b}')),
        "terminal colours removed: {traceback:?}"
    );
    // The next call in the same context works and sees what ran before the error.
    assert_eq!(
        main_text(&run(&s, &id, json!({"code": "y * 2"})).await),
        "10"
    );

    // Per-cell environment, gone after the cell.
    let env = run(
        &s,
        &id,
        json!({"code": "import os\nos.environ.get('ONLY_HERE')", "env": {"ONLY_HERE": "yes"}}),
    )
    .await;
    assert_eq!(main_text(&env), "'yes'");
    let after = run(&s, &id, json!({"code": "os.environ.get('ONLY_HERE')"})).await;
    assert!(
        after["results"].as_array().expect("results").is_empty(),
        "None has no result: {after}"
    );
}

#[tokio::test]
async fn a_timeout_interrupts_and_keeps_state_and_a_crash_restarts() {
    let s = TestServer::start().await;
    let id = sandbox(&s).await;
    run(&s, &id, json!({"code": "kept = 'still here'"})).await;
    let started = std::time::Instant::now();
    let looped = run(
        &s,
        &id,
        json!({"code": "while True:\n    pass", "timeout_seconds": 1}),
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "interrupted promptly"
    );
    assert_eq!(looped["error"]["name"], "TimeoutError", "{looped}");
    assert_eq!(looped["error"]["timed_out"], true);
    let kept = run(&s, &id, json!({"code": "kept"})).await;
    assert_eq!(main_text(&kept), "'still here'");
    assert_eq!(kept["context_restarted"], false);

    let crashed = run(&s, &id, json!({"code": "import os\nos._exit(1)"})).await;
    assert_eq!(crashed["error"]["name"], "KernelDied", "{crashed}");
    let next = run(&s, &id, json!({"code": "'kept' in dir()"})).await;
    assert_eq!(main_text(&next), "False", "a new kernel: {next}");
    assert_eq!(next["context_restarted"], true);
    let again = run(&s, &id, json!({"code": "1 + 1"})).await;
    assert_eq!(main_text(&again), "2");
    assert_eq!(again["context_restarted"], false);
}

#[tokio::test]
async fn contexts_are_independent_and_can_be_restarted_and_deleted() {
    let s = TestServer::start().await;
    let id = sandbox(&s).await;
    let contexts = format!("/v1/sandboxes/{id}/contexts");
    let (status, a) = s.post(&contexts, json!({"language": "python"})).await;
    assert_eq!(status, 201, "{a}");
    assert_eq!(a["language"], "python");
    let (status, b) = s.post(&contexts, json!({"cwd": "/tmp"})).await;
    assert_eq!(status, 201, "{b}");
    let (a, b) = (a["id"].as_str().expect("id"), b["id"].as_str().expect("id"));
    assert_ne!(a, b);
    run(&s, &id, json!({"code": "v = 'a'", "context_id": a})).await;
    let in_b = run(
        &s,
        &id,
        json!({"code": "import os\n(globals().get('v'), os.getcwd())", "context_id": b}),
    )
    .await;
    assert_eq!(main_text(&in_b), "(None, '/tmp')");
    assert_eq!(
        main_text(&run(&s, &id, json!({"code": "v", "context_id": a})).await),
        "'a'"
    );

    let (status, listed) = s.request(Method::GET, &contexts, None).await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = listed["contexts"]
        .as_array()
        .expect("contexts")
        .iter()
        .filter_map(|c| c["id"].as_str())
        .collect();
    assert!(ids.contains(&a) && ids.contains(&b), "{listed}");

    let (status, restarted) = s
        .post(&format!("{contexts}/{a}/restart"), Value::Null)
        .await;
    assert_eq!(status, 200, "{restarted}");
    let gone = run(
        &s,
        &id,
        json!({"code": "'v' in globals()", "context_id": a}),
    )
    .await;
    assert_eq!(main_text(&gone), "False");

    let (status, _) = s
        .request(Method::DELETE, &format!("{contexts}/{b}"), None)
        .await;
    assert_eq!(status, 204);
    let (status, v) = s
        .post(
            &format!("/v1/sandboxes/{id}/code"),
            json!({"code": "1", "context_id": b}),
        )
        .await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"]["message"], format!("context {b} does not exist"));
    let (status, v) = s
        .post(
            &format!("/v1/sandboxes/{id}/code"),
            json!({"code": "1", "context_id": "ctx_nope"}),
        )
        .await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = s
        .post(
            &format!("/v1/sandboxes/{id}/code"),
            json!({"code": "1", "context_id": "../x"}),
        )
        .await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = s
        .post("/v1/sandboxes/sbx_doesnotexist/code", json!({"code": "1"}))
        .await;
    assert_eq!(status, 404, "{v}");
    let (status, v) = s
        .post(
            &format!("/v1/sandboxes/{id}/code"),
            json!({"code": "1", "language": "cobol"}),
        )
        .await;
    assert_eq!(status, 422, "{v}");
}

#[tokio::test]
async fn bash_and_javascript_contexts_keep_state() {
    let s = TestServer::start().await;
    let id = sandbox(&s).await;
    run(
        &s,
        &id,
        json!({"code": "cd /tmp; export GREETING=hi; n=3", "language": "bash"}),
    )
    .await;
    let bash = run(
        &s,
        &id,
        json!({"code": "echo \"$GREETING $n $(pwd)\"", "language": "bash"}),
    )
    .await;
    assert_eq!(stdout(&bash), "hi 3 /tmp\n", "{bash}");
    let failed = run(&s, &id, json!({"code": "false", "language": "bash"})).await;
    assert_eq!(failed["error"]["name"], "ExitStatus", "{failed}");
    let looped = run(
        &s,
        &id,
        json!({"code": "m=9; while true; do :; done", "language": "bash", "timeout_seconds": 1}),
    )
    .await;
    assert_eq!(looped["error"]["name"], "TimeoutError", "{looped}");
    let kept = run(&s, &id, json!({"code": "echo $m $n", "language": "bash"})).await;
    assert_eq!(stdout(&kept), "9 3\n", "{kept}");

    run(&s, &id, json!({"code": "var total = 40; function add(a) { return total + a }", "language": "javascript"})).await;
    let js = run(
        &s,
        &id,
        json!({"code": "console.log('adding'); add(2)", "language": "javascript"}),
    )
    .await;
    assert_eq!(main_text(&js), "42", "{js}");
    assert_eq!(stdout(&js), "adding\n");
    let thrown = run(&s, &id, json!({"code": "null.x", "language": "javascript"})).await;
    assert_eq!(thrown["error"]["name"], "TypeError", "{thrown}");
    let slow = run(
        &s,
        &id,
        json!({"code": "while (true) {}", "language": "javascript", "timeout_seconds": 1}),
    )
    .await;
    assert_eq!(slow["error"]["name"], "TimeoutError", "{slow}");
    let after = run(&s, &id, json!({"code": "total", "language": "javascript"})).await;
    assert_eq!(main_text(&after), "40");
    assert_eq!(after["context_restarted"], false);
}

#[tokio::test]
async fn r_contexts_keep_state_and_return_frames_plots_and_errors() {
    let s = TestServer::start().await;
    let id = sandbox(&s).await;
    let r = |code: &str| json!({"code": code, "language": "r"});
    let first = run(
        &s,
        &id,
        r("x <- 41; df <- data.frame(a = 1:2, b = c('u', 'v'))"),
    )
    .await;
    assert_eq!(first["context_id"], "default-r", "{first}");
    assert!(first["error"].is_null(), "{first}");
    assert_eq!(main_text(&run(&s, &id, r("x + 1")).await), "[1] 42");
    // A data frame: text, HTML (and IRkernel's markdown and LaTeX).
    let frame = run(&s, &id, r("df")).await;
    let main = frame["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|r| r["is_main_result"] == true)
        .unwrap_or_else(|| panic!("{frame}"));
    assert!(
        main["data"]["text/html"]
            .as_str()
            .is_some_and(|h| h.contains("<table")),
        "{frame}"
    );
    assert!(main["data"]["text/plain"]
        .as_str()
        .is_some_and(|t| t.contains('u') && t.contains('v')));
    // A plot: a PNG of the size the driver asks for (7×5 in at 100 dpi).
    let plot = run(&s, &id, r("plot(1:10)")).await;
    assert_eq!(png_size(&first_png(&plot)), (700, 500));
    // Output, errors, environment for one cell, and a timeout that keeps the state.
    let printed = run(&s, &id, r("cat('hello', Sys.getenv('WHO'), '\\n')")).await;
    assert_eq!(stdout(&printed), "hello  \n", "{printed}");
    let with_env =
        json!({"code": "cat(Sys.getenv('WHO'))", "language": "r", "env": {"WHO": "r-cell"}});
    assert_eq!(stdout(&run(&s, &id, with_env).await), "r-cell");
    assert_eq!(
        stdout(&run(&s, &id, r("cat(Sys.getenv('WHO', 'unset'))")).await),
        "unset"
    );
    let failed = run(&s, &id, r("stop('boom')")).await;
    assert!(
        failed["error"]["value"]
            .as_str()
            .is_some_and(|v| v.contains("boom")),
        "{failed}"
    );
    let slow = json!({"code": "y <- 7; while (TRUE) {}", "language": "r", "timeout_seconds": 2});
    let slow = run(&s, &id, slow).await;
    assert_eq!(slow["error"]["name"], "TimeoutError", "{slow}");
    assert_eq!(main_text(&run(&s, &id, r("c(x, y)")).await), "[1] 41  7");
    // Python's context is another kernel: it has no `x`.
    let py = run(&s, &id, json!({"code": "'x' in dir()"})).await;
    assert_eq!(main_text(&py), "False");
}

#[tokio::test]
async fn javascript_cells_declare_again_and_await_at_the_top_like_a_notebook() {
    let s = TestServer::start().await;
    let id = sandbox(&s).await;
    let js = async |code: &str| {
        let v = run(&s, &id, json!({"code": code, "language": "javascript"})).await;
        assert!(v["error"].is_null(), "{code}: {v}");
        v
    };
    // A cell run again (or a later one) declares its `let`, `const` and `class` again.
    js("let n = 1; const unit = 'ms'; class Box { get v() { return n } }").await;
    let again = js(
        "let n = 2; const unit = 's'; class Box { get v() { return n * 10 } }; new Box().v + unit",
    )
    .await;
    assert_eq!(main_text(&again), "'20s'", "{again}");
    // Top-level await: the cell's last expression is its result, its declarations are
    // the next cell's globals, and it is not done before what it awaits is.
    let awaited = js(
        "const started = Date.now();\n\
         const { total, parts: [first] } = await new Promise((r) => setTimeout(() => r({ total: 41, parts: [7] }), 300));\n\
         async function twice(x) { return 2 * x }\n\
         total + 1",
    )
    .await;
    assert_eq!(main_text(&awaited), "42", "{awaited}");
    let later =
        js("(Date.now() - started >= 300) + ' ' + first + ' ' + (await twice(total))").await;
    assert_eq!(main_text(&later), "'true 7 82'", "{later}");
    // An error after an await is the cell's error, and the context goes on.
    let thrown = run(
        &s,
        &id,
        json!({"code": "await null; null.x", "language": "javascript"}),
    )
    .await;
    assert_eq!(thrown["error"]["name"], "TypeError", "{thrown}");
    assert_eq!(main_text(&js("n + 1").await), "3");
}

#[tokio::test]
async fn a_template_without_the_interpreter_is_refused_naming_code_interpreter() {
    let s = TestServer::start().await;
    let id = s
        .create_id(json!({"template": "minimal", "isolation": "ns"}))
        .await;
    let (status, v) = s
        .post(&format!("/v1/sandboxes/{id}/code"), json!({"code": "1"}))
        .await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["code"], "no_interpreter");
    let message = v["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("\"minimal\"") && message.contains("\"code-interpreter\" template"),
        "{message}"
    );

    // `base` has python3 but no Jupyter: the driver runs (so bash does), Python is refused.
    hutch_testkit::ensure_template("base");
    let id = s
        .create_id(json!({"template": "base", "isolation": "ns"}))
        .await;
    let (status, v) = s
        .post(&format!("/v1/sandboxes/{id}/code"), json!({"code": "1"}))
        .await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["code"], "no_interpreter");
    let message = v["error"]["message"].as_str().expect("message");
    assert!(
        message.contains("\"base\"") && message.contains("jupyter_client"),
        "{message}"
    );
    let bash = run(&s, &id, json!({"code": "echo in-base", "language": "bash"})).await;
    assert_eq!(stdout(&bash), "in-base\n", "{bash}");
}

#[tokio::test]
async fn output_is_cut_at_the_servers_cap_and_flagged() {
    let s = TestServer::start_with(&["--exec-output-cap", "64KiB"]).await;
    let id = sandbox(&s).await;
    let big = run(&s, &id, json!({"code": "print('x' * 200_000)\n'after'"})).await;
    assert_eq!(big["truncated"], true, "flagged");
    let printed = stdout(&big).len();
    assert!(printed <= 64 << 10, "cut at 64 KiB: {printed}");
    assert!(printed >= 60 << 10, "up to the cap kept: {printed}");
    let small = run(&s, &id, json!({"code": "print('ok')"})).await;
    assert_eq!(small["truncated"], false);
    assert_eq!(stdout(&small), "ok\n");
}

#[tokio::test]
async fn closing_the_stream_interrupts_the_cell() {
    let s = TestServer::start().await;
    let id = sandbox(&s).await;
    run(&s, &id, json!({"code": "import time\nkept = 7"})).await;
    let mut resp = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/code", s.url))
        .bearer_auth(&s.key)
        .header("Accept", "text/event-stream")
        .json(&json!({"code": "print('sleeping', flush=True)\ntime.sleep(120)"}))
        .send()
        .await
        .expect("request");
    let first = resp.chunk().await.expect("chunk").expect("an event");
    assert!(String::from_utf8_lossy(&first).contains("sleeping"));
    drop(resp);
    // The kernel runs one cell at a time: this one answers only once the sleep stopped.
    let started = std::time::Instant::now();
    let next = run(&s, &id, json!({"code": "kept"})).await;
    assert_eq!(main_text(&next), "7", "{next}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the abandoned cell was interrupted ({:?})",
        started.elapsed()
    );
}

fn hutch_cli(
    s: &TestServer,
    args: &[&str],
    stdin: &str,
    dir: &std::path::Path,
) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new(hutch_testkit::hutch_bin())
        .args(args)
        .env("HUTCH_URL", &s.url)
        .env("HUTCH_API_KEY", &s.key)
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("hutch runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("hutch ends")
}

#[tokio::test]
async fn the_cli_runs_code_prints_results_and_saves_charts() {
    let s = TestServer::start().await;
    let id = sandbox(&s).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let o = hutch_cli(&s, &["run-code", &id, "n = 20"], "", dir.path());
    assert!(o.status.success(), "{o:?}");
    let o = hutch_cli(
        &s,
        &["run-code", &id, "-"],
        "print('sum:')\nn + 22\n",
        dir.path(),
    );
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout), "sum:\n42\n");
    let chart = "import matplotlib.pyplot as plt\nplt.plot([1, 2], [2, 1])\nplt.show()";
    let o = hutch_cli(&s, &["run-code", &id, chart], "", dir.path());
    assert!(o.status.success(), "{o:?}");
    let png = std::fs::read(dir.path().join("result-1.png")).expect("the chart was saved");
    png_size(&png);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("saved ./result-1.png"),
        "{o:?}"
    );
    let o = hutch_cli(
        &s,
        &["run-code", &id, "-l", "bash", "echo $((6 * 7))"],
        "",
        dir.path(),
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "42\n", "{o:?}");
    let o = hutch_cli(
        &s,
        &["run-code", &id, "raise ValueError('nope')"],
        "",
        dir.path(),
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("ValueError: nope"),
        "{o:?}"
    );
    let o = hutch_cli(&s, &["--json", "run-code", &id, "n"], "", dir.path());
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(main_text(&v), "20");
}

#[tokio::test]
async fn concurrent_first_calls_start_one_driver_and_one_default_context() {
    let s = TestServer::start().await;
    let id = sandbox(&s).await;
    // The template's start command started the driver (and the default Python kernel)
    // with the sandbox: concurrent first calls use it, and none starts another.
    let (a, b) = tokio::join!(
        run(&s, &id, json!({"code": "a = 1"})),
        run(&s, &id, json!({"code": "b = 2"})),
    );
    assert_eq!(a["context_id"], b["context_id"], "{a} {b}");
    let sum = run(&s, &id, json!({"code": "a + b"})).await;
    assert_eq!(main_text(&sum), "3", "both ran in the one default context");
    let (_, listed) = s
        .request(Method::GET, &format!("/v1/sandboxes/{id}/contexts"), None)
        .await;
    assert_eq!(
        listed["contexts"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    let drivers = s
        .sh_ok(
            &id,
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done \
             | grep -c '^python3 -u [^ ]* [-]-port 49999'",
        )
        .await;
    assert_eq!(drivers.trim(), "1", "one kernel driver");
}

/// A driver that died (here: killed from inside) is started again by the host on the next
/// call, from stdin: concurrent calls start one, share the default context, and the first to
/// run says the context restarted (its kernel's state is gone).
#[tokio::test]
async fn a_killed_driver_is_started_again_by_the_next_calls() {
    let s = TestServer::start().await;
    let id = sandbox(&s).await;
    run(&s, &id, json!({"code": "before = 1"})).await;
    s.sh_ok(
        &id,
        "for p in /proc/[0-9]*; do \
           if tr '\\0' ' ' < $p/cmdline 2>/dev/null \
              | grep -q '^python3 -u /usr/local/lib/hutch/interp-driver[.]py'; \
           then kill ${p#/proc/}; fi; done; sleep 0.5",
    )
    .await;
    let (a, b) = tokio::join!(
        run(&s, &id, json!({"code": "a = 1"})),
        run(&s, &id, json!({"code": "b = 2"})),
    );
    assert_eq!(a["context_id"], b["context_id"], "{a} {b}");
    let restarted = [&a, &b]
        .iter()
        .filter(|v| v["context_restarted"] == true)
        .count();
    assert_eq!(
        restarted, 1,
        "the first cell in the new kernel says so: {a} {b}"
    );
    let sum = run(&s, &id, json!({"code": "a + b + ('before' in globals())"})).await;
    assert_eq!(
        main_text(&sum),
        "3",
        "both ran in the new kernel, which lost `before`"
    );
    let drivers = s
        .sh_ok(
            &id,
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done \
             | grep -c '^python3 -u - [-]-port 49999'",
        )
        .await;
    assert_eq!(drivers.trim(), "1", "one driver started by the host");
}

#[tokio::test]
async fn a_running_cell_counts_against_the_sandboxs_cap_of_execs() {
    let s = TestServer::start_with(&["--max-execs-per-sandbox", "1"]).await;
    let id = sandbox(&s).await;
    run(&s, &id, json!({"code": "import time"})).await;
    let mut resp = s
        .http
        .post(format!("{}/v1/sandboxes/{id}/code", s.url))
        .bearer_auth(&s.key)
        .header("Accept", "text/event-stream")
        .json(&json!({"code": "print('busy', flush=True)\ntime.sleep(120)"}))
        .send()
        .await
        .expect("request");
    let first = resp.chunk().await.expect("chunk").expect("an event");
    assert!(String::from_utf8_lossy(&first).contains("busy"));
    let (status, v) = s
        .post(&format!("/v1/sandboxes/{id}/code"), json!({"code": "1"}))
        .await;
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "too_many_execs");
    drop(resp);
    let freed = hutch_testkit::wait_until(Duration::from_secs(20), async || {
        let (status, v) = s
            .post(
                &format!("/v1/sandboxes/{id}/code"),
                json!({"code": "2 + 2"}),
            )
            .await;
        (status == 200).then_some(v)
    })
    .await
    .expect("the slot is given back when the stream closes");
    assert_eq!(main_text(&freed), "4");
}
