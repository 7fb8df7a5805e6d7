// Start a real `hutch serve` for a test file (no mocks): ephemeral port, temporary state
// directory, the `minimal` template. `stop()` deletes every sandbox through the API, sends
// SIGTERM to the server, waits for it, and removes the state directory unless something is
// still mounted under it.
import { spawn, type ChildProcess } from "node:child_process";
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

// build/test/harness.js → the repository root is five levels up.
const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..");

export interface TestServer {
  url: string;
  key: string;
  stateDir: string;
  /** Every sandbox id on the server, read without the SDK. */
  sandboxIds(): Promise<string[]>;
  stop(): Promise<void>;
}

function mountedUnder(path: string): string[] {
  const prefix = path.replace(/\/+$/, "");
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .map((l) => l.split(" ")[4])
    .filter((m): m is string => !!m)
    .map((m) => m.replace(/\\040/g, " "))
    .filter((m) => m === prefix || m.startsWith(prefix + "/"));
}

export async function startServer(): Promise<TestServer> {
  const binary = process.env.HUTCH_BIN ?? join(REPO, "target", "debug", "hutch");
  if (!existsSync(binary)) throw new Error(`${binary} is missing: run \`cargo build -p hutch\` first`);
  const templates = process.env.HUTCH_TEST_TEMPLATES ?? "/var/cache/hutch-test/templates";
  const stateDir = mkdtempSync("/tmp/hutch-sdk-ts-");
  chmodSync(stateDir, 0o755);
  const env: NodeJS.ProcessEnv = { ...process.env, HUTCH_LOG: "warn" };
  delete env.HUTCH_API_KEY;
  const proc: ChildProcess = spawn(
    binary,
    [
      "serve",
      "--listen",
      "127.0.0.1:0",
      // Browser links on the API origin: `*.localhost` preview hosts resolve in browsers,
      // not in Node (the Rust tests cover the preview origin with Chromium).
      "--preview-listen",
      "off",
      "--network",
      "off",
      "--state-dir",
      stateDir,
      "--templates-dir",
      templates,
      "--no-build-base",
      "--default-template",
      "minimal",
      // Usage metered every half second, so usage tests see it soon.
      "--usage-interval-seconds",
      "0.5",
    ],
    { env, stdio: ["ignore", "pipe", "pipe"] },
  );
  let stderr = "";
  proc.stderr!.on("data", (c: Buffer) => {
    stderr = (stderr + c.toString()).slice(-8000);
  });
  const exited = new Promise<void>((res) => proc.once("exit", () => res()));
  const url = await new Promise<string>((res, rej) => {
    const timer = setTimeout(() => rej(new Error(`hutch serve did not start:\n${stderr}`)), 60_000);
    const rl = createInterface({ input: proc.stdout! });
    rl.on("line", (line) => {
      const m = /^hutch listening on (\S+)/.exec(line);
      if (m) {
        clearTimeout(timer);
        res(m[1]!);
      }
    });
    proc.once("exit", (code) => {
      clearTimeout(timer);
      rej(new Error(`hutch serve exited with ${code}:\n${stderr}`));
    });
  });
  const key = readFileSync(join(stateDir, "admin.key"), "utf8").trim();
  const auth = { authorization: `Bearer ${key}` };

  async function sandboxIds(): Promise<string[]> {
    const r = await fetch(`${url}/v1/sandboxes`, { headers: auth });
    if (!r.ok) throw new Error(`list failed: ${r.status}`);
    const doc = (await r.json()) as { sandboxes: Array<{ id: string }> };
    return doc.sandboxes.map((s) => s.id);
  }

  async function stop(): Promise<void> {
    if (proc.exitCode === null) {
      try {
        for (const id of await sandboxIds()) {
          await fetch(`${url}/v1/sandboxes/${id}`, { method: "DELETE", headers: auth });
        }
      } catch (e) {
        console.error("teardown: could not delete sandboxes:", e);
      }
      proc.kill("SIGTERM");
      const timer = setTimeout(() => proc.kill("SIGKILL"), 30_000);
      await exited;
      clearTimeout(timer);
    }
    const mounts = mountedUnder(stateDir);
    if (mounts.length > 0) console.error(`teardown: leaving ${stateDir}: still mounted:`, mounts);
    else rmSync(stateDir, { recursive: true, force: true });
  }

  return { url, key, stateDir, sandboxIds, stop };
}
