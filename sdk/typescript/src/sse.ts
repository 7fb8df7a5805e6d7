import { TimeoutError } from "./errors.js";

/** One server-sent event. */
export interface SseEvent {
  event: string;
  data: string;
}

async function readChunk(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  idleTimeoutMs: number | undefined,
): Promise<{ done: boolean; value?: Uint8Array }> {
  if (idleTimeoutMs === undefined) return reader.read();
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(
      () => reject(new TimeoutError(`no event within ${idleTimeoutMs} ms`)),
      idleTimeoutMs,
    );
  });
  try {
    return await Promise.race([reader.read(), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Parse a `text/event-stream` body into events. Comments (keep-alives) are skipped. Breaking
 * out of the loop cancels the body.
 *
 * @param idleTimeoutMs Longest wait for the next chunk; exceeding it throws {@link TimeoutError}.
 */
export async function* sseEvents(
  body: ReadableStream<Uint8Array>,
  idleTimeoutMs?: number,
): AsyncGenerator<SseEvent> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  let event = "";
  let data: string[] = [];
  let finished = false;
  try {
    for (;;) {
      const { value, done } = await readChunk(reader, idleTimeoutMs);
      if (done || !value) {
        finished = true;
        return;
      }
      buf += decoder.decode(value, { stream: true });
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (data.length > 0 || event) {
            const out = { event: event || "message", data: data.join("\n") };
            event = "";
            data = [];
            yield out;
          }
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const name = colon >= 0 ? line.slice(0, colon) : line;
        let val = colon >= 0 ? line.slice(colon + 1) : "";
        if (val.startsWith(" ")) val = val.slice(1);
        if (name === "event") event = val;
        else if (name === "data") data.push(val);
      }
    }
  } finally {
    if (!finished) await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}
