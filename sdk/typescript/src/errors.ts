import type { BuildInfo } from "./models.js";

/** Options carried by every {@link HutchError}. */
export interface HutchErrorOptions {
  /** HTTP status of the answer, if the error came from one. */
  status?: number;
  /** The server's machine-readable `error.code`, e.g. `not_found`. */
  code?: string;
  cause?: unknown;
}

/** Base class of every error raised by this SDK. */
export class HutchError extends Error {
  /** HTTP status of the answer, if the error came from one. */
  readonly status: number | undefined;
  /** The server's machine-readable `error.code`, if any. */
  readonly code: string | undefined;

  constructor(message: string, opts: HutchErrorOptions = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = new.target.name;
    this.status = opts.status;
    this.code = opts.code;
  }
}

/** 401: the API key is missing or wrong. */
export class AuthError extends HutchError {}
/** 403: the sandbox's filesystem refused the operation, or the key may not do this. */
export class PermissionDenied extends HutchError {}
/**
 * 403 `forbidden`: the API key's scope does not allow the call, a template its tenant may not
 * use, or a key wider than the one making it.
 */
export class Forbidden extends PermissionDenied {}
/** 404: something does not exist. */
export class NotFoundError extends HutchError {}
/** 404: no such sandbox (never existed, killed, expired, or another tenant's). */
export class SandboxNotFound extends NotFoundError {}
/** 404: no such file or directory inside the sandbox. */
export class FileNotFound extends NotFoundError {}
/** 404: no process handle of that pid or tag in the sandbox (or it exited too long ago). */
export class ProcessNotFound extends NotFoundError {}
/** 404 for a route this server does not have (a feature that has not landed yet). */
export class Unsupported extends NotFoundError {}
/**
 * 400 or 422: malformed input, or a value (or feature) the server does not accept, e.g.
 * `fork({ mode: "live" })` on an `ns` sandbox (live forks need the `vm` backend).
 */
export class InvalidRequest extends HutchError {}
/**
 * 409: wrong state, e.g. exec or file calls on a paused sandbox (resume it first), resume of a
 * sandbox that is not paused, deleting a snapshot that sandboxes still use, a failed sandbox,
 * or a directory that is not empty.
 */
export class ConflictError extends HutchError {}
/** The sandbox died or could not start (`sandbox_failed`). */
export class SandboxFailed extends ConflictError {}
/** 409 `process_exited`: the process handle has exited; it takes no more input, signals or resizes. */
export class ProcessExited extends ConflictError {}
/** 409 `tag_in_use`: a running process handle of the sandbox already has this tag. */
export class TagInUse extends ConflictError {}
/**
 * 429: a quota or limit was reached. For a tenant's quota (docs/teams.md) the server names it:
 * `quota` (`"max_sandboxes"`, …), its `limit`, what was `used` before the call, and whose
 * (`tenant`); undefined for other limits.
 */
export class QuotaExceeded extends HutchError {
  quota: string | undefined;
  limit: number | undefined;
  used: number | null | undefined;
  tenant: string | undefined;
}
/** 5xx: a bug or an unexpected failure on the server. */
export class ServerError extends HutchError {}
/**
 * 502 from the port proxy: nothing listens on the port inside the sandbox
 * (`connection_refused`), or what listens there did not answer with HTTP (`bad_gateway`).
 */
export class PortUnreachable extends HutchError {}
/**
 * A request or read took longer than allowed (client side). A *command* hitting its own
 * timeout is not an error: `ExecResult.timedOut` is set instead.
 */
export class TimeoutError extends HutchError {}
/** The server could not be reached. */
export class ConnectionError extends HutchError {}

/**
 * A template build ended without a template (`Build.wait`): a step failed, or it was
 * cancelled. `build` is how it ended; its `error` the reason.
 */
export class BuildFailed extends HutchError {
  readonly build: BuildInfo;

  constructor(message: string, build: BuildInfo) {
    super(message, { code: build.status });
    this.build = build;
  }
}
/** 404: no such code context in the sandbox. */
export class ContextNotFound extends NotFoundError {}
/** 422 `no_interpreter`: the template cannot run code; use the `code-interpreter` template. */
export class NoInterpreter extends InvalidRequest {}
/** 502 `interpreter_failed`: the code interpreter inside the sandbox failed. */
export class InterpreterFailed extends ServerError {}

type ErrorClass = new (message: string, opts?: HutchErrorOptions) => HutchError;

function classFor(status: number, code: string | undefined, message: string, kind: string): ErrorClass {
  if (code === "sandbox_failed") return SandboxFailed;
  if (code === "process_exited") return ProcessExited;
  if (code === "tag_in_use") return TagInUse;
  if (code === "no_interpreter") return NoInterpreter;
  if (code === "interpreter_failed") return InterpreterFailed;
  if (code === "connection_refused" || code === "bad_gateway") return PortUnreachable;
  if (code === "forbidden") return Forbidden;
  if (status === 401) return AuthError;
  if (status === 403) return PermissionDenied;
  if (status === 404) {
    if (message.startsWith("sandbox ")) return SandboxNotFound;
    if (message.startsWith("context ")) return ContextNotFound;
    if (message.startsWith("no process ")) return ProcessNotFound;
    if (message.startsWith("no such route")) return Unsupported;
    if (kind === "files") return FileNotFound;
    return NotFoundError;
  }
  if (status === 400 || status === 422) return InvalidRequest;
  if (status === 409) return ConflictError;
  if (status === 429) return QuotaExceeded;
  if (status >= 500) return ServerError;
  return HutchError;
}

/**
 * Build the error for a non-2xx answer. `kind` is `"files"` when a 404 that is not about the
 * sandbox itself means a missing file.
 */
export function errorFromResponse(status: number, body: string, kind = ""): HutchError {
  let code: string | undefined;
  let message = "";
  let fields: Record<string, unknown> = {};
  try {
    const doc = JSON.parse(body) as { error?: Record<string, unknown> };
    if (doc && typeof doc.error === "object" && doc.error) {
      fields = doc.error;
      if (typeof doc.error.code === "string") code = doc.error.code;
      if (typeof doc.error.message === "string") message = doc.error.message;
    }
  } catch {
    // not JSON: use the text
  }
  if (!message) message = body.trim().slice(0, 500) || `HTTP ${status}`;
  const Cls = classFor(status, code, message, kind);
  const err = new Cls(message, { status, code });
  if (err instanceof QuotaExceeded) {
    if (typeof fields.quota === "string") err.quota = fields.quota;
    if (typeof fields.limit === "number") err.limit = fields.limit;
    if (typeof fields.used === "number" || fields.used === null) err.used = fields.used as number | null;
    if (typeof fields.tenant === "string") err.tenant = fields.tenant;
  }
  return err;
}

/** Build the error for an `error` event ending an exec stream. */
export function errorFromEvent(payload: { code?: unknown; message?: unknown }): HutchError {
  const code = typeof payload.code === "string" ? payload.code : undefined;
  const message =
    typeof payload.message === "string" ? payload.message : "the command could not be run to completion";
  if (code === "sandbox_failed") return new SandboxFailed(message, { code });
  if (code === "interpreter_failed") return new InterpreterFailed(message, { code });
  return new HutchError(message, { code });
}
