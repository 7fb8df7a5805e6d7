/**
 * Templates and their builds: `client.templates` ({@link Templates}) and the handle of one
 * build ({@link Build}).
 *
 * ```ts
 * const build = await client.templates.build("web", "./app", { buildArgs: { VERSION: "3" } });
 * for await (const line of build.logs()) console.log(line.text); // until the build ends
 * await build.wait();  // throws BuildFailed unless the template is ready
 *
 * await (await client.templates.buildFromImage("tools", "registry.example:5000/team/tools:1")).wait();
 * await (await client.templates.uploadImage("app", "./app-image.tar")).wait(); // docker save, OCI
 * await client.templates.update("app", { start: { cmd: "exec app", ready: { port: 8080 } } });
 * ```
 *
 * A Dockerfile build's context directory is packed here (`context.ts`: `.dockerignore`
 * applied, symlinks sent as links) and streamed to `POST /v1/templates`; the server runs the
 * build. An image build names the image (the server pulls it) or uploads an image archive
 * (`images.ts`); its log has `progress` lines for each layer's download and extraction
 * ({@link BuildLogLine.progress}).
 */
import type { Client } from "./client.js";
import { packContext } from "./context.js";
import { BuildFailed, HutchError, InvalidRequest } from "./errors.js";
import {
  imageBuildBody,
  openArchive,
  registryCredentials,
  registryHosts,
  templatePatch,
  uploadQuery,
  type ImageBuildOptions,
  type TemplateChanges,
  type UploadImageOptions,
} from "./images.js";
import { buildInfo, buildLogLine, template, type BuildInfo, type BuildLogLine, type Template } from "./models.js";
import { sseEvents } from "./sse.js";

/** Options of {@link Templates.build}. */
export interface BuildOptions {
  /** A path in the context (default `Dockerfile`), or an absolute path anywhere. */
  dockerfile?: string;
  /** Values of the Dockerfile's `ARG`s. */
  buildArgs?: Record<string, string>;
  /** The stage to build (default: the last). */
  target?: string;
  /** Run every step, ignoring cached results. */
  noCache?: boolean;
  /** `USER:PASSWORD` for the registry of the `FROM` images. */
  registryAuth?: string;
  /** Registries (`host:port`) the `FROM` images' pulls speak plain HTTP to. */
  insecureRegistries?: string[];
  /**
   * Values by id for `RUN --mount=type=secret,id=…` (text is sent as UTF-8); never stored
   * in the template, its cache or the build log.
   */
  secrets?: Record<string, string | Uint8Array>;
}

/** @internal `id=<base64>, …` for the `X-Hutch-Build-Secret` header; `undefined` for none. */
export function buildSecretsHeader(secrets?: Record<string, string | Uint8Array>): string | undefined {
  if (secrets === undefined) return undefined;
  const entries = Object.entries(secrets).map(([id, value]) => {
    if (id === "" || /[=,/\u0000-\u001f]/.test(id)) {
      throw new TypeError(`secret id ${JSON.stringify(id)} must be a name without '=', ',' or '/'`);
    }
    const bytes = typeof value === "string" ? new TextEncoder().encode(value) : value;
    return `${id}=${Buffer.from(bytes).toString("base64")}`;
  });
  return entries.length > 0 ? entries.join(", ") : undefined;
}

/** Options of {@link Build.logs} and {@link Build.wait}. */
export interface BuildLogOptions {
  /** Longest wait for the next log line, milliseconds (default: forever). */
  idleTimeoutMs?: number;
  /** Stop following. */
  signal?: AbortSignal;
}

const templatePath = (name: string, suffix = ""): string => `/v1/templates/${encodeURIComponent(name)}${suffix}`;
const buildPath = (name: string, id: string, suffix = ""): string =>
  templatePath(name, `/builds/${encodeURIComponent(id)}${suffix}`);

/** @internal The query of `POST /v1/templates`. */
export function buildQuery(name: string, dockerfile: string, opts: BuildOptions): Array<[string, string]> {
  const q: Array<[string, string]> = [
    ["name", name],
    ["dockerfile", dockerfile],
  ];
  if (opts.target !== undefined) q.push(["target", opts.target]);
  if (opts.noCache) q.push(["no_cache", "true"]);
  for (const [k, v] of Object.entries(opts.buildArgs ?? {})) {
    if (!k || k.includes("=")) throw new InvalidRequest(`build arg names must be non-empty without '=', got ${JSON.stringify(k)}`);
    q.push(["build_arg", `${k}=${v}`]);
  }
  for (const host of registryHosts(opts.insecureRegistries)) q.push(["insecure_registry", host]);
  return q;
}

/** A template build running on the server (from {@link Templates.build}). */
export class Build {
  /** The build as last seen: steps, timings, error. */
  info: BuildInfo;

  /** @internal */
  constructor(
    info: BuildInfo,
    private readonly client: Client,
  ) {
    this.info = info;
  }

  /** `bld_…`. */
  get id(): string {
    return this.info.id;
  }

  /** The template it builds. */
  get template(): string {
    return this.info.template;
  }

  /** As last seen ({@link refresh}): `queued`, `running`, `succeeded`, `failed` or `cancelled`. */
  get status(): string {
    return this.info.status;
  }

  /** Ask the server how the build is. */
  async refresh(): Promise<BuildInfo> {
    this.info = buildInfo(await this.client.requestJson("GET", buildPath(this.template, this.id)));
    return this.info;
  }

  /**
   * Cancel it: its running step is killed and the template stays as it was. The build ends
   * `cancelled` a moment later ({@link wait} throws {@link BuildFailed}).
   */
  async cancel(): Promise<BuildInfo> {
    this.info = buildInfo(await this.client.requestJson("DELETE", buildPath(this.template, this.id)));
    return this.info;
  }

  /** The build's log from its first line, followed until the build ends: `for await` it. */
  async *logs(opts: BuildLogOptions = {}): AsyncGenerator<BuildLogLine> {
    const resp = await this.client.request("GET", buildPath(this.template, this.id, "/logs"), {
      query: [["follow", "true"]],
      accept: "text/event-stream",
      timeoutMs: null,
      signal: opts.signal,
    });
    if (!resp.body) throw new HutchError("the build log answer has no body");
    for await (const ev of sseEvents(resp.body, opts.idleTimeoutMs)) {
      if (ev.event === "end") return;
      if (ev.event !== "log") continue;
      try {
        yield buildLogLine(JSON.parse(ev.data) as Record<string, unknown>);
      } catch (e) {
        if (e instanceof SyntaxError) continue;
        throw e;
      }
    }
  }

  /**
   * Follow the log until the build ends; the build once it succeeded.
   * @param opts.onLine Called with each log line as it comes.
   * @throws {@link BuildFailed} when the build failed (a step's error) or was cancelled.
   */
  async wait(opts: BuildLogOptions & { onLine?: (line: BuildLogLine) => unknown } = {}): Promise<BuildInfo> {
    for await (const line of this.logs(opts)) {
      if (opts.onLine) await opts.onLine(line);
    }
    const info = await this.refresh();
    if (info.status !== "succeeded") {
      throw new BuildFailed(
        `build ${info.id} of template ${info.template} ${info.status}: ${info.error ?? "no reason given"}`,
        info,
      );
    }
    return info;
  }
}

/**
 * `client.templates`: the server's templates, building them (from a Dockerfile, an image in a
 * registry or an uploaded image) and changing them. Calling it (`await client.templates()`)
 * lists them.
 */
export interface Templates {
  (): Promise<Template[]>;
  /** The templates sandboxes can be created from. */
  list(): Promise<Template[]>;
  /** One template. @throws {@link NotFoundError} when there is none. */
  get(name: string): Promise<Template>;
  /**
   * Delete a template (admin keys only).
   * @throws {@link ConflictError} while sandboxes or snapshots use it (named in the message)
   *   or a build of it runs; {@link NotFoundError} when there is none.
   */
  delete(name: string): Promise<void>;
  /**
   * Start building template `name` from a Dockerfile and the build context `contextDir`
   * (default `.`; its `.dockerignore` leaves files out). The server plans the Dockerfile
   * before it answers ({@link InvalidRequest} naming the line), then runs the build.
   */
  build(name: string, contextDir?: string, opts?: BuildOptions): Promise<Build>;
  /**
   * Start building template `name` from the OCI image `fromImage` in a registry
   * (`registry.example:5000/team/tools:1`), which the server pulls and unpacks in the
   * background (the log's `progress` lines tell how far each layer is). Images in local files
   * are uploaded with {@link uploadImage} instead.
   * @throws {@link InvalidRequest} for a bad name or value, or a `fromImage` naming local files
   *   (`oci:…`, `docker-archive:…`); {@link ConflictError} with a tenant key for a name another
   *   tenant's template holds, or a shared one.
   */
  buildFromImage(name: string, fromImage: string, opts?: ImageBuildOptions): Promise<Build>;
  /**
   * Start building template `name` from an image in local files, uploaded: a `docker save`
   * archive or a tarball of an OCI image layout (sent as it is), or an OCI image layout
   * directory (packed here). The template records its image as `upload` (`upload:TAG` with
   * `imageTag`).
   * @throws {@link InvalidRequest} when `archive` is neither a file nor a directory, for a bad
   *   name or value, or a malformed archive.
   */
  uploadImage(name: string, archive: string, opts?: UploadImageOptions): Promise<Build>;
  /**
   * Change a ready template's start command (`start`; `null` removes it) or the isolation its
   * sandboxes get when a create names none. Sandboxes created afterwards get the change;
   * running ones, snapshots and hibernated sandboxes keep what they started with. Resolves to
   * the template as it is now.
   * @throws {@link NotFoundError} for no such ready template (or another tenant's);
   *   {@link PermissionDenied} with a tenant key on a template shared by every tenant;
   *   {@link ConflictError} while a build of it runs.
   */
  update(name: string, changes: TemplateChanges): Promise<Template>;
  /** The builds of `name` the server remembers, oldest first. */
  builds(name: string): Promise<Build[]>;
  /** Build `id` of template `name`. */
  getBuild(name: string, id: string): Promise<Build>;
}

/** Batch small pieces of a stream into chunks of about `size` bytes. */
async function* batched(pieces: AsyncIterable<Uint8Array>, size = 64 * 1024): AsyncGenerator<Uint8Array> {
  let parts: Uint8Array[] = [];
  let held = 0;
  for await (const p of pieces) {
    parts.push(p);
    held += p.length;
    if (held >= size) {
      yield Buffer.concat(parts);
      parts = [];
      held = 0;
    }
  }
  if (held > 0) yield Buffer.concat(parts);
}

/** @internal */
export function templatesOf(client: Client): Templates {
  const list = async (): Promise<Template[]> => {
    const doc = await client.requestJson<{ templates?: Record<string, unknown>[] }>("GET", "/v1/templates");
    return (doc.templates ?? []).map((t) => template(t));
  };
  const api = (() => list()) as Templates;
  api.list = list;
  api.get = async (name) => template(await client.requestJson("GET", templatePath(name)));
  api.delete = async (name) => {
    await client.request("DELETE", templatePath(name), { timeoutMs: null });
  };
  /** `POST /v1/templates` with a tar stream (a build context or an image archive). */
  const upload = async (
    query: Array<[string, string]>,
    stream: AsyncGenerator<Uint8Array>,
    headers?: Record<string, string>,
  ): Promise<Build> => {
    const pieces = batched(stream);
    const body = new ReadableStream<Uint8Array>({
      async pull(controller) {
        const { value, done } = await pieces.next();
        if (done) controller.close();
        else controller.enqueue(value);
      },
      async cancel() {
        await pieces.return(undefined);
      },
    });
    try {
      const doc = await client.requestJson("POST", "/v1/templates", {
        query,
        body,
        contentType: "application/x-tar",
        timeoutMs: null,
        headers,
      });
      return new Build(buildInfo(doc), client);
    } finally {
      // An answer before the whole body was read (a refusal) leaves the files open otherwise.
      await pieces.return(undefined);
    }
  };
  api.build = async (name, contextDir = ".", opts = {}) => {
    const auth = registryCredentials(opts.registryAuth);
    const secrets = buildSecretsHeader(opts.secrets);
    const headers: Record<string, string> = {};
    if (auth !== undefined) headers["x-hutch-registry-auth"] = auth;
    if (secrets !== undefined) headers["x-hutch-build-secret"] = secrets;
    const packed = await packContext(contextDir, opts.dockerfile);
    const query = buildQuery(name, packed.dockerfile, opts);
    return upload(query, packed.stream(), Object.keys(headers).length > 0 ? headers : undefined);
  };
  api.buildFromImage = async (name, fromImage, opts = {}) => {
    const doc = await client.requestJson("POST", "/v1/templates", {
      json: imageBuildBody(name, fromImage, opts),
      timeoutMs: null,
    });
    return new Build(buildInfo(doc), client);
  };
  api.uploadImage = async (name, archive, opts = {}) => {
    const query = uploadQuery(name, opts);
    return upload(query, await openArchive(archive));
  };
  api.update = async (name, changes) =>
    template(await client.requestJson("PATCH", templatePath(name), { json: templatePatch(changes) }));
  api.builds = async (name) => {
    const doc = await client.requestJson<{ builds?: Record<string, unknown>[] }>("GET", templatePath(name, "/builds"));
    return (doc.builds ?? []).map((b) => new Build(buildInfo(b), client));
  };
  api.getBuild = async (name, id) => new Build(buildInfo(await client.requestJson("GET", buildPath(name, id))), client);
  return api;
}
