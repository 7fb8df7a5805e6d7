/**
 * Process handles: processes that outlive the call that started them (docs/processes.md).
 *
 * `sb.exec(cmd, { background: true, tag })` (or `sb.processes.start`) starts one and returns
 * a {@link Process}; `sb.processes.list()` and `sb.processes.connect(pidOrTag)` find them
 * again. A {@link Process} attaches to read its output (`for await` over it, or
 * {@link Process.wait} for the collected result) and reaches its stdin, signals and terminal.
 */
import { mapFetchError, type Client } from "./client.js";
import { HutchError, ProcessExited, TimeoutError, errorFromEvent } from "./errors.js";
import type { ExecResult } from "./models.js";
import { sseEvents } from "./sse.js";

type Json = Record<string, unknown>;

/** How a process handle ended. */
export interface ProcessExit {
  /** Its status; `128+N` if killed by signal N; 124 when its timeout killed it. */
  exitCode: number;
  /** The signal that ended it, if one did. */
  signal: number | undefined;
  /** Its timeout killed its process group. */
  timedOut: boolean;
  durationMs: number;
  raw: Json;
}

/** A process handle as the server describes it. */
export interface ProcessInfo {
  /** Its pid inside the sandbox (also its process group). */
  pid: number;
  tag: string | undefined;
  /** The argv it runs (a shell string as `["/bin/sh", "-c", STRING]`). */
  cmd: string[];
  /** The environment the request added (not the whole environment). */
  env: Record<string, string>;
  cwd: string;
  user: string;
  /** Its terminal's current size, or undefined without a terminal. */
  pty: { cols: number; rows: number } | undefined;
  /** It has a stdin to write to. */
  stdin: boolean;
  startedAt: string;
  /** `"running"` or `"exited"`. */
  state: string;
  /** How it ended, once it has. */
  exit: ProcessExit | undefined;
  raw: Json;
}

/** One event of a process's output, in the order it was written. */
export type ProcessEvent =
  | { kind: "stdout"; data: Uint8Array; text: string }
  | { kind: "stderr"; data: Uint8Array; text: string }
  /** The process's ring dropped this many bytes before what follows. */
  | { kind: "missed"; stdout: number; stderr: number }
  | { kind: "exit"; exit: ProcessExit };

/** A process to start ({@link Processes.start}). */
export interface ProcessStartOptions {
  /** A name to find it by, unique among the sandbox's running handles. */
  tag?: string;
  env?: Record<string, string>;
  /** Absolute working directory. */
  cwd?: string;
  user?: string;
  /** Seconds before its process group is killed (default: no limit). */
  timeoutSeconds?: number;
  /** Run it on a terminal of this size. */
  pty?: { cols: number; rows: number };
  /** Give it a stdin pipe for {@link Process.sendStdin}. */
  stdin?: boolean;
}

/** A signal: a number (1-64) or a name with or without `SIG` (`"TERM"`, `"SIGKILL"`). */
export type Signal = number | string;

const num = (v: unknown, d = 0): number => (typeof v === "number" ? v : d);

/** @internal */
export function processExit(d: Json): ProcessExit {
  const raw = { ...d };
  delete raw.event;
  return {
    exitCode: num(d.exit_code, -1),
    signal: typeof d.signal === "number" ? d.signal : undefined,
    timedOut: d.timed_out === true,
    durationMs: num(d.duration_ms),
    raw,
  };
}

/** @internal */
export function processInfo(d: Json): ProcessInfo {
  const pty = d.pty as Json | undefined;
  const env = (d.env ?? {}) as Record<string, unknown>;
  return {
    pid: num(d.pid),
    tag: typeof d.tag === "string" ? d.tag : undefined,
    cmd: Array.isArray(d.cmd) ? d.cmd.map(String) : [],
    env: Object.fromEntries(Object.entries(env).map(([k, v]) => [k, String(v)])),
    cwd: typeof d.cwd === "string" ? d.cwd : "",
    user: typeof d.user === "string" ? d.user : "",
    pty: pty && typeof pty === "object" ? { cols: num(pty.cols), rows: num(pty.rows) } : undefined,
    stdin: d.stdin === true,
    startedAt: typeof d.started_at === "string" ? d.started_at : "",
    state: typeof d.state === "string" ? d.state : "",
    exit: d.exit && typeof d.exit === "object" ? processExit(d.exit as Json) : undefined,
    raw: d,
  };
}

/** The path segment naming a process: its pid, or `tag:NAME` (`"tag:NAME"` is taken as NAME). */
export function processSegment(ref: number | string): string {
  if (typeof ref === "number") {
    if (!Number.isInteger(ref) || ref < 1) throw new RangeError(`a pid is a positive integer, got ${ref}`);
    return String(ref);
  }
  const tag = ref.startsWith("tag:") ? ref.slice(4) : ref;
  if (!tag) throw new RangeError("a tag must not be empty");
  return `tag:${encodeURIComponent(tag)}`;
}

function processesPath(sandboxId: string, suffix = ""): string {
  return `/v1/sandboxes/${encodeURIComponent(sandboxId)}/processes${suffix}`;
}

function processPath(sandboxId: string, ref: number | string, suffix = ""): string {
  return processesPath(sandboxId, `/${processSegment(ref)}${suffix}`);
}

/** @internal The body of `POST …/processes`. */
export function startBody(cmd: string | readonly string[], opts: ProcessStartOptions): Json {
  if (typeof cmd !== "string" && !Array.isArray(cmd)) {
    throw new TypeError("cmd must be a string (shell command line) or an array of strings (argv)");
  }
  const body: Json = { cmd: typeof cmd === "string" ? cmd : cmd.map(String) };
  if (opts.env !== undefined) body.env = opts.env;
  if (opts.cwd !== undefined) body.cwd = opts.cwd;
  if (opts.user !== undefined) body.user = opts.user;
  if (opts.timeoutSeconds !== undefined) body.timeout_seconds = opts.timeoutSeconds;
  if (opts.tag !== undefined) body.tag = opts.tag;
  if (opts.pty !== undefined) body.pty = { cols: opts.pty.cols, rows: opts.pty.rows };
  if (opts.stdin) body.stdin = true;
  return body;
}

/** Collects a process's events into an {@link ExecResult}. */
class Collected {
  stdout: Uint8Array[] = [];
  stderr: Uint8Array[] = [];
  missed = { stdout: 0, stderr: 0 };
  exit: ProcessExit | undefined;

  take(ev: ProcessEvent): void {
    if (ev.kind === "stdout" || ev.kind === "stderr") (ev.kind === "stdout" ? this.stdout : this.stderr).push(ev.data);
    else if (ev.kind === "missed") {
      this.missed.stdout += ev.stdout;
      this.missed.stderr += ev.stderr;
    } else this.exit = ev.exit;
  }

  result(): ExecResult {
    const exit = this.exit!;
    const out = Buffer.concat(this.stdout);
    const err = Buffer.concat(this.stderr);
    return {
      stdout: out.toString("utf8"),
      stderr: err.toString("utf8"),
      exitCode: exit.exitCode,
      timedOut: exit.timedOut,
      durationMs: exit.durationMs,
      stdoutTruncated: this.missed.stdout > 0,
      stderrTruncated: this.missed.stderr > 0,
      oomKilled: false,
      stdoutBytes: new Uint8Array(out),
      stderrBytes: new Uint8Array(err),
      ok: exit.exitCode === 0 && !exit.timedOut,
      raw: exit.raw,
    };
  }
}

function decodeOutput(payload: Json): Uint8Array | undefined {
  if (typeof payload.data === "string") return new Uint8Array(Buffer.from(payload.data, "utf8"));
  if (typeof payload.data_b64 === "string") return new Uint8Array(Buffer.from(payload.data_b64, "base64"));
  return undefined;
}

/**
 * A process handle in a sandbox. `for await (const ev of proc)` attaches and yields its
 * {@link ProcessEvent}s — first what it wrote while nobody was attached — until its exit;
 * {@link Process.wait} collects them. Detaching (leaving the loop) never kills it.
 */
export class Process implements AsyncIterable<ProcessEvent> {
  private current: ProcessInfo;

  /** @internal Use `sb.exec(…, { background: true })`, `sb.processes.start` or `.connect`. */
  constructor(
    private readonly client: Client,
    private readonly sandboxId: string,
    info: ProcessInfo,
  ) {
    this.current = info;
  }

  /** Its pid inside the sandbox. */
  get pid(): number {
    return this.current.pid;
  }

  /** Its tag, if it was started with one. */
  get tag(): string | undefined {
    return this.current.tag;
  }

  /** Its description as last seen (see {@link Process.refresh}). */
  get info(): ProcessInfo {
    return this.current;
  }

  /** Fetch its current description (running or exited, and how). */
  async refresh(): Promise<ProcessInfo> {
    this.current = processInfo(await this.client.requestJson<Json>("GET", processPath(this.sandboxId, this.pid)));
    return this.current;
  }

  /**
   * Attach and yield its events until its exit. With `replay` (the default) first what its ring
   * still holds (a `missed` event first if the ring dropped some); else only what it writes
   * from now on. `idleTimeoutMs` bounds the wait for the next event.
   */
  async *events(opts: { replay?: boolean; idleTimeoutMs?: number; signal?: AbortSignal } = {}): AsyncGenerator<ProcessEvent> {
    const resp = await this.client.request("GET", processPath(this.sandboxId, this.pid, "/output"), {
      query: opts.replay === false ? [["replay", "false"]] : undefined,
      accept: "text/event-stream",
      timeoutMs: null,
      signal: opts.signal,
    });
    if (!resp.body) throw new HutchError("the process's output has no body");
    const decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    try {
      for await (const ev of sseEvents(resp.body, opts.idleTimeoutMs)) {
        let payload: Json = {};
        try {
          payload = ev.data ? (JSON.parse(ev.data) as Json) : {};
        } catch {
          continue;
        }
        if (ev.event === "stdout" || ev.event === "stderr") {
          const data = decodeOutput(payload);
          if (data) yield { kind: ev.event, data, text: decoders[ev.event].decode(data, { stream: true }) };
        } else if (ev.event === "missed") {
          yield { kind: "missed", stdout: num(payload.stdout), stderr: num(payload.stderr) };
        } else if (ev.event === "exit") {
          const exit = processExit(payload);
          this.current = { ...this.current, state: "exited", exit };
          yield { kind: "exit", exit };
          return;
        } else if (ev.event === "error") {
          throw errorFromEvent(payload);
        }
      }
    } catch (e) {
      if (e instanceof HutchError) throw e;
      const err = e as { name?: string };
      if (err?.name === "AbortError" || err?.name === "TypeError") throw mapFetchError(e, this.client.url);
      throw e;
    }
    throw new HutchError("the process's output stream ended without an exit");
  }

  [Symbol.asyncIterator](): AsyncIterator<ProcessEvent> {
    return this.events();
  }

  /**
   * Wait until it exits; its output and exit like {@link Sandbox.exec}'s result. The output is
   * what its ring still held at the attach (1 MiB per stream) and all it wrote after;
   * `stdoutTruncated` says the ring had dropped some before.
   * @throws {@link TimeoutError} when it did not exit within `timeoutMs`.
   */
  async wait(opts: { timeoutMs?: number } = {}): Promise<ExecResult> {
    const controller = new AbortController();
    const timer =
      opts.timeoutMs === undefined ? undefined : setTimeout(() => controller.abort(), opts.timeoutMs);
    const collected = new Collected();
    try {
      for await (const ev of this.events({ signal: controller.signal })) collected.take(ev);
    } catch (e) {
      if (controller.signal.aborted) throw new TimeoutError(`process ${this.pid} did not exit within ${opts.timeoutMs} ms`);
      throw e;
    } finally {
      clearTimeout(timer);
    }
    return collected.result();
  }

  /**
   * Write to its stdin (or type into its terminal); resolves once it was all written.
   * @throws {@link InvalidRequest} when it was started without stdin; {@link ProcessExited}.
   */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
    await this.client.request("POST", processPath(this.sandboxId, this.pid, "/stdin"), {
      body,
      contentType: "application/octet-stream",
      timeoutMs: null,
    });
  }

  /** End of file on its stdin (a terminal gets ^D). */
  async closeStdin(): Promise<void> {
    await this.client.request("POST", processPath(this.sandboxId, this.pid, "/close-stdin"));
  }

  /** Send a signal to its process group: `"TERM"`, `"INT"`, `9`… */
  async signal(signal: Signal): Promise<void> {
    if (typeof signal !== "number" && typeof signal !== "string") {
      throw new TypeError(`a signal is a number or a name such as "TERM", got ${String(signal)}`);
    }
    await this.client.request("POST", processPath(this.sandboxId, this.pid, "/signal"), { json: { signal } });
  }

  /** SIGKILL to its process group. Killing one that has exited is not an error. */
  async kill(): Promise<void> {
    try {
      await this.client.request("DELETE", processPath(this.sandboxId, this.pid));
    } catch (e) {
      if (!(e instanceof ProcessExited)) throw e;
    }
  }

  /** Resize its terminal (it was started with `pty`). */
  async resize(cols: number, rows: number): Promise<void> {
    await this.client.request("POST", processPath(this.sandboxId, this.pid, "/resize"), { json: { cols, rows } });
  }

  toString(): string {
    return `Process(pid=${this.pid}, tag=${this.tag ?? "-"}, state=${this.current.state})`;
  }
}

/** `sb.processes`: the sandbox's process handles. */
export class Processes {
  /** @internal */
  constructor(
    private readonly client: Client,
    private readonly sandboxId: string,
  ) {}

  /**
   * Start a process handle; it runs on after this resolves (and after this program).
   * @throws {@link TagInUse} when a running handle has the tag; {@link InvalidRequest} for a
   * program that cannot be found (`code === "command_not_found"`).
   */
  async start(cmd: string | readonly string[], opts: ProcessStartOptions = {}): Promise<Process> {
    const doc = await this.client.requestJson<Json>("POST", processesPath(this.sandboxId), {
      json: startBody(cmd, opts),
      timeoutMs: null,
    });
    return new Process(this.client, this.sandboxId, processInfo(doc));
  }

  /** Running handles, then the exited ones the sandbox still keeps (the last 64, for 10 minutes). */
  async list(): Promise<Process[]> {
    const doc = await this.client.requestJson<{ processes?: Json[] }>("GET", processesPath(this.sandboxId));
    return (doc.processes ?? []).map((d) => new Process(this.client, this.sandboxId, processInfo(d)));
  }

  /**
   * The handle with this pid (number) or tag (string).
   * @throws {@link ProcessNotFound} when none has it.
   */
  async connect(pidOrTag: number | string): Promise<Process> {
    const doc = await this.client.requestJson<Json>("GET", processPath(this.sandboxId, pidOrTag));
    return new Process(this.client, this.sandboxId, processInfo(doc));
  }
}
