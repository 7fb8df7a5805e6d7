import "./polyfill.js";
import WebSocket from "ws";
import { ConnectionError, HutchError, TimeoutError, errorFromResponse } from "./errors.js";

/** Options of `Sandbox.pty()`. */
export interface PtyOptions {
  /**
   * Program to run with its arguments (default: a login shell). The server runs it as
   * `exec <cmd>` under `/bin/sh`, so give one command; wrap compound lines as `sh -c '…; …'`.
   */
  cmd?: string;
  /** Terminal width (default 80). */
  cols?: number;
  /** Terminal height (default 24). */
  rows?: number;
  /** User to run as. */
  user?: string;
  /** Working directory. */
  cwd?: string;
  /** Milliseconds allowed for the handshake (default 10000). */
  openTimeoutMs?: number;
}

function toBytes(data: string | Uint8Array): Uint8Array {
  return typeof data === "string" ? new TextEncoder().encode(data) : data;
}

function indexOf(haystack: Uint8Array, needle: Uint8Array): number {
  return Buffer.from(haystack.buffer, haystack.byteOffset, haystack.byteLength).indexOf(
    Buffer.from(needle.buffer, needle.byteOffset, needle.byteLength),
  );
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a, 0);
  out.set(b, a.length);
  return out;
}

/**
 * An interactive terminal in a sandbox (from `sandbox.pty()`). `read` returns raw terminal
 * bytes (with echo, prompts and escape sequences); `send` types into it.
 *
 * ```ts
 * await using term = await sb.pty();
 * term.send("echo hi-$((1+1))\n");
 * await term.readUntil("hi-2");
 * ```
 */
export class PtySession implements AsyncDisposable {
  private readonly queue: Uint8Array[] = [];
  private pending: Uint8Array = new Uint8Array(0);
  private waiters: Array<() => void> = [];
  private done = false;
  private closedPromise: Promise<void>;
  /** The program's exit status, once it has exited. */
  exitCode: number | undefined;
  /** The server's message if the session failed. */
  error: string | undefined;

  private constructor(private readonly ws: WebSocket) {
    ws.on("message", (data: WebSocket.RawData, isBinary: boolean) => {
      const buf = Array.isArray(data)
        ? Buffer.concat(data)
        : data instanceof ArrayBuffer
          ? Buffer.from(data)
          : data;
      if (isBinary) {
        this.queue.push(new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength));
      } else {
        try {
          const ctl = JSON.parse(buf.toString("utf8")) as { type?: string; exit_code?: number; message?: string };
          if (ctl.type === "exit") this.exitCode = typeof ctl.exit_code === "number" ? ctl.exit_code : -1;
          else if (ctl.type === "error") this.error = ctl.message ?? "terminal session failed";
        } catch {
          // not a control message
        }
      }
      this.wake();
    });
    this.closedPromise = new Promise((resolve) => {
      ws.on("close", () => {
        this.done = true;
        this.wake();
        resolve();
      });
    });
    ws.on("error", () => {
      // 'close' follows; reads then report the end of the session.
    });
  }

  /** @internal Open the WebSocket and wait for the handshake. */
  static async open(url: string, headers: Record<string, string>, openTimeoutMs = 10_000): Promise<PtySession> {
    const ws = new WebSocket(url, { headers, handshakeTimeout: openTimeoutMs, maxPayload: 16 * 1024 * 1024 });
    // Listen before the handshake completes: `ws` parses frames that arrive in the same TCP
    // segment as the 101 answer (a command that printed and exited at once) before it emits
    // 'open', and a listener attached after 'open' never sees them.
    const session = new PtySession(ws);
    await new Promise<void>((resolve, reject) => {
      let settled = false;
      const settle = (err?: unknown) => {
        if (settled) return;
        settled = true;
        if (err) reject(err);
        else resolve();
      };
      ws.once("open", () => settle());
      ws.once("unexpected-response", (req, res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          settle(errorFromResponse(res.statusCode ?? 0, Buffer.concat(chunks).toString("utf8")));
          req.destroy();
        });
        res.on("error", (e) => settle(new ConnectionError(`terminal handshake failed: ${e.message}`, { cause: e })));
      });
      ws.on("error", (e: Error) => {
        if (/timeout/i.test(e.message)) settle(new TimeoutError(`opening the terminal timed out`, { cause: e }));
        else settle(new ConnectionError(`could not open the terminal: ${e.message}`, { cause: e }));
      });
    });
    return session;
  }

  private wake(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  /** True once the program exited or the socket closed. */
  get closed(): boolean {
    return this.done;
  }

  /** Type `data` (text is sent as UTF-8). */
  send(data: string | Uint8Array): void {
    this.ws.send(toBytes(data), { binary: true });
  }

  /** Change the terminal size. */
  resize(cols: number, rows: number): void {
    this.ws.send(JSON.stringify({ type: "resize", cols, rows }));
  }

  private async next(timeoutMs: number | undefined): Promise<Uint8Array> {
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    for (;;) {
      const chunk = this.queue.shift();
      if (chunk) return chunk;
      if (this.done) return new Uint8Array(0);
      const left = deadline === undefined ? undefined : deadline - Date.now();
      if (left !== undefined && left <= 0) throw new TimeoutError("no terminal output in time");
      await new Promise<void>((resolve) => {
        let timer: NodeJS.Timeout | undefined;
        const wake = () => {
          clearTimeout(timer);
          resolve();
        };
        this.waiters.push(wake);
        if (left !== undefined) timer = setTimeout(wake, left);
      });
    }
  }

  /**
   * The next chunk of output; an empty array once the program has exited.
   * @param timeoutMs Wait at most this long (default: forever); then throws {@link TimeoutError}.
   */
  async read(timeoutMs?: number): Promise<Uint8Array> {
    if (this.pending.length > 0) {
      const out = this.pending;
      this.pending = new Uint8Array(0);
      return out;
    }
    return this.next(timeoutMs);
  }

  /**
   * Read until `pattern` appears; resolves to everything up to and including it. Output after
   * the pattern is kept for the next read.
   * @throws {@link TimeoutError} when it does not appear within `timeoutMs` (default 10000).
   * @throws {@link HutchError} when the program exits first.
   */
  async readUntil(pattern: string | Uint8Array, timeoutMs = 10_000): Promise<Uint8Array> {
    const needle = toBytes(pattern);
    const deadline = Date.now() + timeoutMs;
    let buf = this.pending;
    this.pending = new Uint8Array(0);
    while (indexOf(buf, needle) < 0) {
      let chunk: Uint8Array;
      try {
        chunk = await this.next(Math.max(0, deadline - Date.now()));
      } catch (e) {
        this.pending = buf;
        if (e instanceof TimeoutError) {
          throw new TimeoutError(`${JSON.stringify(String(pattern))} did not appear in the terminal in time`);
        }
        throw e;
      }
      if (chunk.length === 0) {
        this.pending = buf;
        throw new HutchError(
          `the terminal closed (exit code ${this.exitCode}) before ${JSON.stringify(String(pattern))} appeared`,
        );
      }
      buf = concat(buf, chunk);
    }
    const end = indexOf(buf, needle) + needle.length;
    this.pending = buf.slice(end);
    return buf.slice(0, end);
  }

  /** Discard output until the program exits; resolves to its exit code. */
  async wait(timeoutMs?: number): Promise<number | undefined> {
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    this.pending = new Uint8Array(0);
    while (!this.done) {
      this.queue.length = 0;
      await this.next(deadline === undefined ? undefined : Math.max(0, deadline - Date.now()));
    }
    return this.exitCode;
  }

  /** Close the terminal; the program is killed if still running. */
  async close(): Promise<void> {
    if (this.ws.readyState === WebSocket.CLOSED) return;
    this.ws.close();
    const timer = setTimeout(() => this.ws.terminate(), 2_000);
    await this.closedPromise;
    clearTimeout(timer);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
