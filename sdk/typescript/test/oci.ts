// Small OCI images made by the tests, offline: an image layout (`oci-layout`, `index.json`,
// `blobs/sha256/…`) with one gzip layer holding this host's static busybox (`/bin/busybox`,
// Debian's `busybox-static`) as `/bin/busybox` with `sh` and `cat` linking to it, and a
// marker file `/from-image`. The tars are the SDK's own (`packDirectory`).
import { createHash } from "node:crypto";
import { chmodSync, copyFileSync, lutimesSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { gzipSync } from "node:zlib";

import { packDirectory } from "../src/index.js";

const digest = (data: Uint8Array): string => `sha256:${createHash("sha256").update(data).digest("hex")}`;

/** The tar stream of all of `dir`, as the SDK packs it. */
export async function tarOf(dir: string): Promise<Buffer> {
  const chunks: Uint8Array[] = [];
  for await (const c of (await packDirectory(dir)).stream()) chunks.push(c);
  return Buffer.concat(chunks);
}

/**
 * Write the image as an OCI layout at `layout`, its index naming it `tag`; resolves to the
 * layer blob's size and digest (what the build's `progress` lines count).
 */
export async function writeLayout(layout: string, marker: string, tag = "1"): Promise<{ size: number; digest: string }> {
  const root = mkdtempSync("/tmp/hutch-ts-layer-");
  let layer: Buffer;
  try {
    mkdirSync(join(root, "bin"));
    copyFileSync("/bin/busybox", join(root, "bin", "busybox"));
    chmodSync(join(root, "bin", "busybox"), 0o755);
    symlinkSync("busybox", join(root, "bin", "sh"));
    symlinkSync("busybox", join(root, "bin", "cat"));
    writeFileSync(join(root, "from-image"), marker);
    // Fixed times: the same image is the same blobs, which the server keeps (by digest).
    for (const f of ["bin/busybox", "from-image", "bin"]) utimesSync(join(root, f), 0, 0);
    for (const l of ["bin/sh", "bin/cat"]) lutimesSync(join(root, l), 0, 0);
    layer = await tarOf(root);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
  const blobs = join(layout, "blobs", "sha256");
  mkdirSync(blobs, { recursive: true });
  const put = (data: Uint8Array): { digest: string; size: number } => {
    const d = digest(data);
    writeFileSync(join(blobs, d.slice("sha256:".length)), data);
    return { digest: d, size: data.length };
  };
  const blob = gzipSync(layer);
  const config = {
    architecture: "amd64",
    os: "linux",
    config: { Env: ["PATH=/bin"], Cmd: ["/bin/sh"] },
    rootfs: { type: "layers", diff_ids: [digest(layer)] },
  };
  const layerDescriptor = { mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", ...put(blob) };
  const manifest = {
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: { mediaType: "application/vnd.oci.image.config.v1+json", ...put(Buffer.from(JSON.stringify(config))) },
    layers: [layerDescriptor],
  };
  const top = {
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    ...put(Buffer.from(JSON.stringify(manifest))),
    annotations: { "org.opencontainers.image.ref.name": tag },
  };
  writeFileSync(join(layout, "index.json"), JSON.stringify({ schemaVersion: 2, manifests: [top] }));
  writeFileSync(join(layout, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
  return { size: layerDescriptor.size, digest: layerDescriptor.digest };
}
