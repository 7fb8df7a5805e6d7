import { mapFetchError } from "./client.js";
import { errorFromEvent } from "./errors.js";
import { fileEvent, type FileEvent } from "./models.js";
import { sseEvents, type SseEvent } from "./sse.js";

/** Options of `Files.watch`. */
export interface WatchOptions {
  /** Watch subdirectories too, also those made later (default false). */
  recursive?: boolean;
  /** Give each event its `FileEntry` (size, mode, time) as read when the event was. */
  includeEntry?: boolean;
  /**
   * Called for each event; the watch then reads itself (do not iterate it), and
   * {@link FileWatch.done} settles when it ends.
   */
  onEvent?: (event: FileEvent) => void;
  /** Stops the watch when aborted. */
  signal?: AbortSignal;
}

/** What the server confirmed when it armed a watch. */
export interface WatchReady {
  path: string;
  recursive: boolean;
  watchedDirs: number;
}

/** A warning of a watch: changes may have been missed. */
export interface WatchWarning {
  /** `overflow` (the kernel dropped events) or `watch_limit` (a directory was not watched). */
  code: string;
  message: string;
}

/**
 * A running watch of a sandbox directory (`Files.watch`), armed when it is returned: iterate
 * it with `for await` for {@link FileEvent}s, or pass `onEvent`. Iteration ends when the
 * directory goes away ({@link FileWatch.endReason}); an `error` (the sandbox stopped or was
 * deleted) is thrown. `close()` (or `await using`) ends the watch inside the sandbox.
 */
export class FileWatch implements AsyncIterable<FileEvent>, AsyncDisposable {
  /** Warnings so far. */
  readonly warnings: WatchWarning[] = [];
  /** Why the watch ended, once the directory went away. */
  endReason: string | undefined;
  /** Settles when an `onEvent` watch ends (rejects with its error); resolved otherwise. */
  readonly done: Promise<void>;
  private readonly iter: AsyncGenerator<FileEvent>;

  private constructor(
    /** What the server confirmed when it armed the watch. */
    readonly ready: WatchReady,
    private readonly events: AsyncGenerator<SseEvent>,
    private readonly controller: AbortController,
    url: string,
    onEvent: ((event: FileEvent) => void) | undefined,
  ) {
    const self = this;
    const iter = (async function* () {
      try {
        for await (const ev of events) {
          let doc: Record<string, unknown>;
          try {
            doc = JSON.parse(ev.data) as Record<string, unknown>;
          } catch {
            continue;
          }
          if (ev.event === "event") yield fileEvent(doc);
          else if (ev.event === "warning") {
            self.warnings.push({ code: String(doc.code ?? ""), message: String(doc.message ?? "") });
          } else if (ev.event === "end") {
            self.endReason = String(doc.reason ?? "the watch ended");
            return;
          } else if (ev.event === "error") throw errorFromEvent(doc);
        }
      } catch (e) {
        if (controller.signal.aborted) return;
        throw mapFetchError(e, url);
      }
    })();
    this.iter = iter;
    this.done = onEvent
      ? (async () => {
          for await (const event of iter) onEvent(event);
        })()
      : Promise.resolve();
  }

  /** @internal Read the answer up to its `ready` event. */
  static async open(
    body: ReadableStream<Uint8Array>,
    controller: AbortController,
    url: string,
    onEvent: ((event: FileEvent) => void) | undefined,
  ): Promise<FileWatch> {
    const events = sseEvents(body);
    try {
      for (;;) {
        const next = await events.next();
        if (next.done) throw new Error("the watch ended before it was armed");
        if (next.value.event !== "ready") continue;
        const doc = JSON.parse(next.value.data) as Record<string, unknown>;
        const ready = {
          path: String(doc.path ?? ""),
          recursive: doc.recursive === true,
          watchedDirs: Number(doc.watched_dirs ?? 0),
        };
        return new FileWatch(ready, events, controller, url, onEvent);
      }
    } catch (e) {
      controller.abort();
      await events.return(undefined).catch(() => undefined);
      throw mapFetchError(e, url);
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<FileEvent> {
    return this.iter;
  }

  /** End the watch. */
  async close(): Promise<void> {
    this.controller.abort();
    await this.iter.return(undefined).catch(() => undefined);
    await this.events.return(undefined).catch(() => undefined);
    await this.done.catch(() => undefined);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
