/** Plain data returned by the SDK. Each keeps the server's JSON in `raw`. Times are RFC 3339 strings. */
import { HutchError } from "./errors.js";

/** Lifecycle states. `lost`: in cluster mode, the node that ran it was declared dead; it never runs again (delete it). */
export type SandboxState = "starting" | "running" | "paused" | "hibernated" | "stopped" | "failed" | "lost";

/** A sandbox as the server last described it. */
export interface SandboxInfo {
  id: string;
  template: string;
  /** `ns` or `vm`. */
  isolation: string;
  state: SandboxState | string;
  metadata: Record<string, string>;
  cpus: number;
  memoryMib: number;
  diskMib: number | undefined;
  pidsMax: number | undefined;
  createdAt: string;
  /** When the sandbox will be reaped unless used again; null when persistent. */
  expiresAt: string | null;
  ttlSeconds: number | undefined;
  persistent: boolean;
  network: Record<string, unknown>;
  /** Why the sandbox failed or was lost; only when `state` is `"failed"` or `"lost"`. */
  error: string | undefined;
  /** The named snapshot (`snap_…`) this sandbox was created from, if any. */
  snapshot: string | undefined;
  /** The sandbox this one was forked from (by `fork` or `explore`), if any. */
  forkedFrom: string | undefined;
  /** Hibernate after this many idle seconds; undefined when idle hibernation is off. */
  idleHibernateSeconds: number | undefined;
  /**
   * Only in the answer of `Sandbox.wake()`: milliseconds from the start of the wake until
   * the sandbox's agent answered. Undefined everywhere else.
   */
  wokeInMs: number | undefined;
  /** The volumes mounted in the sandbox (empty when none); `volume` is always the id. */
  volumes: VolumeMountInfo[];
  raw: Record<string, unknown>;
}

/** A volume mounted in a sandbox (an entry of {@link SandboxInfo.volumes}). */
export interface VolumeMountInfo {
  /** The volume's id (`vol_…`), even when it was named by its name on create. */
  volume: string;
  /** Absolute path inside the sandbox. */
  path: string;
  readOnly: boolean;
}

/** The collected result of a command. A non-zero exit code is not an error. */
export interface ExecResult {
  /** Standard output as text (invalid UTF-8 replaced by U+FFFD; see `stdoutBytes`). */
  stdout: string;
  stderr: string;
  /** The program's status; `128+N` if killed by signal N; 124 on timeout; 127 if not found. */
  exitCode: number;
  /** The command's own timeout killed it. */
  timedOut: boolean;
  durationMs: number;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  oomKilled: boolean;
  /** The exact bytes of stdout. */
  stdoutBytes: Uint8Array;
  stderrBytes: Uint8Array;
  /** True when the command exited 0 and did not time out. */
  ok: boolean;
  raw: Record<string, unknown>;
}

/** A file, directory or symlink inside a sandbox. */
export interface FileEntry {
  name: string;
  path: string;
  /** `file`, `dir`, `symlink` or `other`. */
  type: "file" | "dir" | "symlink" | "other" | string;
  size: number;
  /** Permission bits as a number (`0o644 === 420`). */
  mode: number;
  modifiedAt: string;
  symlinkTarget: string | undefined;
  /** Owner's user id, as the sandbox sees it. */
  uid: number;
  gid: number;
  /** The owner's name in the sandbox's `/etc/passwd`, when it has one. */
  owner: string | undefined;
  /** The group's name in the sandbox's `/etc/group`, when it has one. */
  group: string | undefined;
  /** The file's metadata: its `user.*` extended attributes, keys without `user.`. */
  metadata: Record<string, string>;
  raw: Record<string, unknown>;
}

/** One change below a watched directory (`Files.watch`). */
export interface FileEvent {
  /** `create`, `write`, `remove`, `rename` or `chmod`. */
  event: "create" | "write" | "remove" | "rename" | "chmod" | string;
  /** The path relative to the watched directory (`sub/a.txt`). */
  name: string;
  /** The absolute path. */
  path: string;
  /** `file`, `dir`, `symlink` or `other`. */
  type: "file" | "dir" | "symlink" | "other" | string;
  /** For a rename: the old path relative to the watched directory. */
  oldName: string | undefined;
  /** For a rename: the old absolute path. */
  oldPath: string | undefined;
  /** The entry when the event was read (watches with `includeEntry`). */
  entry: FileEntry | undefined;
  raw: Record<string, unknown>;
}

/** Resource usage of a sandbox right now. */
export interface Usage {
  memoryBytes: number;
  memoryLimitBytes: number;
  oomKills: number;
  cpuUsageNs: number;
  pids: number;
  raw: Record<string, unknown>;
}

/**
 * When a sandbox of a template counts as ready (a create waits for it): `{port: N}` (a TCP
 * connect on its loopback succeeds) or `{cmd: …}` (the command exits 0), tried every
 * `interval_ms` (100) for at most `attempt_timeout_ms` (10000) each, until `timeout_ms`
 * (60000, at least 1000). Field names are the server's.
 */
export type ReadyCheck = ({ port: number; cmd?: never } | { cmd: string | string[]; port?: never }) & {
  interval_ms?: number;
  attempt_timeout_ms?: number;
  timeout_ms?: number;
};

/**
 * A template's start command (the API's `ServiceSpec`): what every sandbox created from it
 * runs, supervised by its agent, and the ready check a create waits for.
 */
export interface ServiceSpec {
  /** A shell command line (run under `/bin/sh -c`) or an argv array. */
  cmd: string | string[];
  /** Its own environment, over the sandbox's. */
  env?: Record<string, string>;
  /** Its working directory (default: the user's home, else `/`). */
  cwd?: string;
  /** Its user, a name or a uid (default `root`). */
  user?: string;
  ready?: ReadyCheck;
}

/** A root filesystem sandboxes can be created from. */
export interface Template {
  name: string;
  ready: boolean;
  isolations: string[];
  sizeBytes: number;
  description: string;
  createdAt: string | undefined;
  defaults: Record<string, unknown>;
  /** The start command its sandboxes run, and its ready check; undefined: none. */
  start: ServiceSpec | undefined;
  /**
   * For a template made from an image: its `reference` (`upload` or `upload:TAG` for an
   * uploaded archive), `digest` and configuration.
   */
  image: Record<string, unknown> | undefined;
  /**
   * Its tags and the revision each names (`{v2: 3}`): `template: "web:v2"` creates from that
   * revision; a build of `web:v2` sets one.
   */
  tags: Record<string, number>;
  raw: Record<string, unknown>;
}

/** One step of a template build (an entry of {@link BuildInfo.steps}). */
export interface BuildStep {
  /** 1-based over every step the build runs (log lines carry it as `step`). */
  number: number;
  /** The stage it belongs to (its `AS` name, or `stage N`). */
  stage: string;
  /** Its Dockerfile line. */
  line: number;
  /** The instruction as written. */
  instruction: string;
  /** `pending`, `running`, `cached`, `done` or `failed`. */
  status: string;
  durationMs: number | undefined;
}

/** A template build as the server last described it (`GET /v1/templates/{name}/builds/{id}`). */
export interface BuildInfo {
  /** `bld_…`. */
  id: string;
  template: string;
  /** `queued`, `running`, `succeeded`, `failed` or `cancelled`. */
  status: string;
  steps: BuildStep[];
  warnings: string[];
  createdAt: string | undefined;
  finishedAt: string | undefined;
  durationMs: number | undefined;
  /** Why it failed, or that it was cancelled. */
  error: string | undefined;
  /** Whether it has ended. */
  done: boolean;
  raw: Record<string, unknown>;
}

/**
 * How far one blob's transfer is: the numbers of a `progress` line of an image build's log
 * ({@link BuildLogLine.progress}), to draw a progress bar from.
 */
export interface BuildProgress {
  /** The blob (`sha256:…`). */
  id: string;
  /** What it is (`layer 2/3`). */
  label: string;
  /** `download` (from the registry) or `extract` (applied to the root filesystem). */
  action: string;
  /** Bytes done (of the compressed blob, also while extracting). */
  current: number;
  /** Bytes in all. */
  total: number;
}

/** One line of a build's log (`Build.logs`). */
export interface BuildLogLine {
  /** Its number in the build's log, from 1. */
  seq: number;
  /**
   * `status` (the builder's own account), `stdout` or `stderr` (what a step printed), or
   * `progress` (how far a layer's download or extraction is: {@link progress}).
   */
  stream: string;
  text: string;
  /** The step that printed it (undefined: the build itself). */
  step: number | undefined;
  timeMs: number | undefined;
  /** A `progress` line's numbers (undefined on other lines). */
  progress: BuildProgress | undefined;
}

/** One event from `GET /v1/events`. */
export interface LifecycleEvent {
  /** `sandbox.created`, `sandbox.killed`, `sandbox.expired`, `sandbox.failed`, `sandbox.oom`, … */
  type: string;
  sandboxId: string;
  tenantId: string | null;
  at: string;
  detail: string | undefined;
  raw: Record<string, unknown>;
}

/** One line of a sandbox's logs (`Sandbox.logs`, `Sandbox.followLogs`). */
export interface LogLine {
  /** `agent` (the sandbox's init, on `ns`) or `console` (a `vm` guest's serial console). */
  source: string;
  /** The line, without its time and newline. */
  text: string;
  /** When it was written (RFC 3339), if the log records it. */
  time: string | undefined;
}

/**
 * A named snapshot that new sandboxes can start from (`Sandbox.create({ snapshot })`).
 *
 * On `ns` a snapshot is `kind: "filesystem"`: the sandbox's files (its writes, merged with the
 * snapshot it was itself created from), not its processes, memory, `/tmp` or `/dev/shm`.
 * Sandboxes created from it use its files in place (copy-on-write), so it cannot be deleted
 * while any of them exists: see `usedBy`.
 */
export interface Snapshot {
  /** `snap_…`. */
  id: string;
  /** The name given when it was taken (names need not be unique; the id is). */
  name: string;
  /** The sandbox it was taken of (which may be gone since). */
  sandboxId: string;
  /** `filesystem` (`ns`: files only) or `memory` (`vm`, later). */
  kind: "filesystem" | "memory" | string;
  /** `ns` or `vm`; sandboxes created from it use the same. */
  isolation: string;
  /** The template under its files; sandboxes created from it use it too. */
  template: string;
  sizeBytes: number;
  createdAt: string;
  /** Sandboxes created from it that still exist; deleting it is a 409 while this is not empty. */
  usedBy: string[];
  raw: Record<string, unknown>;
}

/** Where a volume is mounted now (an entry of {@link Volume.attached}). */
export interface VolumeAttachment {
  /** The sandbox's id. */
  sandbox: string;
  /** Absolute path inside that sandbox. */
  path: string;
  readOnly: boolean;
}

/**
 * A durable volume: a fixed-size ext4 filesystem that outlives the sandboxes using it. Mount it
 * with `Sandbox.create({ volumes: [{ volume: vol.id, path: "/data" }] })`. It can be attached
 * read-write to one sandbox at a time, or read-only to any number; writes beyond `sizeMib` fail
 * inside the sandbox with `ENOSPC`. Forks get only their parent's read-only volumes. It cannot
 * be deleted while attached: see `attached`.
 */
export interface Volume {
  /** `vol_…`. */
  id: string;
  /** Unique per tenant; accepted wherever the id is. */
  name: string;
  /** Size limit in MiB. */
  sizeMib: number;
  createdAt: string;
  /** Bytes in use; only while the volume is mounted (else undefined). */
  usedBytes: number | undefined;
  /**
   * Sandboxes it is attached to (running, paused or hibernated); deleting it is a 409 while
   * this is not empty.
   */
  attached: VolumeAttachment[];
  raw: Record<string, unknown>;
}

/** How one command of an `explore` call did, in the child sandbox it ran in. */
export interface ExploreOutcome {
  /** Position of the command in the `commands` given to `explore`. */
  index: number;
  /** The child it ran in: destroyed unless `kept`. */
  sandboxId: string;
  /**
   * Exit status (124 after the timeout, `128+N` for signal N); null when the command could not
   * run at all (see `error`).
   */
  exitCode: number | null;
  timedOut: boolean;
  /** Its stdout (lossy UTF-8, at most 1 MiB; see `stdoutTruncated`). */
  stdout: string;
  stderr: string;
  stdoutTruncated: boolean;
  stderrTruncated: boolean;
  durationMs: number;
  /** 1 for exit status 0 and 0 otherwise, or the number `scoreRegex` captured. */
  score: number;
  /** Whether this is the winner, kept as an independent sandbox. */
  kept: boolean;
  /** True when the command exited 0 and did not time out. */
  ok: boolean;
  /** Why the command could not run; only then. */
  error: string | undefined;
  raw: Record<string, unknown>;
}

/**
 * The answer of `explore`: the winner (kept as a sandbox) and every outcome. The best score
 * wins, ties going to the lowest index, so there is always a winner, even when every command
 * failed: check `winner.score` (or `winner.ok`).
 */
export interface ExploreResult {
  /** The winning outcome; `winner.sandboxId` is the surviving child. */
  winner: ExploreOutcome;
  /** Every outcome, in the order of the commands. */
  outcomes: ExploreOutcome[];
  raw: Record<string, unknown>;
}

type Json = Record<string, unknown>;

const str = (v: unknown, d = ""): string => (typeof v === "string" ? v : d);
const num = (v: unknown, d = 0): number => (typeof v === "number" ? v : d);
const optNum = (v: unknown): number | undefined => (typeof v === "number" ? v : undefined);
const optStr = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined);
const obj = (v: unknown): Json => (v && typeof v === "object" && !Array.isArray(v) ? (v as Json) : {});

function strMap(v: unknown): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, x] of Object.entries(obj(v))) out[k] = String(x);
  return out;
}

function b64(v: unknown): Uint8Array | undefined {
  return typeof v === "string" ? new Uint8Array(Buffer.from(v, "base64")) : undefined;
}

/** @internal */
export function sandboxInfo(d: Json): SandboxInfo {
  return {
    id: str(d.id),
    template: str(d.template),
    isolation: str(d.isolation),
    state: str(d.state),
    metadata: strMap(d.metadata),
    cpus: num(d.cpus),
    memoryMib: num(d.memory_mib),
    diskMib: optNum(d.disk_mib),
    pidsMax: optNum(d.pids_max),
    createdAt: str(d.created_at),
    expiresAt: typeof d.expires_at === "string" ? d.expires_at : null,
    ttlSeconds: optNum(d.ttl_seconds),
    persistent: d.persistent === true,
    network: obj(d.network),
    error: optStr(d.error),
    snapshot: optStr(d.snapshot),
    forkedFrom: optStr(d.forked_from),
    idleHibernateSeconds: optNum(d.idle_hibernate_seconds),
    wokeInMs: optNum(d.woke_in_ms),
    volumes: Array.isArray(d.volumes)
      ? d.volumes.map((v) => {
          const m = obj(v);
          return { volume: str(m.volume), path: str(m.path), readOnly: m.read_only === true };
        })
      : [],
    raw: d,
  };
}

/** @internal */
export function execResult(d: Json): ExecResult {
  const enc = new TextEncoder();
  const exitCode = num(d.exit_code, -1);
  const timedOut = d.timed_out === true;
  return {
    stdout: str(d.stdout),
    stderr: str(d.stderr),
    exitCode,
    timedOut,
    durationMs: num(d.duration_ms),
    stdoutTruncated: d.stdout_truncated === true,
    stderrTruncated: d.stderr_truncated === true,
    oomKilled: d.oom_killed === true,
    stdoutBytes: b64(d.stdout_b64) ?? enc.encode(str(d.stdout)),
    stderrBytes: b64(d.stderr_b64) ?? enc.encode(str(d.stderr)),
    ok: exitCode === 0 && !timedOut,
    raw: d,
  };
}

/** @internal */
export function fileEntry(d: Json): FileEntry {
  return {
    name: str(d.name),
    path: str(d.path),
    type: str(d.type),
    size: num(d.size),
    mode: num(d.mode),
    modifiedAt: str(d.modified_at),
    symlinkTarget: optStr(d.symlink_target),
    uid: num(d.uid),
    gid: num(d.gid),
    owner: optStr(d.owner),
    group: optStr(d.group),
    metadata: Object.fromEntries(
      Object.entries((d.metadata as Record<string, unknown> | undefined) ?? {}).map(([k, v]) => [k, String(v)]),
    ),
    raw: d,
  };
}

/** @internal */
export function fileEvent(d: Json): FileEvent {
  const entry = d.entry;
  return {
    event: str(d.event),
    name: str(d.name),
    path: str(d.path),
    type: str(d.type),
    oldName: optStr(d.old_name),
    oldPath: optStr(d.old_path),
    entry: entry && typeof entry === "object" ? fileEntry(entry as Json) : undefined,
    raw: d,
  };
}

/** @internal */
export function usage(d: Json): Usage {
  return {
    memoryBytes: num(d.memory_bytes),
    memoryLimitBytes: num(d.memory_limit_bytes),
    oomKills: num(d.oom_kills),
    cpuUsageNs: num(d.cpu_usage_ns),
    pids: num(d.pids),
    raw: d,
  };
}

/** @internal */
export function template(d: Json): Template {
  return {
    name: str(d.name),
    ready: d.ready === true,
    isolations: Array.isArray(d.isolations) ? d.isolations.map(String) : [],
    sizeBytes: num(d.size_bytes),
    description: str(d.description),
    createdAt: optStr(d.created_at),
    defaults: obj(d.defaults),
    start: d.start && typeof d.start === "object" ? (d.start as unknown as ServiceSpec) : undefined,
    image: d.image && typeof d.image === "object" ? obj(d.image) : undefined,
    tags: Object.fromEntries(Object.entries(obj(d.tags)).filter((e): e is [string, number] => typeof e[1] === "number")),
    raw: d,
  };
}

/** @internal */
export function buildInfo(d: Json): BuildInfo {
  const status = str(d.status);
  return {
    id: str(d.id),
    template: str(d.template),
    status,
    steps: Array.isArray(d.steps)
      ? d.steps.map((s) => {
          const step = obj(s);
          return {
            number: num(step.number),
            stage: str(step.stage),
            line: num(step.line),
            instruction: str(step.instruction),
            status: str(step.status),
            durationMs: optNum(step.duration_ms),
          };
        })
      : [],
    warnings: Array.isArray(d.warnings) ? d.warnings.map(String) : [],
    createdAt: optStr(d.created_at),
    finishedAt: optStr(d.finished_at),
    durationMs: optNum(d.duration_ms),
    error: optStr(d.error),
    done: status === "succeeded" || status === "failed" || status === "cancelled",
    raw: d,
  };
}

/** @internal */
export function buildLogLine(d: Json): BuildLogLine {
  return {
    seq: num(d.seq),
    stream: str(d.stream),
    text: str(d.text),
    step: optNum(d.step),
    timeMs: optNum(d.time_ms),
    progress: d.progress && typeof d.progress === "object" ? buildProgress(obj(d.progress)) : undefined,
  };
}

function buildProgress(d: Json): BuildProgress {
  return {
    id: str(d.id),
    label: str(d.label),
    action: str(d.action),
    current: num(d.current),
    total: num(d.total),
  };
}

/** @internal */
export function lifecycleEvent(d: Json, event = ""): LifecycleEvent {
  return {
    type: str(d.type, event),
    sandboxId: str(d.sandbox_id),
    tenantId: typeof d.tenant_id === "string" ? d.tenant_id : null,
    at: str(d.at),
    detail: optStr(d.detail),
    raw: d,
  };
}

/** @internal */
export function logLine(d: Json): LogLine {
  return { source: str(d.source), text: str(d.text), time: optStr(d.time) };
}

/** @internal */
export function snapshot(d: Json): Snapshot {
  return {
    id: str(d.id),
    name: str(d.name),
    sandboxId: str(d.sandbox_id),
    kind: str(d.kind),
    isolation: str(d.isolation),
    template: str(d.template),
    sizeBytes: num(d.size_bytes),
    createdAt: str(d.created_at),
    usedBy: Array.isArray(d.used_by) ? d.used_by.map(String) : [],
    raw: d,
  };
}

/** @internal */
export function volume(d: Json): Volume {
  return {
    id: str(d.id),
    name: str(d.name),
    sizeMib: num(d.size_mib),
    createdAt: str(d.created_at),
    usedBytes: optNum(d.used_bytes),
    attached: Array.isArray(d.attached)
      ? d.attached.map((a) => {
          const m = obj(a);
          return { sandbox: str(m.sandbox), path: str(m.path), readOnly: m.read_only === true };
        })
      : [],
    raw: d,
  };
}

function exploreOutcome(d: Json): ExploreOutcome {
  const exitCode = typeof d.exit_code === "number" ? d.exit_code : null;
  const timedOut = d.timed_out === true;
  return {
    index: num(d.index),
    sandboxId: str(d.sandbox_id),
    exitCode,
    timedOut,
    stdout: str(d.stdout),
    stderr: str(d.stderr),
    stdoutTruncated: d.stdout_truncated === true,
    stderrTruncated: d.stderr_truncated === true,
    durationMs: num(d.duration_ms),
    score: num(d.score),
    kept: d.kept === true,
    ok: exitCode === 0 && !timedOut,
    error: optStr(d.error),
    raw: d,
  };
}

/** @internal */
export function exploreResult(d: Json): ExploreResult {
  const outcomes = Array.isArray(d.outcomes) ? d.outcomes.map((o) => exploreOutcome(obj(o))) : [];
  const w = d.winner;
  const winner = w && typeof w === "object" ? exploreOutcome(w as Json) : outcomes.find((o) => o.kept);
  if (!winner) throw new HutchError("the explore answer names no winner");
  return { winner, outcomes, raw: d };
}
