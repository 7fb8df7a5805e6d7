// The code interpreter: stateful contexts and `runCode` (docs/code-interpreter.md).
import type { Client } from "./client.js";
import { HutchError, errorFromEvent } from "./errors.js";
import { sseEvents } from "./sse.js";

type Json = Record<string, unknown>;

/** MIME types by the short name {@link Result.formats} reports. */
const FORMATS: Record<string, string> = {
  text: "text/plain",
  html: "text/html",
  markdown: "text/markdown",
  svg: "image/svg+xml",
  png: "image/png",
  jpeg: "image/jpeg",
  pdf: "application/pdf",
  latex: "text/latex",
  json: "application/json",
  javascript: "application/javascript",
};

function text(v: unknown): string | undefined {
  if (Array.isArray(v)) return v.map(String).join("");
  return typeof v === "string" ? v : undefined;
}

/**
 * One rich output: the cell's value (`isMainResult`) or something it displayed (a chart, a
 * table), with every MIME type the kernel sent.
 */
export class Result {
  /** MIME type → content as the server sent it (images base64). */
  readonly data: Json;
  /** The value of the cell's last expression. */
  readonly isMainResult: boolean;
  readonly metadata: Json;
  readonly displayId?: string;

  constructor(raw: Json) {
    this.data = raw.data && typeof raw.data === "object" ? (raw.data as Json) : {};
    this.isMainResult = raw.is_main_result === true;
    this.metadata = raw.metadata && typeof raw.metadata === "object" ? (raw.metadata as Json) : {};
    if (typeof raw.display_id === "string") this.displayId = raw.display_id;
  }

  /** `text/plain`: the value's repr. */
  get text(): string | undefined {
    return text(this.data["text/plain"]);
  }
  get html(): string | undefined {
    return text(this.data["text/html"]);
  }
  get markdown(): string | undefined {
    return text(this.data["text/markdown"]);
  }
  get svg(): string | undefined {
    return text(this.data["image/svg+xml"]);
  }
  get latex(): string | undefined {
    return text(this.data["text/latex"]);
  }
  /** `application/json`, decoded. */
  get json(): unknown {
    return this.data["application/json"];
  }
  private binary(mime: string): Buffer | undefined {
    const v = text(this.data[mime]);
    return v === undefined ? undefined : Buffer.from(v, "base64");
  }
  /** `image/png` as bytes. */
  get png(): Buffer | undefined {
    return this.binary("image/png");
  }
  /** `image/jpeg` as bytes. */
  get jpeg(): Buffer | undefined {
    return this.binary("image/jpeg");
  }
  /** `application/pdf` as bytes. */
  get pdf(): Buffer | undefined {
    return this.binary("application/pdf");
  }
  /** Short names of the formats present (`["text", "png"]`). */
  formats(): string[] {
    const byMime = Object.fromEntries(Object.entries(FORMATS).map(([k, v]) => [v, k]));
    return Object.keys(this.data).map((mime) => byMime[mime] ?? mime);
  }
}

/**
 * What the code raised, or why it stopped: `TimeoutError` (interrupted at its timeout, state
 * kept), `KernelDied` (the kernel exited; the next call starts a new one), `ExitStatus` (a Bash
 * cell whose last command failed).
 */
export interface ExecutionError {
  name: string;
  value: string;
  traceback: string[];
  timedOut: boolean;
}

/** A finished run of a cell. */
export interface Execution {
  results: Result[];
  logs: { stdout: string[]; stderr: string[] };
  error?: ExecutionError;
  executionCount?: number;
  durationMs: number;
  contextId: string;
  /** The context's kernel was started afresh for this run: earlier state is gone. */
  contextRestarted: boolean;
  /** Output was cut at the server's output cap. */
  truncated: boolean;
  /** The main result's `text/plain`, if the cell ended in a value. */
  text?: string;
}

/** A stateful context: one kernel of one language. */
export interface CodeContext {
  id: string;
  language: string;
  cwd?: string;
}

/** Options of {@link Sandbox.runCode}. */
export interface RunCodeOptions {
  /** The default context's language: `python` (default), `r`, `bash` or `javascript`. Not with `context`. */
  language?: string;
  /** A context (or its id) from {@link Sandbox.createCodeContext}. */
  context?: CodeContext | string;
  /** Seconds before the cell is interrupted (state kept; `error.name` is `TimeoutError`); 0 no limit. */
  timeout?: number;
  /** Environment variables for this cell only. */
  env?: Record<string, string>;
  onStdout?: (text: string) => unknown;
  onStderr?: (text: string) => unknown;
  /** Called with each result and display (charts, tables, the cell's value). */
  onResult?: (result: Result) => unknown;
  onError?: (error: ExecutionError) => unknown;
  signal?: AbortSignal;
}

/** Options of {@link Sandbox.createCodeContext}. */
export interface CodeContextOptions {
  language?: string;
  cwd?: string;
  env?: Record<string, string>;
}

function contextId(context: CodeContext | string | undefined): string | undefined {
  if (context === undefined) return undefined;
  return typeof context === "string" ? context : context.id;
}

function executionError(p: Json): ExecutionError {
  return {
    name: String(p.name ?? ""),
    value: String(p.value ?? ""),
    traceback: Array.isArray(p.traceback) ? p.traceback.map(String) : [],
    timedOut: p.timed_out === true,
  };
}

function codeContext(p: Json): CodeContext {
  const c: CodeContext = { id: String(p.id ?? ""), language: String(p.language ?? "") };
  if (typeof p.cwd === "string") c.cwd = p.cwd;
  return c;
}

const contextsPath = (sandboxId: string, suffix = "") =>
  `/v1/sandboxes/${encodeURIComponent(sandboxId)}/contexts${suffix}`;

/** `POST /v1/sandboxes/{id}/code` as server-sent events, assembled into an {@link Execution}. */
export async function runCode(
  client: Client,
  sandboxId: string,
  code: string,
  opts: RunCodeOptions = {},
): Promise<Execution> {
  const json: Json = { code };
  if (opts.language !== undefined) json.language = opts.language;
  if (opts.context !== undefined) json.context_id = contextId(opts.context);
  if (opts.timeout !== undefined) json.timeout_seconds = opts.timeout;
  if (opts.env !== undefined) json.env = opts.env;
  const resp = await client.request("POST", `/v1/sandboxes/${encodeURIComponent(sandboxId)}/code`, {
    json,
    accept: "text/event-stream",
    timeoutMs: null,
    signal: opts.signal,
  });
  if (!resp.body) throw new HutchError("the code stream has no body");
  const results: Result[] = [];
  const logs = { stdout: [] as string[], stderr: [] as string[] };
  let error: ExecutionError | undefined;
  for await (const ev of sseEvents(resp.body)) {
    let p: Json = {};
    try {
      p = ev.data ? (JSON.parse(ev.data) as Json) : {};
    } catch {
      continue;
    }
    if (ev.event === "stdout" || ev.event === "stderr") {
      const t = String(p.text ?? "");
      logs[ev.event].push(t);
      const cb = ev.event === "stdout" ? opts.onStdout : opts.onStderr;
      if (cb) await cb(t);
    } else if (ev.event === "result" || ev.event === "display") {
      const r = new Result(p);
      results.push(r);
      if (opts.onResult) await opts.onResult(r);
    } else if (ev.event === "error") {
      error = executionError(p);
      if (opts.onError) await opts.onError(error);
    } else if (ev.event === "failed") {
      throw errorFromEvent(p);
    } else if (ev.event === "end") {
      const execution: Execution = {
        results,
        logs,
        durationMs: Number(p.duration_ms ?? 0),
        contextId: String(p.context_id ?? ""),
        contextRestarted: p.context_restarted === true,
        truncated: p.truncated === true,
      };
      if (error) execution.error = error;
      if (typeof p.execution_count === "number") execution.executionCount = p.execution_count;
      const main = results.find((r) => r.isMainResult)?.text;
      if (main !== undefined) execution.text = main;
      return execution;
    }
  }
  throw new HutchError("the code stream ended before the cell finished");
}

/** `POST /v1/sandboxes/{id}/contexts`. */
export async function createCodeContext(
  client: Client,
  sandboxId: string,
  opts: CodeContextOptions = {},
): Promise<CodeContext> {
  const json: Json = {};
  if (opts.language !== undefined) json.language = opts.language;
  if (opts.cwd !== undefined) json.cwd = opts.cwd;
  if (opts.env !== undefined) json.env = opts.env;
  return codeContext(await client.requestJson("POST", contextsPath(sandboxId), { json, timeoutMs: null }));
}

/** `GET /v1/sandboxes/{id}/contexts`. */
export async function listCodeContexts(client: Client, sandboxId: string): Promise<CodeContext[]> {
  const doc = await client.requestJson("GET", contextsPath(sandboxId), { timeoutMs: null });
  return Array.isArray(doc.contexts) ? (doc.contexts as Json[]).map(codeContext) : [];
}

/** `POST /v1/sandboxes/{id}/contexts/{cid}/restart`. */
export async function restartCodeContext(
  client: Client,
  sandboxId: string,
  context: CodeContext | string,
): Promise<CodeContext> {
  const path = contextsPath(sandboxId, `/${encodeURIComponent(contextId(context) ?? "")}/restart`);
  return codeContext(await client.requestJson("POST", path, { timeoutMs: null }));
}

/** `DELETE /v1/sandboxes/{id}/contexts/{cid}`. */
export async function deleteCodeContext(
  client: Client,
  sandboxId: string,
  context: CodeContext | string,
): Promise<void> {
  const path = contextsPath(sandboxId, `/${encodeURIComponent(contextId(context) ?? "")}`);
  await client.request("DELETE", path, { timeoutMs: null });
}
