import "./polyfill.js";
import { resolveConfig, type ResolvedConfig } from "./config.js";
import {
  AuthError,
  ConnectionError,
  HutchError,
  TimeoutError,
  errorFromResponse,
} from "./errors.js";
import {
  lifecycleEvent,
  logLine,
  snapshot,
  volume,
  type LifecycleEvent,
  type LogLine,
  type Snapshot,
  type Volume,
} from "./models.js";
import { sseEvents } from "./sse.js";
import { templatesOf, type Templates } from "./templates.js";
import {
  tenancy,
  type ApiKey,
  type AuditEntry,
  type AuditFilter,
  type CreateKeyOptions,
  type KeyBudget,
  type Tenant,
  type TenantSettings,
  type UsageFilter,
  type UsageReport,
} from "./tenants.js";
import { VERSION } from "./version.js";

/** How to reach the server. Every field is optional. */
export interface ClientOptions {
  /** Server base URL. Default `$HUTCH_URL`, else `http://127.0.0.1:7700`. */
  url?: string;
  /** Bearer key. Default `$HUTCH_API_KEY`, else `<state dir>/admin.key`. */
  apiKey?: string;
  /** Where to look for `admin.key` (default: as `hutch serve` picks it). */
  stateDir?: string;
  /** Default per-request timeout in milliseconds (default 30000). */
  timeoutMs?: number;
  /** The tenant an admin key acts for (sent as `X-Hutch-Tenant`). Default `$HUTCH_TENANT`. */
  tenant?: string;
}

/** Records asked for per page when a listing follows the server's cursors. */
export const PAGE_LIMIT = 500;

/** Query parameters: pairs, or a record whose undefined values are skipped. */
export type Query = Array<[string, string]> | Record<string, string | number | boolean | undefined>;

/** Options of {@link Client.request}. */
export interface RequestOptions {
  query?: Query;
  /** JSON body. */
  json?: unknown;
  /** Raw body (a stream for an upload made as it is sent). */
  body?: Uint8Array | string | ReadableStream<Uint8Array>;
  /** The `Content-Type` of a raw body. */
  contentType?: string;
  /** Overall timeout in milliseconds; `null` waits forever; default the client's. */
  timeoutMs?: number | null;
  /** Error-mapping hint: `"files"` when a 404 may mean a missing file. */
  kind?: string;
  /** Abort the request. */
  signal?: AbortSignal;
  /** The `Accept` header, for routes that answer in several formats. */
  accept?: string;
  /** Further headers (a file's `X-Hutch-Meta-*` metadata). */
  headers?: Record<string, string>;
}

/** Map a `fetch` failure to the SDK's errors. */
export function mapFetchError(e: unknown, url: string): unknown {
  if (e instanceof HutchError) return e;
  const err = e as { name?: string; message?: string; cause?: { message?: string } };
  if (err?.name === "TimeoutError") {
    return new TimeoutError(`request to ${url} timed out`, { cause: e });
  }
  if (err?.name === "AbortError") return e;
  const why = err?.cause?.message ?? err?.message ?? String(e);
  return new ConnectionError(`cannot reach the Hutch server at ${url}: ${why}`, { cause: e });
}

/** A signal aborted when any of `signals` is (`AbortSignal.any` arrived in Node 20.3). */
export function anySignal(signals: AbortSignal[]): AbortSignal {
  if (typeof AbortSignal.any === "function") return AbortSignal.any(signals);
  const controller = new AbortController();
  for (const s of signals) {
    if (s.aborted) {
      controller.abort(s.reason);
      break;
    }
    s.addEventListener("abort", () => controller.abort(s.reason), { once: true });
  }
  return controller.signal;
}

function signalFor(timeoutMs: number | null, user?: AbortSignal): AbortSignal | undefined {
  const signals: AbortSignal[] = [];
  if (timeoutMs !== null) signals.push(AbortSignal.timeout(timeoutMs));
  if (user) signals.push(user);
  if (signals.length <= 1) return signals[0];
  return anySignal(signals);
}

/**
 * A connection to a Hutch server. Most code never builds one: `Sandbox.create()` and friends
 * make their own from the environment. Build one to pass around, or for server-wide calls
 * such as {@link Client.templates} and {@link Client.events}.
 */
export class Client {
  /** Resolved URL and key. */
  readonly config: ResolvedConfig;
  /** Default per-request timeout, milliseconds. */
  readonly timeoutMs: number;
  /** The tenant an admin key acts for, if any. */
  readonly tenant: string | undefined;

  constructor(opts: ClientOptions = {}) {
    this.config = resolveConfig(opts);
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.tenant = opts.tenant ?? (process.env.HUTCH_TENANT || undefined);
  }

  /** The server's base URL. */
  get url(): string {
    return this.config.url;
  }

  /** Headers sent with every request (including the `Authorization` header). */
  headers(): Record<string, string> {
    const h: Record<string, string> = { "user-agent": `hutch-sdk-typescript/${VERSION}` };
    if (this.config.apiKey) h.authorization = `Bearer ${this.config.apiKey}`;
    if (this.tenant) h["x-hutch-tenant"] = this.tenant;
    return h;
  }

  private fail(err: HutchError): HutchError {
    if (err instanceof AuthError) {
      err.message = `${err.message} (API key from ${this.config.keySource})`;
    }
    return err;
  }

  /** Send a request; throws the mapped {@link HutchError} on a non-2xx answer. */
  async request(method: string, path: string, opts: RequestOptions = {}): Promise<Response> {
    const url = new URL(this.url + path);
    if (opts.query) {
      const pairs = Array.isArray(opts.query) ? opts.query : Object.entries(opts.query);
      for (const [k, v] of pairs) if (v !== undefined) url.searchParams.append(k, String(v));
    }
    const headers = { ...this.headers(), ...(opts.headers ?? {}) };
    if (opts.accept) headers.accept = opts.accept;
    let body: string | Uint8Array | ReadableStream<Uint8Array> | undefined = opts.body;
    if (opts.contentType) headers["content-type"] = opts.contentType;
    if (opts.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(opts.json);
    }
    const timeoutMs = opts.timeoutMs === undefined ? this.timeoutMs : opts.timeoutMs;
    let resp: Response;
    try {
      resp = await fetch(url, {
        method,
        headers,
        body,
        signal: signalFor(timeoutMs, opts.signal),
        // A streamed body is sent as it is read (Node's fetch asks to be told).
        ...(body instanceof ReadableStream ? { duplex: "half" } : {}),
      } as RequestInit);
    } catch (e) {
      throw mapFetchError(e, this.url);
    }
    if (!resp.ok) {
      let text = "";
      try {
        text = await resp.text();
      } catch {
        // keep the status alone
      }
      throw this.fail(errorFromResponse(resp.status, text, opts.kind));
    }
    return resp;
  }

  /** Send a request and decode its JSON answer. */
  async requestJson<T = Record<string, unknown>>(
    method: string,
    path: string,
    opts: RequestOptions = {},
  ): Promise<T> {
    const resp = await this.request(method, path, opts);
    try {
      return (await resp.json()) as T;
    } catch (e) {
      throw mapFetchError(e, this.url);
    }
  }

  /**
   * Every record of a paginated listing (`GET /v1/sandboxes`, `/v1/snapshots`, `/v1/volumes`):
   * pages of {@link PAGE_LIMIT}, each `next_cursor` passed back as it came, until the server
   * gives none.
   */
  async listAll<T = Record<string, unknown>>(
    path: string,
    key: string,
    query: Array<[string, string]> = [],
  ): Promise<T[]> {
    const out: T[] = [];
    let cursor: string | undefined;
    for (;;) {
      const q: Array<[string, string]> = [...query, ["limit", String(PAGE_LIMIT)]];
      if (cursor !== undefined) q.push(["cursor", cursor]);
      const doc = await this.requestJson<Record<string, unknown>>("GET", path, { query: q });
      const items = doc[key];
      if (Array.isArray(items)) out.push(...(items as T[]));
      const next = doc.next_cursor;
      if (typeof next !== "string" || next === "") return out;
      cursor = next;
    }
  }

  /** `GET /healthz`: `{status: "ok", version}`. Needs no key. */
  async health(): Promise<{ status: string; version: string }> {
    return this.requestJson("GET", "/healthz");
  }

  private templatesApi: Templates | undefined;

  /**
   * The server's templates: `await client.templates()` lists them;
   * `client.templates.build(name, contextDir)` builds one from a Dockerfile,
   * `.buildFromImage(name, ref)` and `.uploadImage(name, path)` from an image, `.get(name)`,
   * `.update(name, {start})` and `.delete(name)` read, change and delete one.
   */
  get templates(): Templates {
    this.templatesApi ??= templatesOf(this);
    return this.templatesApi;
  }

  /**
   * Subscribe to lifecycle events (`sandbox.created`, `sandbox.killed`, …). The subscription is
   * live once the promise resolves:
   *
   * ```ts
   * await using events = await client.events();
   * for await (const ev of events) console.log(ev.type, ev.sandboxId);
   * ```
   *
   * @param opts.idleTimeoutMs Longest wait for the next event; exceeding it throws {@link TimeoutError}.
   */
  async events(opts: { idleTimeoutMs?: number; signal?: AbortSignal } = {}): Promise<EventStream> {
    const controller = new AbortController();
    const signal = opts.signal ? anySignal([opts.signal, controller.signal]) : controller.signal;
    const resp = await this.request("GET", "/v1/events", { timeoutMs: null, signal });
    if (!resp.body) throw new HutchError("the events answer has no body");
    return new EventStream(resp.body, controller, opts.idleTimeoutMs, this.url);
  }

  /**
   * The named snapshots this key's tenant may see, oldest first. Take one with
   * `Sandbox.snapshot(name)`. The hidden snapshots behind forks are not listed.
   */
  async snapshots(): Promise<Snapshot[]> {
    const all = await this.listAll<Record<string, unknown>>("/v1/snapshots", "snapshots");
    return all.map((s) => snapshot(s));
  }

  /**
   * One snapshot, with the sandboxes that currently use it (`usedBy`).
   * @throws {@link NotFoundError} when there is no such snapshot (or it is another tenant's).
   */
  async getSnapshot(snapshotId: string): Promise<Snapshot> {
    return snapshot(
      await this.requestJson<Record<string, unknown>>("GET", `/v1/snapshots/${encodeURIComponent(snapshotId)}`),
    );
  }

  /**
   * Delete a snapshot and its files. Sandboxes created from a snapshot use its files in place
   * (they are not copied), so the server refuses while any of them still exists, running,
   * paused or hibernated: kill them first (`usedBy` from {@link getSnapshot} lists them). The
   * sandbox the snapshot was taken of does not count.
   * @throws {@link ConflictError} (409) while sandboxes created from it exist;
   *   {@link NotFoundError} when there is no such snapshot.
   */
  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.request("DELETE", `/v1/snapshots/${encodeURIComponent(snapshotId)}`, { timeoutMs: null });
  }

  /**
   * Create a durable volume: a fixed-size filesystem that outlives sandboxes. Mount it with
   * `Sandbox.create({ volumes: [{ volume: vol.id, path: "/data" }] })` (the name works as well
   * as the id). Writes beyond `sizeMib` fail inside the sandbox with `ENOSPC`.
   * @param name 1–64 characters of `A-Z a-z 0-9 _ . -`, not starting with `.` or `vol_`;
   *   unique per tenant.
   * @param sizeMib Size limit in MiB, 4–1048576 (default 1024).
   * @throws {@link InvalidRequest} for a bad name or size; {@link ConflictError} (409) when a
   *   volume with this name exists.
   */
  async createVolume(name: string, sizeMib = 1024): Promise<Volume> {
    return volume(
      await this.requestJson<Record<string, unknown>>("POST", "/v1/volumes", {
        json: { name, size_mib: sizeMib },
        timeoutMs: null,
      }),
    );
  }

  /** The volumes this key's tenant may see. */
  async volumes(): Promise<Volume[]> {
    const all = await this.listAll<Record<string, unknown>>("/v1/volumes", "volumes");
    return all.map((v) => volume(v));
  }

  /**
   * One volume, by id (`vol_…`) or name, with where it is attached (`attached`) and, while it is
   * mounted, `usedBytes`.
   * @throws {@link NotFoundError} when there is no such volume (or it is another tenant's).
   */
  async getVolume(idOrName: string): Promise<Volume> {
    return volume(
      await this.requestJson<Record<string, unknown>>("GET", `/v1/volumes/${encodeURIComponent(idOrName)}`),
    );
  }

  /**
   * Delete a volume, by id or name, and its data. The server refuses while the volume is
   * attached to a sandbox, running, paused or hibernated: kill those first (`attached` from
   * {@link getVolume} lists them).
   * @throws {@link ConflictError} (409) while it is attached; {@link NotFoundError} when there
   *   is no such volume.
   */
  async deleteVolume(idOrName: string): Promise<void> {
    await this.request("DELETE", `/v1/volumes/${encodeURIComponent(idOrName)}`, { timeoutMs: null });
  }

  /** Make a tenant (admin key). @throws {@link ConflictError} when it exists. */
  async createTenant(name: string, settings: TenantSettings = {}): Promise<Tenant> {
    return tenancy.createTenant(this, name, settings);
  }

  /** Every tenant (admin key). */
  async tenants(): Promise<Tenant[]> {
    return tenancy.tenants(this);
  }

  /** One tenant, with what its sandboxes use now (`usage`; admin key). */
  async getTenant(name: string): Promise<Tenant> {
    return tenancy.getTenant(this, name);
  }

  /** Change a tenant (admin key): each part given replaces that part whole. */
  async updateTenant(name: string, settings: TenantSettings): Promise<Tenant> {
    return tenancy.updateTenant(this, name, settings);
  }

  /** Delete a tenant and its keys (admin key). @throws {@link ConflictError} while it owns things. */
  async deleteTenant(name: string): Promise<void> {
    return tenancy.deleteTenant(this, name);
  }

  /**
   * Make a key no wider than this client's own; `secret` holds it, shown only now.
   * @throws {@link Forbidden} when it would be wider.
   */
  async createKey(opts: CreateKeyOptions = {}): Promise<ApiKey> {
    return tenancy.createKey(this, opts);
  }

  /** The keys this client's key may see (never their secrets). */
  async keys(): Promise<ApiKey[]> {
    return tenancy.keys(this);
  }

  /** One key by id (`key_…`). */
  async getKey(id: string): Promise<ApiKey> {
    return tenancy.getKey(this, id);
  }

  /** Revoke a key: it stops working at once, and what it holds open is closed. */
  async revokeKey(id: string): Promise<void> {
    return tenancy.revokeKey(this, id);
  }

  /**
   * Replace a key's spending caps (absent or `null`: no cap). No key changes its own.
   * @throws {@link Forbidden} for its own key, or a cap larger than this key's own.
   */
  async setKeyBudget(id: string, budget: KeyBudget): Promise<ApiKey> {
    return tenancy.setKeyBudget(this, id, budget);
  }

  /**
   * Metered usage (CPU-seconds, working-set GiB-seconds, disk GiB-hours, egress bytes) and its
   * cost through the server's rate card, summed and grouped by sandbox, tenant, key or day.
   */
  async usage(filter: UsageFilter = {}): Promise<UsageReport> {
    return tenancy.usage(this, filter);
  }

  /**
   * The audit log (full or admin key), oldest first. Entries are written in batches: a call
   * shows within about 5 s.
   */
  async audit(filter: AuditFilter = {}): Promise<AuditEntry[]> {
    return tenancy.audit(this, filter);
  }
}

/**
 * An open server-sent-event answer, each event turned into an item by `parse` (`undefined`
 * skips it): iterate it with `for await`.
 */
export class SseStream<T> implements AsyncIterable<T>, AsyncDisposable {
  private readonly iter: AsyncGenerator<T>;

  /** @internal */
  constructor(
    body: ReadableStream<Uint8Array>,
    private readonly controller: AbortController,
    idleTimeoutMs: number | undefined,
    url: string,
    parse: (event: string, doc: Record<string, unknown>) => T | undefined,
  ) {
    this.iter = (async function* () {
      try {
        for await (const ev of sseEvents(body, idleTimeoutMs)) {
          let doc: Record<string, unknown>;
          try {
            doc = JSON.parse(ev.data) as Record<string, unknown>;
          } catch {
            continue;
          }
          const item = parse(ev.event, doc);
          if (item !== undefined) yield item;
        }
      } catch (e) {
        throw mapFetchError(e, url);
      }
    })();
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return this.iter;
  }

  /** End the subscription. */
  async close(): Promise<void> {
    this.controller.abort();
    await this.iter.return(undefined).catch(() => undefined);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** An open `GET /v1/events` subscription: iterate it with `for await`. */
export class EventStream extends SseStream<LifecycleEvent> {
  /** @internal */
  constructor(
    body: ReadableStream<Uint8Array>,
    controller: AbortController,
    idleTimeoutMs: number | undefined,
    url: string,
  ) {
    super(body, controller, idleTimeoutMs, url, (event, doc) => lifecycleEvent(doc, event));
  }
}

/** A sandbox's followed logs (`Sandbox.followLogs`): iterate it with `for await`; it ends when the sandbox is gone. */
export class LogStream extends SseStream<LogLine> {
  /** @internal */
  constructor(
    body: ReadableStream<Uint8Array>,
    controller: AbortController,
    idleTimeoutMs: number | undefined,
    url: string,
  ) {
    super(body, controller, idleTimeoutMs, url, (event, doc) => (event === "log" ? logLine(doc) : undefined));
  }
}
