/**
 * Tenants, API keys, metered usage (docs/usage.md) and the audit log (docs/teams.md): the records the
 * server shows, and the calls behind
 * {@link Client.createTenant}, {@link Client.createKey} and their siblings.
 *
 * ```ts
 * const admin = new Client();                       // the admin key
 * await admin.createTenant("ml", { quotas: { max_sandboxes: 10 } });
 * const key = await admin.createKey({ tenant: "ml", scope: "exec", format: "e2b" });
 * console.log(key.secret);                          // shown only now
 * await admin.revokeKey(key.id);                    // stops working at once
 * ```
 */
import type { Client } from "./client.js";

/** What a key may do, widest first. */
export type KeyScope = "admin" | "full" | "exec" | "read-only";

/** A tenant's quotas; `null` (or absent) is no limit. */
export interface Quotas {
  max_sandboxes?: number | null;
  max_creates_per_hour?: number | null;
  max_cpus?: number | null;
  max_memory_mib?: number | null;
  max_ttl_seconds?: number | null;
  max_sandbox_cpus?: number | null;
  max_sandbox_memory_mib?: number | null;
  max_sandbox_disk_mib?: number | null;
  /** What its sandboxes may spend per UTC day: cost micros through the rate card, CPU-seconds without one. */
  daily_budget?: number | null;
  /** The same per UTC month. */
  monthly_budget?: number | null;
}

/** What a tenant's sandboxes get when their create leaves a setting out. */
export interface SandboxDefaults {
  network?: { egress?: string; allow?: string[]; deny?: string[] } | null;
  ttl_seconds?: number | null;
  isolation?: "auto" | "ns" | "vm" | null;
  cpus?: number | null;
  memory_mib?: number | null;
  disk_mib?: number | null;
}

/** The settings of a tenant; each part given replaces that part whole. */
export interface TenantSettings {
  quotas?: Quotas;
  defaults?: SandboxDefaults;
  /** The only templates its sandboxes may use; `null`: any it sees. */
  allowedTemplates?: string[] | null;
}

/** A tenant as the server shows it. */
export interface Tenant {
  name: string;
  quotas: Quotas;
  defaults: SandboxDefaults;
  allowedTemplates: string[] | null;
  createdAt: string;
  /** What its sandboxes use now ({@link Client.getTenant} only). */
  usage?: { sandboxes: number; cpus: number; memoryMib: number; createsLastHour: number };
  raw: Record<string, unknown>;
}

/** An API key as the server shows it; `secret` only from {@link Client.createKey}. */
export interface ApiKey {
  /** `key_…`: what it is listed and revoked by. */
  id: string;
  tenant: string;
  scope: KeyScope;
  name: string | null;
  /** Metadata every sandbox it reaches holds (empty: every sandbox of its tenant). */
  selector: Record<string, string>;
  prefix: string;
  createdAt: string;
  expiresAt: string | null;
  lastUsedAt: string | null;
  /** What the sandboxes it creates may spend per UTC day; `null`: no cap of its own. */
  dailyBudget: number | null;
  /** The same per UTC month. */
  monthlyBudget: number | null;
  /** The key itself (`hk_…` or `e2b_…`), shown only when it is made. */
  secret?: string;
  raw: Record<string, unknown>;
}

/** One audited call ({@link Client.audit}); never output or file contents. */
export interface AuditEntry {
  id: number;
  at: string;
  keyId: string | null;
  tenant: string | null;
  method: string;
  route: string;
  path: string;
  sandboxId: string | null;
  /** The command of an exec or terminal (a shell string is `["sh", "-c", …]`). */
  argv: string[] | null;
  status: number;
  raw: Record<string, unknown>;
}

/** Filters of {@link Client.audit}; times are RFC 3339 or milliseconds since the epoch. */
export interface AuditFilter {
  tenant?: string;
  keyId?: string;
  sandboxId?: string;
  since?: string;
  until?: string;
}

/** An audit entry from its JSON. */
export function auditEntry(d: Record<string, unknown>): AuditEntry {
  return {
    id: Number(d.id ?? 0),
    at: str(d.at),
    keyId: optStr(d.key_id),
    tenant: optStr(d.tenant),
    method: str(d.method),
    route: str(d.route),
    path: str(d.path),
    sandboxId: optStr(d.sandbox_id),
    argv: Array.isArray(d.argv) ? d.argv.map(String) : null,
    status: Number(d.status ?? 0),
    raw: d,
  };
}

/** Options of {@link Client.createKey}. */
export interface CreateKeyOptions {
  /** The tenant it acts for (default: the caller's). */
  tenant?: string;
  /** Default `full`. */
  scope?: KeyScope;
  name?: string;
  selector?: Record<string, string>;
  expiresInSeconds?: number;
  /** `e2b`: an `e2b_…` secret, the form older E2B SDKs check. Default `hutch` (`hk_…`). */
  format?: "hutch" | "e2b";
  /** Spending caps of the sandboxes it creates (no higher than the maker's own). */
  dailyBudget?: number;
  monthlyBudget?: number;
}

/** A key's spending caps ({@link Client.setKeyBudget}); absent or `null`: no cap. */
export interface KeyBudget {
  dailyBudget?: number | null;
  monthlyBudget?: number | null;
}

/** How {@link Client.usage} groups its sums. */
export type UsageGroupBy = "sandbox" | "tenant" | "key" | "day";

/** Filters of {@link Client.usage}: intervals ending after `from` and at or before `to` (RFC 3339 or ms). */
export interface UsageFilter {
  from?: string;
  to?: string;
  groupBy?: UsageGroupBy;
  /** Only this tenant's (admin keys). */
  tenant?: string;
  /** Only the sandboxes this key created. */
  keyId?: string;
  sandboxId?: string;
}

/** Metered usage summed: the answer's total, or one group's (`key` names the group). */
export interface UsageTotals {
  cpuSeconds: number;
  /** Working-set memory (cgroup memory minus reclaimable file cache) over time. */
  memoryGibSeconds: number;
  diskGibHours: number;
  egressBytes: number;
  /** Through the server's rate card; `null` without one. */
  costMicros: number | null;
  intervals: number;
  /** The sandbox id, tenant, key id or day (UTC) of a group. */
  key?: string | null;
  /** `groupBy: "sandbox"`: `sandbox`, `snapshot` or `volume`. */
  kind?: string;
  raw: Record<string, unknown>;
}

/** The answer of {@link Client.usage}. */
export interface UsageReport {
  total: UsageTotals;
  groups: UsageTotals[];
  groupBy: UsageGroupBy | null;
  rateCard: Record<string, number> | null;
  raw: Record<string, unknown>;
}

const GROUP_FIELDS: Record<UsageGroupBy, string> = {
  sandbox: "sandbox_id",
  tenant: "tenant",
  key: "key_id",
  day: "day",
};

/** Usage sums from their JSON (`keyField`: the field naming a group). */
export function usageTotals(d: Record<string, unknown>, keyField?: string): UsageTotals {
  const num = (v: unknown) => (typeof v === "number" ? v : 0);
  return {
    cpuSeconds: num(d.cpu_seconds),
    memoryGibSeconds: num(d.memory_gib_seconds),
    diskGibHours: num(d.disk_gib_hours),
    egressBytes: num(d.egress_bytes),
    costMicros: typeof d.cost_micros === "number" ? d.cost_micros : null,
    intervals: num(d.intervals),
    ...(keyField !== undefined ? { key: optStr(d[keyField]) } : {}),
    ...(typeof d.kind === "string" ? { kind: d.kind } : {}),
    raw: d,
  };
}

/** A usage answer from its JSON. */
export function usageReport(d: Record<string, unknown>): UsageReport {
  const groupBy = (typeof d.group_by === "string" ? d.group_by : null) as UsageGroupBy | null;
  const keyField = groupBy ? GROUP_FIELDS[groupBy] : undefined;
  const groups = Array.isArray(d.groups) ? (d.groups as Record<string, unknown>[]) : [];
  return {
    total: usageTotals((d.total as Record<string, unknown>) ?? {}),
    groups: groups.map((g) => usageTotals(g, keyField)),
    groupBy,
    rateCard: (d.rate_card as Record<string, number> | null) ?? null,
    raw: d,
  };
}

const SCOPES: readonly KeyScope[] = ["admin", "full", "exec", "read-only"];

function str(v: unknown): string {
  return typeof v === "string" ? v : "";
}

function optStr(v: unknown): string | null {
  return typeof v === "string" ? v : null;
}

/** A tenant from its JSON. */
export function tenant(d: Record<string, unknown>): Tenant {
  const u = d.usage as Record<string, number> | undefined;
  return {
    name: str(d.name),
    quotas: (d.quotas as Quotas) ?? {},
    defaults: (d.defaults as SandboxDefaults) ?? {},
    allowedTemplates: Array.isArray(d.allowed_templates) ? d.allowed_templates.map(String) : null,
    createdAt: str(d.created_at),
    usage:
      u && typeof u === "object"
        ? {
            sandboxes: Number(u.sandboxes ?? 0),
            cpus: Number(u.cpus ?? 0),
            memoryMib: Number(u.memory_mib ?? 0),
            createsLastHour: Number(u.creates_last_hour ?? 0),
          }
        : undefined,
    raw: d,
  };
}

/** A key from its JSON (the secret kept out of `raw`). */
export function apiKey(d: Record<string, unknown>): ApiKey {
  const { secret, ...raw } = d;
  const selector: Record<string, string> = {};
  for (const [k, v] of Object.entries((d.selector as Record<string, unknown>) ?? {})) selector[k] = String(v);
  return {
    id: str(d.id),
    tenant: str(d.tenant),
    scope: str(d.scope) as KeyScope,
    name: optStr(d.name),
    selector,
    prefix: str(d.prefix),
    createdAt: str(d.created_at),
    expiresAt: optStr(d.expires_at),
    lastUsedAt: optStr(d.last_used_at),
    dailyBudget: typeof d.daily_budget === "number" ? d.daily_budget : null,
    monthlyBudget: typeof d.monthly_budget === "number" ? d.monthly_budget : null,
    ...(typeof secret === "string" ? { secret } : {}),
    raw,
  };
}

/** The JSON of tenant settings. */
export function settingsBody(s: TenantSettings): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  if (s.quotas !== undefined) body.quotas = s.quotas;
  if (s.defaults !== undefined) body.defaults = s.defaults;
  if (s.allowedTemplates !== undefined) body.allowed_templates = s.allowedTemplates;
  return body;
}

/** The JSON of a key request; throws on a scope or format the server does not know. */
export function keyBody(o: CreateKeyOptions): Record<string, unknown> {
  const scope = o.scope ?? "full";
  if (!SCOPES.includes(scope)) throw new TypeError(`scope must be one of ${SCOPES.join(", ")}, got ${scope}`);
  const format = o.format ?? "hutch";
  if (format !== "hutch" && format !== "e2b") throw new TypeError(`format must be "hutch" or "e2b", got ${format}`);
  const body: Record<string, unknown> = { scope, format };
  if (o.tenant !== undefined) body.tenant = o.tenant;
  if (o.name !== undefined) body.name = o.name;
  if (o.selector !== undefined) body.selector = o.selector;
  if (o.expiresInSeconds !== undefined) body.expires_in_seconds = o.expiresInSeconds;
  if (o.dailyBudget !== undefined) body.daily_budget = o.dailyBudget;
  if (o.monthlyBudget !== undefined) body.monthly_budget = o.monthlyBudget;
  return body;
}

/** `/v1/tenants/{name}`. */
export function tenantPath(name: string): string {
  return `/v1/tenants/${encodeURIComponent(name)}`;
}

/** `/v1/keys/{id}`. */
export function keyPath(id: string): string {
  if (!id.startsWith("key_")) throw new TypeError(`invalid key id ${id}: key ids are key_…`);
  return `/v1/keys/${encodeURIComponent(id)}`;
}

/** The calls, over `client` (what its methods delegate to). */
export const tenancy = {
  async createTenant(client: Client, name: string, s: TenantSettings): Promise<Tenant> {
    return tenant(await client.requestJson("POST", "/v1/tenants", { json: { name, ...settingsBody(s) } }));
  },
  async tenants(client: Client): Promise<Tenant[]> {
    return (await client.listAll<Record<string, unknown>>("/v1/tenants", "tenants")).map(tenant);
  },
  async getTenant(client: Client, name: string): Promise<Tenant> {
    return tenant(await client.requestJson("GET", tenantPath(name)));
  },
  async updateTenant(client: Client, name: string, s: TenantSettings): Promise<Tenant> {
    return tenant(await client.requestJson("PATCH", tenantPath(name), { json: settingsBody(s) }));
  },
  async deleteTenant(client: Client, name: string): Promise<void> {
    await client.request("DELETE", tenantPath(name));
  },
  async createKey(client: Client, o: CreateKeyOptions): Promise<ApiKey> {
    return apiKey(await client.requestJson("POST", "/v1/keys", { json: keyBody(o) }));
  },
  async keys(client: Client): Promise<ApiKey[]> {
    return (await client.listAll<Record<string, unknown>>("/v1/keys", "keys")).map(apiKey);
  },
  async getKey(client: Client, id: string): Promise<ApiKey> {
    return apiKey(await client.requestJson("GET", keyPath(id)));
  },
  async revokeKey(client: Client, id: string): Promise<void> {
    await client.request("DELETE", keyPath(id));
  },
  async setKeyBudget(client: Client, id: string, b: KeyBudget): Promise<ApiKey> {
    const json = { daily_budget: b.dailyBudget ?? null, monthly_budget: b.monthlyBudget ?? null };
    return apiKey(await client.requestJson("PATCH", keyPath(id), { json }));
  },
  async usage(client: Client, f: UsageFilter): Promise<UsageReport> {
    if (f.groupBy !== undefined && !(f.groupBy in GROUP_FIELDS)) {
      throw new TypeError(`groupBy must be one of sandbox, tenant, key or day, got ${f.groupBy}`);
    }
    const query: Array<[string, string]> = [];
    for (const [k, v] of [
      ["from", f.from],
      ["to", f.to],
      ["group_by", f.groupBy],
      ["tenant", f.tenant],
      ["key_id", f.keyId],
      ["sandbox_id", f.sandboxId],
    ] as const) {
      if (v !== undefined) query.push([k, v]);
    }
    return usageReport(await client.requestJson("GET", "/v1/usage", { query }));
  },
  async audit(client: Client, f: AuditFilter): Promise<AuditEntry[]> {
    const q: Array<[string, string]> = [];
    for (const [k, v] of [
      ["tenant", f.tenant],
      ["key_id", f.keyId],
      ["sandbox_id", f.sandboxId],
      ["since", f.since],
      ["until", f.until],
    ] as const) {
      if (v !== undefined) q.push([k, v]);
    }
    return (await client.listAll<Record<string, unknown>>("/v1/audit", "entries", q)).map(auditEntry);
  },
};
