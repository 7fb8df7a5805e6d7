/**
 * TypeScript client for Hutch, a self-hosted sandbox runtime for AI agents.
 *
 * ```ts
 * import { Sandbox } from "@hutch/sdk";
 * await using sb = await Sandbox.create();
 * console.log((await sb.exec(["echo", "hello"])).stdout);
 * ```
 *
 * Configuration comes from `HUTCH_URL` (default `http://127.0.0.1:7700`) and `HUTCH_API_KEY`
 * (default: the server's `<state dir>/admin.key`); `HUTCH_TENANT` names the tenant an admin
 * key acts for.
 */
import "./polyfill.js";

export { Client, EventStream, LogStream, PAGE_LIMIT, SseStream, type ClientOptions, type Query, type RequestOptions } from "./client.js";
export {
  Result,
  type CodeContext,
  type CodeContextOptions,
  type Execution,
  type ExecutionError,
  type RunCodeOptions,
} from "./code.js";
export { DEFAULT_URL, defaultStateDir, resolveConfig, type ResolvedConfig } from "./config.js";
export {
  AuthError,
  BuildFailed,
  ConflictError,
  ConnectionError,
  ContextNotFound,
  FileNotFound,
  Forbidden,
  HutchError,
  InterpreterFailed,
  InvalidRequest,
  NoInterpreter,
  NotFoundError,
  PermissionDenied,
  PortUnreachable,
  ProcessExited,
  ProcessNotFound,
  QuotaExceeded,
  SandboxFailed,
  SandboxNotFound,
  ServerError,
  TagInUse,
  TimeoutError,
  Unsupported,
  errorFromResponse,
  type HutchErrorOptions,
} from "./errors.js";
export type {
  BuildInfo,
  BuildLogLine,
  BuildProgress,
  BuildStep,
  ExecResult,
  ExploreOutcome,
  ExploreResult,
  FileEntry,
  FileEvent,
  LifecycleEvent,
  LogLine,
  ReadyCheck,
  SandboxInfo,
  SandboxState,
  ServiceSpec,
  Snapshot,
  Template,
  Usage,
  Volume,
  VolumeAttachment,
  VolumeMountInfo,
} from "./models.js";
export {
  Process,
  Processes,
  type ProcessEvent,
  type ProcessExit,
  type ProcessInfo,
  type ProcessStartOptions,
  type Signal,
} from "./process.js";
export { PtySession, type PtyOptions } from "./pty.js";
export { FileWatch, type WatchOptions, type WatchReady, type WatchWarning } from "./watch.js";
export {
  Files,
  Sandbox,
  type Command,
  type ConnectOptions,
  type CreateOptions,
  type BackgroundExecOptions,
  type ExecOptions,
  type ExecStreamOptions,
  type ExploreOptions,
  type LogOptions,
  type NetworkPolicy,
  type VolumeMount,
} from "./sandbox.js";
export { sseEvents, type SseEvent } from "./sse.js";
export { DockerIgnore, OUTSIDE_DOCKERFILE, packContext, packDirectory, type PackedContext } from "./context.js";
export {
  ISOLATIONS,
  type ImageBuildOptions,
  type ImageResources,
  type TemplateChanges,
  type UploadImageOptions,
} from "./images.js";
export { Build, type BuildLogOptions, type BuildOptions, type Templates } from "./templates.js";
export type {
  ApiKey,
  AuditEntry,
  AuditFilter,
  CreateKeyOptions,
  KeyBudget,
  KeyScope,
  Quotas,
  SandboxDefaults,
  Tenant,
  TenantSettings,
  UsageFilter,
  UsageGroupBy,
  UsageReport,
  UsageTotals,
} from "./tenants.js";
export { VERSION } from "./version.js";
