/**
 * Templates from OCI images, and changes to a template: the requests of `POST /v1/templates`
 * with an image (a JSON body naming one in a registry, or an uploaded image archive) and of
 * `PATCH /v1/templates/{name}`, used by `client.templates` ({@link Templates}). Each builder
 * checks its arguments and does no I/O, except {@link openArchive}, which reads the local
 * files to upload.
 */
import { open, stat } from "node:fs/promises";

import { packDirectory } from "./context.js";
import { InvalidRequest } from "./errors.js";
import type { ServiceSpec } from "./models.js";

/** What `isolation` of {@link TemplateChanges} may be (`auto`: the server's choice). */
export const ISOLATIONS = ["auto", "ns", "vm"] as const;

/** Sandbox defaults an image build gives its template (a create that names none gets them). */
export interface ImageResources {
  /** CPUs its sandboxes get. */
  cpus?: number;
  /** Their memory limit, MiB. */
  memoryMib?: number;
  /** Their writable disk, MiB. */
  diskMib?: number;
}

/** Options of {@link Templates.buildFromImage}. */
export interface ImageBuildOptions extends ImageResources {
  /** `USER:PASSWORD` for the image's registry. */
  registryAuth?: string;
  /** Registries (`host:port`) to speak plain HTTP to. */
  insecureRegistries?: string[];
  /** The template's start command and ready check. */
  start?: ServiceSpec;
  /** Pull and unpack again even when the template was made from this image. */
  force?: boolean;
}

/** Options of {@link Templates.uploadImage}. */
export interface UploadImageOptions extends ImageResources {
  /**
   * Which image of the archive (a layout's `org.opencontainers.image.ref.name`, an archive's
   * `RepoTags` entry); without it, it must hold exactly one.
   */
  imageTag?: string;
  /** The template's start command and ready check. */
  start?: ServiceSpec;
}

/** What {@link Templates.update} changes: each field given (at least one). */
export interface TemplateChanges {
  /** The new start command and ready check; `null` removes it, undefined keeps it. */
  start?: ServiceSpec | null;
  /** What a create that names no isolation gets. */
  isolation?: (typeof ISOLATIONS)[number];
}

/** @internal A start command as the API takes it, checked (the server checks the rest). */
export function startSpec(start: ServiceSpec): ServiceSpec {
  if (!start || typeof start !== "object" || Array.isArray(start)) {
    throw new InvalidRequest(`start must be an object such as {cmd: "httpd -f", ready: {port: 80}}, got ${JSON.stringify(start)}`);
  }
  const cmd: unknown = start.cmd;
  const ok =
    typeof cmd === "string"
      ? cmd.trim() !== ""
      : Array.isArray(cmd) && cmd.length > 0 && cmd.every((a) => typeof a === "string") && cmd[0] !== "";
  if (!ok) {
    throw new InvalidRequest(`start needs a cmd: a non-empty shell string or argv array, got ${JSON.stringify(cmd)}`);
  }
  return start;
}

/** @internal `USER:PASSWORD` for a registry, checked (the password may contain `:`). */
export function registryCredentials(auth: string | undefined): string | undefined {
  if (auth !== undefined && (typeof auth !== "string" || !auth.includes(":"))) {
    throw new InvalidRequest("registry credentials are USER:PASSWORD");
  }
  return auth;
}

/** @internal Registries to speak plain HTTP to (`host` or `host:port`), checked. */
export function registryHosts(hosts: string[] | undefined): string[] {
  for (const host of hosts ?? []) {
    if (typeof host !== "string" || host === "" || host.includes("/")) {
      throw new InvalidRequest(`an insecure registry is a host or host:port, got ${JSON.stringify(host)}`);
    }
  }
  return hosts ? [...hosts] : [];
}

function resources(opts: ImageResources): Record<string, number> {
  const out: Record<string, number> = {};
  if (opts.cpus !== undefined) out.cpus = opts.cpus;
  if (opts.memoryMib !== undefined) out.memory_mib = opts.memoryMib;
  if (opts.diskMib !== undefined) out.disk_mib = opts.diskMib;
  return out;
}

/** @internal The JSON body of `POST /v1/templates` naming an image in a registry. */
export function imageBuildBody(name: string, fromImage: string, opts: ImageBuildOptions = {}): Record<string, unknown> {
  const body: Record<string, unknown> = { name, from_image: fromImage };
  const auth = registryCredentials(opts.registryAuth);
  if (auth !== undefined) body.registry_auth = auth;
  const hosts = registryHosts(opts.insecureRegistries);
  if (hosts.length > 0) body.insecure_registries = hosts;
  if (opts.start !== undefined) body.start = startSpec(opts.start);
  if (opts.force) body.force = true;
  return { ...body, ...resources(opts) };
}

/** @internal The query of `POST /v1/templates?image_archive=true`. */
export function uploadQuery(name: string, opts: UploadImageOptions = {}): Array<[string, string]> {
  const q: Array<[string, string]> = [
    ["name", name],
    ["image_archive", "true"],
  ];
  if (opts.imageTag !== undefined) {
    if (!opts.imageTag) throw new InvalidRequest("imageTag must not be empty");
    q.push(["image_tag", opts.imageTag]);
  }
  if (opts.start !== undefined) q.push(["start", JSON.stringify(startSpec(opts.start))]);
  for (const [k, v] of Object.entries(resources(opts))) q.push([k, String(v)]);
  return q;
}

/** @internal The body of `PATCH /v1/templates/{name}`. */
export function templatePatch(changes: TemplateChanges): Record<string, unknown> {
  const body: Record<string, unknown> = {};
  if (changes.start !== undefined) body.start = changes.start === null ? null : startSpec(changes.start);
  if (changes.isolation !== undefined) {
    if (!ISOLATIONS.includes(changes.isolation)) {
      throw new RangeError(`isolation must be one of ${ISOLATIONS.join(", ")}, got ${JSON.stringify(changes.isolation)}`);
    }
    body.isolation = changes.isolation;
  }
  if (Object.keys(body).length === 0) throw new TypeError("say what to change: start (null removes it) or isolation");
  return body;
}

const CHUNK = 256 * 1024;

async function* fileChunks(path: string): AsyncGenerator<Uint8Array> {
  const handle = await open(path, "r");
  try {
    for (;;) {
      const piece = new Uint8Array(CHUNK);
      const { bytesRead } = await handle.read(piece, 0, CHUNK, null);
      if (bytesRead === 0) return;
      yield piece.subarray(0, bytesRead);
    }
  } finally {
    await handle.close();
  }
}

/**
 * @internal The image to upload, as a stream: a tarball (`docker save`, or a tar of an OCI
 * image layout, optionally gzip-compressed) as it is, or an OCI image layout directory packed
 * as a tar stream (links as links).
 */
export async function openArchive(archive: string): Promise<AsyncGenerator<Uint8Array>> {
  const st = await stat(archive).catch(() => undefined);
  if (st?.isDirectory()) return (await packDirectory(archive)).stream();
  if (!st?.isFile()) {
    throw new InvalidRequest(`${archive} is neither an image archive file nor an OCI image layout directory`);
  }
  return fileChunks(archive);
}
