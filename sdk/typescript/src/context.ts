/**
 * A Dockerfile build's context, packed for `POST /v1/templates`: the context directory as a
 * tar stream made as it is sent, without what its `.dockerignore` excludes (the server
 * applies the same rules again), the Dockerfile and `.dockerignore` always in it, and a
 * Dockerfile from outside the context as the extra entry {@link OUTSIDE_DOCKERFILE}.
 * Symlinks are sent as links, never followed; FIFOs, sockets and devices are left out.
 * {@link packDirectory} packs a whole directory alike (an OCI image layout to upload).
 *
 * The tar format is GNU's (what the server's reader takes): ustar headers, with `L`/`K`
 * entries for names and link targets over 100 bytes.
 */
import { lstat, open, readFile, readdir, readlink, realpath, stat } from "node:fs/promises";
import { isAbsolute, join, relative, sep } from "node:path";

import { InvalidRequest } from "./errors.js";

/** The context entry a Dockerfile from outside the context is sent as. */
export const OUTSIDE_DOCKERFILE = ".hutch-dockerfile";

const BLOCK = 512;
const CHUNK = 256 * 1024;
const MAX_DOCKERFILE = 1 << 20;
/** Largest file the 11 octal digits of a ustar size hold. */
const MAX_FILE = 8 ** 11 - 1;

interface Rule {
  pattern: string;
  exception: boolean;
  regex: RegExp;
}

/** `path.Clean` of Go, for `/`-separated paths. */
function clean(path: string): string {
  const rooted = path.startsWith("/");
  const out: string[] = [];
  for (const part of path.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") {
      if (out.length > 0 && out[out.length - 1] !== "..") out.pop();
      else if (!rooted) out.push("..");
      continue;
    }
    out.push(part);
  }
  const joined = out.join("/");
  return rooted ? `/${joined}` : joined || ".";
}

const escapeRegex = (c: string): string => c.replace(/[.*+?^${}()|[\]\\/-]/g, "\\$&");

/** Go's `filepath.Match` syntax plus `**`, as Docker's `.dockerignore` matcher reads it. */
function globRegex(pattern: string): RegExp {
  let out = "";
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === "*") {
      if (pattern[i + 1] === "*") {
        i++;
        if (pattern[i + 1] === "/") {
          i++;
          out += "(?:.*/)?";
        } else {
          out += ".*";
        }
      } else {
        out += "[^/]*";
      }
    } else if (c === "?") {
      out += "[^/]";
    } else if (c === "[") {
      const negated = pattern[i + 1] === "!" || pattern[i + 1] === "^";
      const end = pattern.indexOf("]", i + (negated ? 2 : 1));
      if (end < 0) throw new Error(`bad pattern \`${pattern}\`: unterminated [`);
      let body = pattern.slice(i + 1, end);
      if (negated) body = "^" + body.slice(1);
      out += `[${body.replace(/\\/g, "\\\\")}]`;
      i = end;
    } else if (c === "\\" && i + 1 < pattern.length) {
      i++;
      out += escapeRegex(pattern[i]!);
    } else {
      out += escapeRegex(c);
    }
  }
  return new RegExp(`^${out}$`);
}

/**
 * The rules of a `.dockerignore` file: a path is excluded when the last rule matching it
 * (or one of its parent directories) is not an exception (`!pattern`).
 */
export class DockerIgnore {
  private constructor(private readonly rules: Rule[]) {}

  /** No rules: nothing is excluded. */
  static none(): DockerIgnore {
    return new DockerIgnore([]);
  }

  /** Read a `.dockerignore` file's text (`#` comments, blank lines, `!` exceptions). */
  static parse(text: string): DockerIgnore {
    const rules: Rule[] = [];
    const lines = text.replace(/^\ufeff/, "").split(/\r?\n/);
    lines.forEach((raw, index) => {
      if (raw.startsWith("#")) return;
      let pattern = raw.trim();
      if (!pattern) return;
      const exception = pattern.startsWith("!");
      if (exception) {
        pattern = pattern.slice(1).trim();
        if (!pattern) throw new InvalidRequest(`.dockerignore line ${index + 1}: \`!\` needs a pattern after it`);
      }
      let cleaned = clean(pattern);
      if (cleaned.length > 1 && cleaned.startsWith("/")) cleaned = cleaned.replace(/^\/+/, "");
      let regex: RegExp;
      try {
        regex = globRegex(cleaned);
      } catch (e) {
        throw new InvalidRequest(`.dockerignore line ${index + 1}: ${(e as Error).message}`);
      }
      rules.push({ pattern: cleaned, exception, regex });
    });
    return new DockerIgnore(rules);
  }

  /** Whether `path` (relative to the context, `/`-separated) is left out. */
  excludes(path: string): boolean {
    const p = clean(path);
    if (p === "." || this.rules.length === 0) return false;
    const parts = p.split("/");
    const candidates = parts.map((_, k) => parts.slice(0, k + 1).join("/"));
    let excluded = false;
    for (const rule of this.rules) {
      if (rule.exception !== excluded) continue;
      if (candidates.some((c) => rule.regex.test(c))) excluded = !rule.exception;
    }
    return excluded;
  }

  /** Whether an exception could bring back something below the excluded `dir` (errs on the side of walking it). */
  mayIncludeBelow(dir: string): boolean {
    const prefix = clean(dir) + "/";
    return this.rules.some((rule) => {
      if (!rule.exception) return false;
      const literal = rule.pattern.split(/[*?[\\]/, 1)[0] ?? "";
      return literal === "" || literal.startsWith(prefix) || prefix.startsWith(literal);
    });
  }
}

/** What the walk does with one entry. */
type Choice = "include" | "skip" | "enter";

/** @internal */
export function choose(
  path: string,
  isDir: boolean,
  dockerfile: string,
  outside: boolean,
  ignore: DockerIgnore,
): Choice {
  if (outside && path === OUTSIDE_DOCKERFILE) return "skip";
  if (path === dockerfile || path === ".dockerignore" || !ignore.excludes(path)) return "include";
  if (isDir && (dockerfile.startsWith(path + "/") || ignore.mayIncludeBelow(path))) return "enter";
  return "skip";
}

const encoder = new TextEncoder();

function octal(buf: Uint8Array, offset: number, width: number, value: number): void {
  const text = Math.floor(value).toString(8).padStart(width - 1, "0");
  buf.set(encoder.encode(text.slice(-(width - 1))), offset);
  buf[offset + width - 1] = 0;
}

interface Header {
  name: Uint8Array;
  type: string;
  mode: number;
  uid: number;
  gid: number;
  size: number;
  mtime: number;
  link?: Uint8Array;
}

/** One ustar header block (GNU magic); names and links must fit (see {@link headers}). */
function headerBlock(h: Header): Uint8Array {
  const b = new Uint8Array(BLOCK);
  b.set(h.name.subarray(0, 100), 0);
  octal(b, 100, 8, h.mode & 0o7777);
  octal(b, 108, 8, h.uid);
  octal(b, 116, 8, h.gid);
  octal(b, 124, 12, h.size);
  octal(b, 136, 12, h.mtime);
  b.fill(0x20, 148, 156);
  b[156] = h.type.charCodeAt(0);
  if (h.link) b.set(h.link.subarray(0, 100), 157);
  b.set(encoder.encode("ustar  "), 257);
  let sum = 0;
  for (const x of b) sum += x;
  const text = sum.toString(8).padStart(6, "0");
  b.set(encoder.encode(text), 148);
  b[154] = 0;
  b[155] = 0x20;
  return b;
}

function padding(size: number): Uint8Array {
  return new Uint8Array((BLOCK - (size % BLOCK)) % BLOCK);
}

/** The header blocks of an entry: GNU `L` / `K` entries first for a long name or link. */
function headers(h: Header): Uint8Array[] {
  const out: Uint8Array[] = [];
  const long = (type: string, data: Uint8Array) => {
    const withNul = new Uint8Array(data.length + 1);
    withNul.set(data);
    out.push(
      headerBlock({ name: encoder.encode("././@LongLink"), type, mode: 0, uid: 0, gid: 0, size: withNul.length, mtime: 0 }),
      withNul,
      padding(withNul.length),
    );
  };
  if (h.link && h.link.length > 100) long("K", h.link);
  if (h.name.length > 100) long("L", h.name);
  out.push(headerBlock(h));
  return out;
}

/** A packed context: the Dockerfile's path in it, and its tar stream, made as it is read. */
export interface PackedContext {
  dockerfile: string;
  stream(): AsyncGenerator<Uint8Array>;
}

async function dockerfileIn(root: string, dockerfile: string): Promise<{ inContext: string; outside?: Uint8Array }> {
  const given = isAbsolute(dockerfile) ? dockerfile : join(root, dockerfile);
  let real: string;
  try {
    real = await realpath(given);
    if (!(await stat(real)).isFile()) throw new Error("not a file");
  } catch {
    throw new InvalidRequest(`no Dockerfile at ${given}`);
  }
  const rel = relative(root, real);
  if (rel !== ".." && !rel.startsWith(".." + sep) && !isAbsolute(rel)) {
    return { inContext: rel.split(sep).join("/") };
  }
  if ((await stat(real)).size > MAX_DOCKERFILE) {
    throw new InvalidRequest(`the Dockerfile ${given} is larger than ${MAX_DOCKERFILE} bytes`);
  }
  return { inContext: OUTSIDE_DOCKERFILE, outside: new Uint8Array(await readFile(real)) };
}

/** What {@link walk} packs: the tree under `root`, filtered by {@link choose}. */
interface Tree {
  root: string;
  /** The Dockerfile's path in the context (empty for a directory packed whole). */
  dockerfile: string;
  /** Whether a Dockerfile from outside the context comes as {@link OUTSIDE_DOCKERFILE}. */
  outside: boolean;
  ignore: DockerIgnore;
}

type Stat = { mode: number; uid: number; gid: number; mtime: number };

async function* walk(tree: Tree, prefix: string): AsyncGenerator<Uint8Array> {
  const dir = prefix ? join(tree.root, prefix) : tree.root;
  const names = (await readdir(dir)).sort();
  for (const name of names) {
    const rel = prefix ? `${prefix}/${name}` : name;
    const full = join(dir, name);
    let st;
    try {
      st = await lstat(full);
    } catch {
      continue; // gone since it was listed
    }
    const choice = choose(rel, st.isDirectory(), tree.dockerfile, tree.outside, tree.ignore);
    if (choice === "skip") continue;
    const base = { mode: st.mode, uid: st.uid, gid: st.gid, mtime: st.mtimeMs / 1000 };
    if (st.isDirectory()) {
      if (choice === "include") yield* headers({ ...base, name: encoder.encode(rel + "/"), type: "5", size: 0 });
      yield* walk(tree, rel);
    } else if (choice !== "include") {
      continue;
    } else if (st.isSymbolicLink()) {
      const link = encoder.encode(await readlink(full));
      yield* headers({ ...base, name: encoder.encode(rel), type: "2", size: 0, link });
    } else if (st.isFile()) {
      yield* fileEntry(full, rel, base);
    }
    // FIFOs, sockets and devices are left out.
  }
}

async function* fileEntry(full: string, rel: string, base: Stat): AsyncGenerator<Uint8Array> {
  let handle;
  try {
    handle = await open(full, "r");
  } catch {
    return; // gone, or replaced since it was listed
  }
  try {
    const size = (await handle.stat()).size;
    if (size > MAX_FILE) throw new InvalidRequest(`${rel} is larger than ${MAX_FILE} bytes`);
    yield* headers({ ...base, name: encoder.encode(rel), type: "0", size });
    let left = size;
    while (left > 0) {
      const piece = new Uint8Array(Math.min(CHUNK, left));
      const { bytesRead } = await handle.read(piece, 0, piece.length, size - left);
      // A file that shrank is padded with zeros to the size in its header.
      left -= bytesRead === 0 ? piece.length : bytesRead;
      yield bytesRead === 0 ? piece : piece.subarray(0, bytesRead);
    }
    yield padding(size);
  } finally {
    await handle.close();
  }
}

/**
 * Pack `contextDir`. `dockerfile`: a path in the context (default `Dockerfile`) or an
 * absolute path anywhere.
 */
export async function packContext(contextDir: string, dockerfile = "Dockerfile"): Promise<PackedContext> {
  let root: string;
  try {
    root = await realpath(contextDir);
    if (!(await stat(root)).isDirectory()) throw new Error("not a directory");
  } catch {
    throw new InvalidRequest(`the build context ${contextDir} is not a directory`);
  }
  const { inContext, outside } = await dockerfileIn(root, dockerfile);
  let ignore = DockerIgnore.none();
  try {
    ignore = DockerIgnore.parse(await readFile(join(root, ".dockerignore"), "utf8"));
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
  }
  const tree: Tree = { root, dockerfile: inContext, outside: outside !== undefined, ignore };
  return {
    dockerfile: inContext,
    async *stream() {
      if (outside !== undefined) {
        yield* headers({ name: encoder.encode(OUTSIDE_DOCKERFILE), type: "0", mode: 0o644, uid: 0, gid: 0, size: outside.length, mtime: 0 });
        yield outside;
        yield padding(outside.length);
      }
      yield* walk(tree, "");
      yield new Uint8Array(2 * BLOCK);
    },
  };
}

/**
 * Pack all of `directory` (an OCI image layout to upload, say) as a build context is packed,
 * without a Dockerfile or `.dockerignore` rules: links as links, FIFOs, sockets and devices
 * left out. Its `dockerfile` is empty.
 */
export async function packDirectory(directory: string): Promise<PackedContext> {
  let root: string;
  try {
    root = await realpath(directory);
    if (!(await stat(root)).isDirectory()) throw new Error("not a directory");
  } catch {
    throw new InvalidRequest(`${directory} is not a directory`);
  }
  const tree: Tree = { root, dockerfile: "", outside: false, ignore: DockerIgnore.none() };
  return {
    dockerfile: "",
    async *stream() {
      yield* walk(tree, "");
      yield new Uint8Array(2 * BLOCK);
    },
  };
}
