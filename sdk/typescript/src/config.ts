import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

/** Address of a local `hutch serve` with its default `--listen`. */
export const DEFAULT_URL = "http://127.0.0.1:7700";

/**
 * The server's state directory, as `hutch serve` chooses it: `$HUTCH_STATE_DIR`; else
 * `/var/lib/hutch` when running as root; else `$XDG_DATA_HOME/hutch`
 * (`~/.local/share/hutch` when `XDG_DATA_HOME` is unset).
 */
export function defaultStateDir(): string {
  const env = process.env.HUTCH_STATE_DIR;
  if (env) return env;
  if (typeof process.geteuid === "function" && process.geteuid() === 0) return "/var/lib/hutch";
  const xdg = process.env.XDG_DATA_HOME || join(homedir(), ".local", "share");
  return join(xdg, "hutch");
}

/** Resolved connection settings. */
export interface ResolvedConfig {
  /** Base URL without a trailing slash. */
  url: string;
  /** Bearer key, or undefined when none was found (the server will answer 401). */
  apiKey: string | undefined;
  /** Where the key came from, for error messages. */
  keySource: string;
}

/**
 * Resolve the server URL and API key. The URL is `url`, else `$HUTCH_URL`, else
 * `http://127.0.0.1:7700`. The key is `apiKey`, else `$HUTCH_API_KEY`, else the contents of
 * `<state dir>/admin.key` (`stateDir` or {@link defaultStateDir}).
 */
export function resolveConfig(
  opts: { url?: string; apiKey?: string; stateDir?: string } = {},
): ResolvedConfig {
  const url = (opts.url || process.env.HUTCH_URL || DEFAULT_URL).replace(/\/+$/, "");
  if (opts.apiKey) return { url, apiKey: opts.apiKey, keySource: "the apiKey option" };
  const envKey = process.env.HUTCH_API_KEY;
  if (envKey) return { url, apiKey: envKey.trim(), keySource: "$HUTCH_API_KEY" };
  const keyFile = join(opts.stateDir ?? defaultStateDir(), "admin.key");
  try {
    const key = readFileSync(keyFile, "utf8").trim();
    return { url, apiKey: key || undefined, keySource: keyFile };
  } catch {
    return {
      url,
      apiKey: undefined,
      keySource: `nothing (no apiKey, no $HUTCH_API_KEY, and ${keyFile} is unreadable)`,
    };
  }
}
