import "./polyfill.js";
import { Client, LogStream, anySignal, mapFetchError, type ClientOptions } from "./client.js";
import {
  AuthError,
  HutchError,
  InvalidRequest,
  SandboxNotFound,
  FileNotFound,
  errorFromEvent,
  errorFromResponse,
} from "./errors.js";
import {
  execResult,
  exploreResult,
  fileEntry,
  logLine,
  sandboxInfo,
  snapshot,
  usage,
  type ExecResult,
  type ExploreResult,
  type FileEntry,
  type LogLine,
  type SandboxInfo,
  type Snapshot,
  type Usage,
} from "./models.js";
import {
  createCodeContext,
  deleteCodeContext,
  listCodeContexts,
  restartCodeContext,
  runCode,
  type CodeContext,
  type CodeContextOptions,
  type Execution,
  type RunCodeOptions,
} from "./code.js";
import { Process, Processes, processInfo } from "./process.js";
import { PtySession, type PtyOptions } from "./pty.js";
import { sseEvents } from "./sse.js";
import { FileWatch, type WatchOptions } from "./watch.js";

/** Which log lines {@link Sandbox.logs} and {@link Sandbox.followLogs} return. */
export interface LogOptions {
  /** Only the last N lines (of what was written so far, when following; default 0 then). */
  tail?: number;
  /**
   * Only lines written from this time on: RFC 3339, a duration before now (`"10m"`), Unix
   * seconds or a `Date`. Only for logs whose lines carry times (the agent's).
   */
  since?: string | number | Date;
  /** `"agent"` (ns) or `"console"` (vm), or both; default every log the sandbox has. */
  source?: string | string[];
}

function logQuery(opts: LogOptions, follow: boolean): Array<[string, string]> {
  const q: Array<[string, string]> = [];
  if (opts.source !== undefined) q.push(["source", Array.isArray(opts.source) ? opts.source.join(",") : opts.source]);
  if (opts.tail !== undefined) {
    if (!Number.isInteger(opts.tail) || opts.tail < 0) throw new RangeError(`tail must be a whole number >= 0, got ${opts.tail}`);
    q.push(["tail", String(opts.tail)]);
  }
  if (opts.since !== undefined) {
    q.push(["since", opts.since instanceof Date ? opts.since.toISOString() : String(opts.since)]);
  }
  if (follow) q.push(["follow", "true"]);
  return q;
}

/** A command: a string runs under `/bin/sh -c`; an array runs that program without a shell. */
export type Command = string | readonly string[];

/** Where to find the server: an existing {@link Client}, or options to make one. */
export interface ConnectOptions extends ClientOptions {
  /** Use this client (else one is made from the other options and the environment). */
  client?: Client;
}

/** Egress policy, enforced on the host: IPv4 addresses, CIDRs, names, `*.suffix` wildcards; an allow match wins over a deny match, which wins over `egress`. A server started with `--network off` accepts only `{egress: "none"}`. */
export interface NetworkPolicy {
  egress?: "allow" | "deny" | "none" | string;
  allow?: string[];
  deny?: string[];
}

/**
 * A durable volume to mount on create (make one with {@link Client.createVolume}). Data written
 * there outlives the sandbox (writes beyond the volume's size fail with `ENOSPC`). A volume can
 * be attached read-write to one sandbox at a time, or read-only to any number; otherwise create
 * is a 409. {@link SandboxInfo.volumes} lists the mounts (by id). Forks get only the read-only
 * ones.
 */
export interface VolumeMount {
  /** The volume's id (`vol_…`) or name. */
  volume: string;
  /** Absolute, normalised path inside the sandbox; `/`, `/etc` and `/proc`, `/sys`, `/dev` are 422. */
  path: string;
  /** Mount it read-only (default false). */
  readOnly?: boolean;
}

/** Options of {@link Sandbox.create}. Every field is optional. */
export interface CreateOptions extends ConnectOptions {
  /** Template name; the server's default when unset. */
  template?: string;
  /** `auto`, `ns` or `vm`. */
  isolation?: "auto" | "ns" | "vm";
  /** Idle lifetime: the sandbox is reaped after this long without a call. */
  ttlSeconds?: number;
  /** Never reap the sandbox (and do not kill it on disposal). */
  persistent?: boolean;
  /** String labels, filterable with {@link Sandbox.list}. */
  metadata?: Record<string, string>;
  /** Environment for every command. */
  env?: Record<string, string>;
  /** CPU bandwidth in cores (may be fractional). */
  cpus?: number;
  memoryMib?: number;
  diskMib?: number;
  pidsMax?: number;
  network?: NetworkPolicy;
  /** Durable volumes to mount; see {@link VolumeMount}. */
  volumes?: VolumeMount[];
  /**
   * Start from this snapshot (its id `snap_…` from {@link Sandbox.snapshot}, or its name while
   * no other of your snapshots has it; several are a {@link ConflictError} listing their ids)
   * instead of the bare template: the sandbox gets the snapshot's files, copy-on-write (nothing is copied), over the
   * snapshot's template, and the resources and environment of the snapshot's source sandbox as
   * defaults (other options override them). `template` may be left out (a different one is
   * 422). On `ns` no process is restored: the sandbox starts with a fresh agent. While the
   * sandbox exists the snapshot cannot be deleted.
   */
  snapshot?: string;
  /**
   * Hibernate the sandbox after this many seconds without exec, file or PTY calls, with no
   * client connected and under 1 % CPU use (0/unset: never). Meant for persistent sandboxes; the
   * next call wakes it. On `ns` its processes end with the hibernation (see {@link Sandbox.hibernate}).
   */
  idleHibernateSeconds?: number;
}

/** Options of {@link Sandbox.explore}. */
export interface ExploreOptions {
  /**
   * Seconds each command may run before it is killed (exit code 124, `timedOut`); the server's
   * default is 60, at most 3600.
   */
  timeoutSeconds?: number;
  /** Which child survives; only `"winner"` is accepted. */
  keep?: "winner";
  /**
   * Score each command by the number the first capture group of this regex captures in its
   * stdout (0 without a match). Default: 1 for exit status 0, else 0.
   */
  scoreRegex?: string;
}

/** Options of {@link Sandbox.exec}. */
export interface ExecOptions {
  /** Extra environment variables. */
  env?: Record<string, string>;
  /** Absolute working directory (default: the user's home, else `/`). */
  cwd?: string;
  /** Text or bytes fed to standard input. */
  stdin?: string | Uint8Array;
  /**
   * Seconds before the command is killed (`exitCode` 124, `timedOut` set); `0` means no limit;
   * default the server's (60 s).
   */
  timeoutSeconds?: number;
  /** User to run as (default `root`). */
  user?: string;
  /** Abort the call (for a stream this kills the command). */
  signal?: AbortSignal;
}

/**
 * Options of {@link Sandbox.exec} that start the command as a process handle: it runs on,
 * without a time limit unless `timeoutSeconds` says otherwise.
 */
export interface BackgroundExecOptions extends ExecOptions {
  background: true;
  /** A name to find it by (`sb.processes.connect(tag)`), unique among running handles. */
  tag?: string;
}

/** Options of {@link Sandbox.execStream}: {@link ExecOptions} plus callbacks. */
export interface ExecStreamOptions extends ExecOptions {
  /** Called with each chunk of standard output (may return a promise, which is awaited). */
  onStdout?: (text: string) => unknown;
  /** Called with each chunk of standard error. */
  onStderr?: (text: string) => unknown;
  /** Called with the process id once it started. */
  onStart?: (pid: number) => unknown;
}

function execBody(cmd: Command, opts: ExecOptions): Record<string, unknown> {
  if (typeof cmd !== "string" && !Array.isArray(cmd)) {
    throw new TypeError("cmd must be a string (shell command line) or an array of strings (argv)");
  }
  const body: Record<string, unknown> = { cmd: typeof cmd === "string" ? cmd : cmd.map(String) };
  if (opts.env !== undefined) body.env = opts.env;
  if (opts.cwd !== undefined) body.cwd = opts.cwd;
  if (opts.user !== undefined) body.user = opts.user;
  if (typeof opts.stdin === "string") body.stdin = opts.stdin;
  else if (opts.stdin !== undefined) body.stdin_b64 = Buffer.from(opts.stdin).toString("base64");
  if (opts.timeoutSeconds !== undefined) body.timeout_seconds = opts.timeoutSeconds;
  return body;
}

/** How long to wait for a collected answer: the command's timeout plus slack, or forever. */
function execTimeoutMs(timeoutSeconds: number | undefined): number | null {
  return timeoutSeconds ? (timeoutSeconds + 30) * 1000 : null;
}

function dropUndefined(o: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined));
}

function clientFor(opts: ConnectOptions): Client {
  return opts.client ?? new Client(opts);
}

function sandboxPath(id: string, suffix = ""): string {
  return `/v1/sandboxes/${encodeURIComponent(id)}${suffix}`;
}

/** What the port proxy adds to `via` on the service's answers (Hutch's own errors lack it). */
const PROXY_VIA = "1.1 hutch";

/** `/v1/sandboxes/{id}/ports/{port}{path}`; `path` (query included) gets a leading `/`. */
function portPath(id: string, port: number, path: string): string {
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new RangeError(`port must be an integer from 1 to 65535, got ${port}`);
  }
  return sandboxPath(id, `/ports/${port}${path.startsWith("/") ? path : "/" + path}`);
}

type Json = Record<string, unknown>;

/**
 * A sandbox on a Hutch server. Create one with {@link Sandbox.create} (best with `await using`,
 * which kills it when the scope ends unless it is persistent), attach with
 * {@link Sandbox.connect}, or find them with {@link Sandbox.list}.
 *
 * ```ts
 * await using sb = await Sandbox.create({ template: "base" });
 * const r = await sb.exec(["python3", "-c", "print(6*7)"]);
 * console.log(r.stdout); // 42
 * ```
 */
export class Sandbox implements AsyncDisposable {
  private _info: SandboxInfo;
  /** The client this sandbox talks through. */
  readonly client: Client;
  /** File operations inside the sandbox. */
  readonly files: Files;
  /** The sandbox's process handles: `start`, `list`, `connect` (docs/processes.md). */
  readonly processes: Processes;

  /** Wrap an existing sandbox; prefer {@link Sandbox.create}, {@link Sandbox.connect} or {@link Sandbox.list}. */
  constructor(info: SandboxInfo, client: Client) {
    this._info = info;
    this.client = client;
    this.files = new Files(this);
    this.processes = new Processes(client, info.id);
  }

  /**
   * Create a sandbox; it is `running` when the promise resolves.
   * @throws {@link InvalidRequest} for a value the server refuses (e.g. a bad volume path);
   *   {@link NotFoundError} for an unknown template, snapshot or volume; {@link ConflictError}
   *   when the template is not ready or a volume is attached elsewhere in a way that excludes
   *   this mount.
   */
  static async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const client = clientFor(opts);
    const body = dropUndefined({
      template: opts.template,
      isolation: opts.isolation,
      ttl_seconds: opts.ttlSeconds,
      persistent: opts.persistent,
      metadata: opts.metadata,
      env: opts.env,
      cpus: opts.cpus,
      memory_mib: opts.memoryMib,
      disk_mib: opts.diskMib,
      pids_max: opts.pidsMax,
      network: opts.network,
      volumes: opts.volumes?.map((v) =>
        dropUndefined({ volume: v.volume, path: v.path, read_only: v.readOnly }),
      ),
      snapshot: opts.snapshot,
      idle_hibernate_seconds: opts.idleHibernateSeconds,
    });
    const doc = await client.requestJson<Json>("POST", "/v1/sandboxes", { json: body, timeoutMs: null });
    return new Sandbox(sandboxInfo(doc), client);
  }

  /**
   * Attach to an existing sandbox by id.
   * @throws {@link SandboxNotFound}
   */
  static async connect(sandboxId: string, opts: ConnectOptions = {}): Promise<Sandbox> {
    const client = clientFor(opts);
    const doc = await client.requestJson<Json>("GET", sandboxPath(sandboxId));
    return new Sandbox(sandboxInfo(doc), client);
  }

  /** List the sandboxes visible to this key, optionally filtered by metadata and state. */
  static async list(
    opts: ConnectOptions & { metadata?: Record<string, string>; state?: string } = {},
  ): Promise<Sandbox[]> {
    const client = clientFor(opts);
    const query: Array<[string, string]> = [];
    if (opts.state !== undefined) query.push(["state", opts.state]);
    for (const [k, v] of Object.entries(opts.metadata ?? {})) query.push([`metadata.${k}`, v]);
    const all = await client.listAll<Json>("/v1/sandboxes", "sandboxes", query);
    return all.map((s) => new Sandbox(sandboxInfo(s), client));
  }

  /** The sandbox id, `sbx_…`. */
  get id(): string {
    return this._info.id;
  }

  /** The sandbox as last seen (see {@link refresh}). */
  get info(): SandboxInfo {
    return this._info;
  }

  /** The state as last seen. */
  get state(): string {
    return this._info.state;
  }

  private set(doc: Json): SandboxInfo {
    this._info = sandboxInfo(doc);
    return this._info;
  }

  /** Fetch the current state (this also refreshes the TTL). */
  async refresh(): Promise<SandboxInfo> {
    return this.set(await this.client.requestJson<Json>("GET", sandboxPath(this.id)));
  }

  /**
   * Change the TTL, persistence, metadata (which replaces the whole map) or idle hibernation
   * delay (`0` turns it off; see {@link CreateOptions.idleHibernateSeconds}).
   */
  async update(changes: {
    ttlSeconds?: number;
    persistent?: boolean;
    metadata?: Record<string, string>;
    idleHibernateSeconds?: number;
  }): Promise<SandboxInfo> {
    const body = dropUndefined({
      ttl_seconds: changes.ttlSeconds,
      persistent: changes.persistent,
      metadata: changes.metadata,
      idle_hibernate_seconds: changes.idleHibernateSeconds,
    });
    return this.set(await this.client.requestJson<Json>("PATCH", sandboxPath(this.id), { json: body }));
  }

  /** Set the idle lifetime; the expiry moves to now + `ttlSeconds`. */
  setTtl(ttlSeconds: number): Promise<SandboxInfo> {
    return this.update({ ttlSeconds });
  }

  /** Make the sandbox persistent (never reaped, kept on disposal) or not. */
  setPersistent(persistent = true): Promise<SandboxInfo> {
    return this.update({ persistent });
  }

  /** Replace the sandbox's metadata. */
  setMetadata(metadata: Record<string, string>): Promise<SandboxInfo> {
    return this.update({ metadata });
  }

  /**
   * The sandbox's logs, oldest first: its agent's (`ns`) or its guest console (`vm`).
   * @throws {@link InvalidRequest} for a log it does not have, or `since` on a log without times.
   */
  async logs(opts: LogOptions = {}): Promise<LogLine[]> {
    const doc = await this.client.requestJson<{ lines?: Json[] }>("GET", sandboxPath(this.id, "/logs"), {
      query: logQuery(opts, false),
      accept: "application/json",
    });
    return (doc.lines ?? []).map((l) => logLine(l));
  }

  /**
   * Follow the sandbox's logs: the last `tail` lines so far (none by default), then each new
   * line as it is written, until the sandbox is gone.
   *
   * ```ts
   * await using logs = await sb.followLogs();
   * for await (const line of logs) console.log(line.text);
   * ```
   */
  async followLogs(opts: LogOptions & { idleTimeoutMs?: number; signal?: AbortSignal } = {}): Promise<LogStream> {
    const controller = new AbortController();
    const signal = opts.signal ? anySignal([opts.signal, controller.signal]) : controller.signal;
    const resp = await this.client.request("GET", sandboxPath(this.id, "/logs"), {
      query: logQuery({ tail: 0, ...opts }, true),
      accept: "text/event-stream",
      timeoutMs: null,
      signal,
    });
    if (!resp.body) throw new HutchError("the logs answer has no body");
    return new LogStream(resp.body, controller, opts.idleTimeoutMs, this.client.url);
  }

  /** Memory, CPU and process counts right now (undefined if the server cannot read them). */
  async usage(): Promise<Usage | undefined> {
    const doc = await this.client.requestJson<{ usage?: Json | null }>("GET", sandboxPath(this.id, "/usage"));
    return doc.usage ? usage(doc.usage) : undefined;
  }

  /**
   * Run a command to completion and collect its output. An array runs the program directly
   * without a shell, so arguments (even ones a model wrote) reach it verbatim; a string runs
   * under `/bin/sh -c`. A non-zero exit is not an error. With `{ background: true }` it is
   * started as a process handle instead and a {@link Process} comes back at once: it runs on,
   * keeps its output for later (`wait()`, `for await`), and takes stdin and signals.
   * @throws {@link InvalidRequest} for an empty `cmd`, a relative `cwd`, bad `env` or timeout;
   * with `background`, a program that cannot be found (`command_not_found`).
   * @throws {@link TagInUse} when a running handle already has `tag`.
   */
  exec(cmd: Command, opts: BackgroundExecOptions): Promise<Process>;
  exec(cmd: Command, opts?: ExecOptions): Promise<ExecResult>;
  async exec(cmd: Command, opts: ExecOptions | BackgroundExecOptions = {}): Promise<ExecResult | Process> {
    const background = "background" in opts && opts.background === true;
    const tag = background ? (opts as BackgroundExecOptions).tag : (opts as { tag?: string }).tag;
    if (tag !== undefined && !background) {
      throw new InvalidRequest("tag names a process handle: it needs background: true");
    }
    if (background) {
      // A process left running gets no time limit unless asked (the server's 60 s suits
      // commands awaited).
      const body = execBody(cmd, { timeoutSeconds: 0, ...opts });
      body.background = true;
      if (tag !== undefined) body.tag = tag;
      const doc = await this.client.requestJson<Json>("POST", sandboxPath(this.id, "/exec"), {
        json: body,
        timeoutMs: null,
        signal: opts.signal,
      });
      return new Process(this.client, this.id, processInfo(doc));
    }
    const doc = await this.client.requestJson<Json>("POST", sandboxPath(this.id, "/exec"), {
      json: execBody(cmd, opts),
      timeoutMs: execTimeoutMs(opts.timeoutSeconds),
      signal: opts.signal,
    });
    return execResult(doc);
  }

  /**
   * Run a cell in a stateful context of the code interpreter (`code-interpreter` template):
   * variables stay between calls; charts come back as `Result.png` bytes. Without `context`
   * it runs in the default context of `language` (default `python`). An exception in the code
   * is `execution.error`, not a throw. See docs/code-interpreter.md.
   * @throws {@link NoInterpreter} when the template cannot run code.
   */
  runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    return runCode(this.client, this.id, code, opts);
  }

  /** A new stateful context (its own kernel), default language `python`. */
  createCodeContext(opts: CodeContextOptions = {}): Promise<CodeContext> {
    return createCodeContext(this.client, this.id, opts);
  }

  /** The sandbox's code contexts. */
  listCodeContexts(): Promise<CodeContext[]> {
    return listCodeContexts(this.client, this.id);
  }

  /** Start a context's kernel afresh (its state is gone). */
  restartCodeContext(context: CodeContext | string): Promise<CodeContext> {
    return restartCodeContext(this.client, this.id, context);
  }

  /** Stop a context's kernel and forget it. */
  deleteCodeContext(context: CodeContext | string): Promise<void> {
    return deleteCodeContext(this.client, this.id, context);
  }

  /**
   * Run a command, calling back with its output as it is produced; resolves to the exit code.
   * Callbacks run in the order the output arrived, all before the promise resolves. Output is
   * decoded as UTF-8 incrementally. If a callback throws, the stream is dropped, which kills
   * the command.
   * @throws {@link SandboxFailed} when the sandbox died before the command finished.
   */
  async execStream(cmd: Command, opts: ExecStreamOptions = {}): Promise<number> {
    const controller = new AbortController();
    const signal = opts.signal ? anySignal([opts.signal, controller.signal]) : controller.signal;
    const resp = await this.client.request("POST", sandboxPath(this.id, "/exec/stream"), {
      json: execBody(cmd, opts),
      timeoutMs: null,
      signal,
    });
    if (!resp.body) throw new HutchError("the exec stream has no body");
    const decoders = { stdout: new TextDecoder(), stderr: new TextDecoder() };
    const callbacks = { stdout: opts.onStdout, stderr: opts.onStderr };
    try {
      for await (const ev of sseEvents(resp.body)) {
        let payload: Json = {};
        try {
          payload = ev.data ? (JSON.parse(ev.data) as Json) : {};
        } catch {
          // ignore malformed payloads
        }
        if (ev.event === "start") {
          if (opts.onStart) await opts.onStart(Number(payload.pid));
        } else if (ev.event === "stdout" || ev.event === "stderr") {
          const raw =
            typeof payload.data === "string"
              ? Buffer.from(payload.data, "utf8")
              : typeof payload.data_b64 === "string"
                ? Buffer.from(payload.data_b64, "base64")
                : undefined;
          if (!raw) continue;
          const text = decoders[ev.event].decode(raw, { stream: true });
          const cb = callbacks[ev.event];
          if (text && cb) await cb(text);
        } else if (ev.event === "exit") {
          for (const name of ["stdout", "stderr"] as const) {
            const tail = decoders[name].decode();
            const cb = callbacks[name];
            if (tail && cb) await cb(tail);
          }
          return typeof payload.exit_code === "number" ? payload.exit_code : -1;
        } else if (ev.event === "error") {
          throw errorFromEvent(payload);
        }
      }
    } catch (e) {
      if (e instanceof HutchError) throw e;
      const err = e as { name?: string };
      if (err?.name === "AbortError" || err?.name === "TypeError" || err?.name === "TimeoutError") {
        throw mapFetchError(e, this.client.url);
      }
      throw e;
    } finally {
      controller.abort();
    }
    throw new HutchError("the exec stream ended without an exit event");
  }

  /** Open an interactive terminal (a WebSocket). Close it (or use `await using`) when done. */
  async pty(opts: PtyOptions = {}): Promise<PtySession> {
    const u = new URL(this.client.url + sandboxPath(this.id, "/pty"));
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    u.searchParams.set("cols", String(opts.cols ?? 80));
    u.searchParams.set("rows", String(opts.rows ?? 24));
    if (opts.cmd !== undefined) u.searchParams.set("cmd", opts.cmd);
    if (opts.user !== undefined) u.searchParams.set("user", opts.user);
    if (opts.cwd !== undefined) u.searchParams.set("cwd", opts.cwd);
    try {
      return await PtySession.open(u.toString(), this.client.headers(), opts.openTimeoutMs);
    } catch (e) {
      if (e instanceof HutchError && e.status === 401) {
        e.message = `${e.message} (API key from ${this.client.config.keySource})`;
      }
      throw e;
    }
  }

  /**
   * The URL at which the server proxies HTTP and WebSocket to `port` inside the sandbox. The
   * service only has to listen inside the sandbox; the server reaches it through the
   * sandbox's agent, whatever the sandbox's network. Requests need the API key in the
   * `Authorization` header like every call (see {@link Sandbox.portFetch}); the key is never
   * accepted in a URL. For a browser, ask {@link Sandbox.browserUrl} for a signed link.
   * @throws {RangeError} for a port outside 1–65535.
   */
  portUrl(port: number, path = "/"): string {
    return this.client.url + portPath(this.id, port, path);
  }

  /**
   * A link a browser can open to the service on `port` (`path` below it): the server signs a
   * short-lived token for this sandbox and port only (`POST /v1/sandboxes/{id}/port-tokens`,
   * `ttlSeconds` 1–3600, default 300), which the first visit trades for an `HttpOnly`
   * cookie. The API key is never in it, and the service never sees the token. It points to
   * the server's preview origin (`http://{port}-{id}.localhost:7701/`) when it runs one.
   * @throws {RangeError} for a port outside 1–65535.
   */
  async browserUrl(port: number, path = "/", opts: { ttlSeconds?: number } = {}): Promise<string> {
    portPath(this.id, port, path);
    const json: Json = { port };
    if (opts.ttlSeconds !== undefined) json.ttl_seconds = opts.ttlSeconds;
    const doc = await this.client.requestJson<{ url: string }>(
      "POST",
      sandboxPath(this.id, "/port-tokens"),
      { json },
    );
    const [root, token] = doc.url.split("?hutch_token=");
    const rel = path.startsWith("/") ? path : "/" + path;
    const query = new URLSearchParams({ hutch_token: token ?? "" }).toString();
    return root.replace(/\/$/, "") + rel + (rel.includes("?") ? "&" : "?") + query;
  }

  /**
   * `fetch` the service on `port` inside the sandbox through the server's port proxy, with
   * this client's key. The service's own answer is returned whatever its status (it carries
   * `via: 1.1 hutch`); Hutch's own errors throw.
   * @throws {@link PortUnreachable} when nothing listens on the port; {@link SandboxNotFound}.
   */
  async portFetch(port: number, path = "/", init: RequestInit = {}): Promise<Response> {
    const headers = new Headers(init.headers);
    for (const [k, v] of Object.entries(this.client.headers())) {
      if (!headers.has(k)) headers.set(k, v);
    }
    let resp: Response;
    try {
      resp = await fetch(this.client.url + portPath(this.id, port, path), { ...init, headers });
    } catch (e) {
      throw mapFetchError(e, this.client.url);
    }
    if (resp.status >= 400 && !(resp.headers.get("via") ?? "").includes(PROXY_VIA)) {
      const err = errorFromResponse(resp.status, await resp.text().catch(() => ""));
      if (err instanceof AuthError) {
        err.message = `${err.message} (API key from ${this.client.config.keySource})`;
      }
      throw err;
    }
    return resp;
  }

  /** Destroy the sandbox and everything in it. Killing a sandbox twice is not an error. */
  async kill(): Promise<void> {
    try {
      await this.client.request("DELETE", sandboxPath(this.id));
    } catch (e) {
      if (!(e instanceof SandboxNotFound)) throw e;
    }
    this._info = { ...this._info, state: "stopped" };
  }

  private async lifecycle(action: string): Promise<SandboxInfo> {
    return this.set(
      await this.client.requestJson<Json>("POST", sandboxPath(this.id, `/${action}`), { timeoutMs: null }),
    );
  }

  /**
   * Freeze every process of a running sandbox; it keeps everything but uses no CPU.
   *
   * On `ns` this is the cgroup freezer: memory, processes, open connections and mounts are kept
   * as they are. Until {@link resume}, every call on the sandbox except resume, kill, get
   * ({@link refresh}) and list is refused with 409 ({@link ConflictError}), exec and file calls
   * included. A paused sandbox still expires by its TTL unless it is persistent.
   * @returns The sandbox, `state: "paused"`.
   * @throws {@link ConflictError} when the sandbox is not running.
   */
  pause(): Promise<SandboxInfo> {
    return this.lifecycle("pause");
  }

  /**
   * Let a paused sandbox run again, exactly where it was.
   * @returns The sandbox, `state: "running"`.
   * @throws {@link ConflictError} when the sandbox is not paused.
   */
  resume(): Promise<SandboxInfo> {
    return this.lifecycle("resume");
  }

  /**
   * Stop a running sandbox but keep it on disk: it holds no CPU and no memory.
   *
   * On `ns` **files survive and processes do not**: every process is killed, mounts and cgroups
   * are released, and what the sandbox wrote is kept, except `/tmp` and `/dev/shm`, which are
   * memory-backed and go with the processes. (Keeping processes across hibernation needs the
   * `vm` backend.)
   *
   * The next exec, file or PTY call wakes it transparently (on `ns`: a fresh agent over the kept
   * files); {@link wake} does it explicitly. {@link refresh} and {@link Sandbox.list} do not wake
   * it. It stays hibernated across server restarts and still expires by its TTL unless
   * persistent.
   * @returns The sandbox, `state: "hibernated"`.
   * @throws {@link ConflictError} when the sandbox is not running.
   */
  hibernate(): Promise<SandboxInfo> {
    return this.lifecycle("hibernate");
  }

  /**
   * Start a hibernated sandbox again from its state on disk.
   *
   * Not needed before exec, file or PTY calls, which wake the sandbox themselves; use it to pay
   * the wake-up cost up front. On `ns` the sandbox gets a fresh agent over its kept files (no
   * process from before the hibernation is running).
   * @returns The sandbox, `state: "running"`, with `wokeInMs` set to how long the wake took.
   * @throws {@link ConflictError} when the sandbox is not hibernated; {@link SandboxFailed} when
   *   it could not be started (it stays hibernated with its files).
   */
  wake(): Promise<SandboxInfo> {
    return this.lifecycle("wake");
  }

  /**
   * Take a snapshot that new sandboxes can start from (`Sandbox.create({ snapshot: snap.id })`,
   * or `{ snapshot: "warm" }` by a name no other of your snapshots has).
   *
   * On `ns` a snapshot is filesystem-level (`kind: "filesystem"`): the sandbox's files, not its
   * processes, memory, `/tmp` or `/dev/shm`. A running sandbox is frozen while its files are
   * read (so the snapshot is consistent) and then keeps running; a hibernated one is read from
   * disk without being woken. The snapshot does not depend on this sandbox, which can be killed
   * at any time; delete it with {@link Client.deleteSnapshot}.
   * @param name 1–64 characters of `[A-Za-z0-9._-]`; names need not be unique. Without one the
   *   snapshot is named by its id.
   * @throws {@link InvalidRequest} for a bad name; {@link ConflictError} when the sandbox is
   *   paused (or otherwise not running or hibernated).
   */
  async snapshot(name?: string): Promise<Snapshot> {
    const doc = await this.client.requestJson<Json>("POST", sandboxPath(this.id, "/snapshots"), {
      json: name === undefined ? {} : { name },
      timeoutMs: null,
    });
    return snapshot(doc);
  }

  /**
   * Create `count` (1–16, default 1) children of this sandbox, each a sandbox of its own.
   *
   * With `mode: "disk"` (the default, and the only mode on `ns`) the children start from a
   * snapshot of this sandbox's files taken once (a running sandbox is frozen meanwhile and then
   * keeps running), stacked copy-on-write under each child's own writes: files are carried,
   * processes are not (each child starts with a fresh agent). Children get their own id,
   * hostname and uid range and this sandbox's template, resources, environment, metadata, TTL,
   * persistence and idle setting; `info.forkedFrom` names this sandbox. Parent and children
   * never see each other's later writes.
   *
   * `mode: "live"` (memory and running processes too) needs the `vm` backend: on `ns` it is
   * refused with 422 ({@link InvalidRequest}).
   * @returns The children, `running`. Kill them (or dispose of them) when done.
   * @throws {@link InvalidRequest} for a `count` out of range or `mode: "live"` on `ns`;
   *   {@link ConflictError} when the sandbox is paused; {@link QuotaExceeded} when the children
   *   would together need more memory than the host has.
   */
  async fork(opts: { count?: number; mode?: "disk" | "live" } = {}): Promise<Sandbox[]> {
    const doc = await this.client.requestJson<{ sandboxes?: Json[] }>("POST", sandboxPath(this.id, "/fork"), {
      json: { count: opts.count ?? 1, mode: opts.mode ?? "disk" },
      timeoutMs: null,
    });
    return (doc.sandboxes ?? []).map((s) => new Sandbox(sandboxInfo(s), this.client));
  }

  /**
   * Try several commands side by side, each in its own fork, and keep the best fork.
   *
   * The server disk-forks this sandbox once per command (see {@link fork}: files are carried,
   * processes are not), runs every command in its own child in parallel, scores each outcome
   * (exit status 0 scores 1, else 0, unless `scoreRegex` is given), keeps the winner's child as
   * an independent sandbox (`forkedFrom` this one) and destroys the others. The best score wins,
   * ties going to the lowest index. This sandbox is unchanged.
   *
   * Node's `fetch` gives up on an answer that takes more than 300 s to start, so keep
   * `timeoutSeconds` well below that.
   * @param commands 1–16 commands; a string runs under `/bin/sh -c`, an array runs that program
   *   directly.
   * @returns The outcomes; `winner.sandboxId` is the surviving child: attach with
   *   `Sandbox.connect(result.winner.sandboxId, { client: sb.client })` and kill it when done.
   *   There is always a winner, even if every command failed.
   * @throws {@link InvalidRequest} for no or too many commands, a bad timeout or a regex without
   *   a capture group; {@link ConflictError} when the sandbox is paused.
   */
  async explore(commands: readonly Command[], opts: ExploreOptions = {}): Promise<ExploreResult> {
    if (typeof commands === "string") {
      throw new TypeError("commands must be an array of commands, not a single string");
    }
    const doc = await this.client.requestJson<Json>("POST", sandboxPath(this.id, "/explore"), {
      json: dropUndefined({
        commands: commands.map((c) => (typeof c === "string" ? c : c.map(String))),
        timeout_seconds: opts.timeoutSeconds,
        keep: opts.keep ?? "winner",
        score_regex: opts.scoreRegex,
      }),
      timeoutMs: opts.timeoutSeconds === undefined ? null : (opts.timeoutSeconds + 60) * 1000,
    });
    return exploreResult(doc);
  }

  /**
   * Change the egress policy at once, including for open connections.
   * Open connections the new policy forbids are cut; a sandbox created with `egress: "none"` cannot gain a network (409).
   */
  async updateNetwork(policy: NetworkPolicy): Promise<void> {
    const resp = await this.client.request("PUT", sandboxPath(this.id, "/network"), {
      json: dropUndefined({ egress: policy.egress, allow: policy.allow, deny: policy.deny }),
    });
    const text = await resp.text();
    if (text) {
      try {
        const doc = JSON.parse(text) as Json;
        if (typeof doc.id === "string") this.set(doc);
      } catch {
        // not a sandbox
      }
    }
  }

  /** Kill the sandbox unless it is persistent (what `await using` calls). */
  async [Symbol.asyncDispose](): Promise<void> {
    if (!this._info.persistent) await this.kill();
  }

  toString(): string {
    return `Sandbox(${this.id}, ${this._info.template}, ${this.state})`;
  }
}

/** File operations inside a sandbox (`sandbox.files`). Every path is absolute. */
export class Files {
  /** @internal */
  constructor(private readonly sb: Sandbox) {}

  private path(suffix = ""): string {
    return sandboxPath(this.sb.id, `/files${suffix}`);
  }

  /**
   * Read a whole file as bytes.
   * @throws {@link FileNotFound}; {@link InvalidRequest} for a directory or a relative path.
   */
  async readBytes(path: string): Promise<Uint8Array> {
    const resp = await this.sb.client.request("GET", this.path(), { query: { path }, kind: "files", timeoutMs: null });
    return new Uint8Array(await resp.arrayBuffer());
  }

  /** Read a whole file as UTF-8 text. */
  async read(path: string): Promise<string> {
    return new TextDecoder().decode(await this.readBytes(path));
  }

  /**
   * Create or replace a file; parent directories are created.
   * @param opts.mode Permission bits, e.g. `0o755` or `"0755"`.
   */
  async write(
    path: string,
    data: string | Uint8Array,
    opts: {
      mode?: number | string;
      /** Pairs kept with the file as its `user.<key>` extended attributes (keys lowercased). */
      metadata?: Record<string, string>;
    } = {},
  ): Promise<void> {
    const mode =
      typeof opts.mode === "number" ? opts.mode.toString(8).padStart(4, "0") : opts.mode;
    const headers = Object.fromEntries(
      Object.entries(opts.metadata ?? {}).map(([k, v]) => [`x-hutch-meta-${k}`, v]),
    );
    await this.sb.client.request("PUT", this.path(), {
      query: { path, mode },
      headers,
      body: typeof data === "string" ? new TextEncoder().encode(data) : data,
      kind: "files",
      timeoutMs: null,
    });
  }

  /** List a directory, depth-first and sorted by path (`depth` 1–32, default 1). */
  async list(path = "/", opts: { depth?: number } = {}): Promise<FileEntry[]> {
    const doc = await this.sb.client.requestJson<{ entries?: Json[] }>("GET", this.path("/list"), {
      query: { path, depth: opts.depth },
      kind: "files",
    });
    return (doc.entries ?? []).map((e) => fileEntry(e));
  }

  /** Describe one path (symlinks are not followed). @throws {@link FileNotFound} */
  async stat(path: string): Promise<FileEntry> {
    return fileEntry(await this.sb.client.requestJson<Json>("GET", this.path("/stat"), { query: { path }, kind: "files" }));
  }

  /** Whether `path` exists. */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (e) {
      if (e instanceof FileNotFound) return false;
      throw e;
    }
  }

  /** Create a directory and its parents (like `mkdir -p`). */
  async mkdir(path: string): Promise<void> {
    await this.sb.client.request("POST", this.path("/mkdir"), { json: { path }, kind: "files" });
  }

  /** Move or rename `from` to `to` (the destination's parents are created). */
  async move(from: string, to: string): Promise<void> {
    await this.sb.client.request("POST", this.path("/move"), { json: { from, to }, kind: "files" });
  }

  /**
   * Remove a file, or a directory (non-empty ones need `recursive: true`).
   * @throws {@link FileNotFound}; {@link ConflictError} for a non-empty directory without `recursive`.
   */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.sb.client.request("DELETE", this.path(), {
      query: { path, recursive: opts.recursive ? true : undefined },
      kind: "files",
      timeoutMs: null,
    });
  }

  /**
   * Watch the directory `path`: armed when the promise resolves, so every change made after
   * it is reported (`create`, `write`, `remove`, `rename`, `chmod`).
   *
   * ```ts
   * await using watch = await sb.files.watch("/work", { recursive: true });
   * for await (const event of watch) console.log(event.event, event.name);
   * ```
   * @throws {@link FileNotFound}; {@link InvalidRequest} for a file or a relative path.
   */
  async watch(path: string, opts: WatchOptions = {}): Promise<FileWatch> {
    const controller = new AbortController();
    const signal = opts.signal ? anySignal([opts.signal, controller.signal]) : controller.signal;
    const resp = await this.sb.client.request("GET", this.path("/watch"), {
      query: {
        path,
        recursive: opts.recursive ? true : undefined,
        include_entry: opts.includeEntry ? true : undefined,
      },
      accept: "text/event-stream",
      kind: "files",
      timeoutMs: null,
      signal,
    });
    if (!resp.body) throw new HutchError("the watch answer has no body");
    return FileWatch.open(resp.body, controller, this.sb.client.url, opts.onEvent);
  }

  /**
   * A URL that reads the file `path` with a plain `GET`, without the API key, for
   * `expiresIn` seconds (default 300, at most 7 days); as `user` of the sandbox if given.
   * Anyone holding it can read the file until then.
   */
  downloadUrl(path: string, opts: { expiresIn?: number; user?: string } = {}): Promise<string> {
    return this.fileUrl(path, "read", opts);
  }

  /**
   * A URL that writes the file `path` with a `PUT` of its bytes, without the API key, for
   * `expiresIn` seconds (default 300, at most 7 days); as `user` of the sandbox if given.
   */
  uploadUrl(path: string, opts: { expiresIn?: number; user?: string } = {}): Promise<string> {
    return this.fileUrl(path, "write", opts);
  }

  private async fileUrl(
    path: string,
    op: "read" | "write",
    opts: { expiresIn?: number; user?: string },
  ): Promise<string> {
    const seconds = opts.expiresIn ?? 300;
    if (!Number.isInteger(seconds) || seconds < 1 || seconds > MAX_FILE_URL_SECONDS) {
      throw new RangeError(
        `expiresIn must be a whole number of seconds from 1 to ${MAX_FILE_URL_SECONDS} (7 days), got ${seconds}`,
      );
    }
    const doc = await this.sb.client.requestJson<{ url?: string }>("POST", this.path("/url"), {
      json: { path, op, expires_in_seconds: seconds, user: opts.user },
      kind: "files",
    });
    return String(doc.url ?? "");
  }
}

/** Longest life of a signed file URL, in seconds (the server's limit: 7 days). */
export const MAX_FILE_URL_SECONDS = 7 * 24 * 3600;
