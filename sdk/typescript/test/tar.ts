// A small tar reader for the tests (ustar with GNU `L`/`K` entries), to check what the SDK packs.
export interface TarEntry {
  name: string;
  type: string;
  link: string;
  data: string;
}

const field = (b: Buffer, at: number, len: number): string => {
  const raw = b.subarray(at, at + len);
  const end = raw.indexOf(0);
  return raw.subarray(0, end < 0 ? len : end).toString("utf8");
};

export const TarParserForTests = {
  parse(buf: Buffer): TarEntry[] {
    const out: TarEntry[] = [];
    let longName: string | undefined;
    let longLink: string | undefined;
    for (let at = 0; at + 512 <= buf.length; ) {
      const h = buf.subarray(at, at + 512);
      if (h.every((x) => x === 0)) break;
      const size = parseInt(field(h, 124, 12).trim() || "0", 8);
      const type = String.fromCharCode(h[156]!);
      const data = buf.subarray(at + 512, at + 512 + size);
      at += 512 + Math.ceil(size / 512) * 512;
      if (type === "L") longName = field(data, 0, data.length);
      else if (type === "K") longLink = field(data, 0, data.length);
      else {
        out.push({
          name: longName ?? field(h, 0, 100),
          type,
          link: longLink ?? field(h, 157, 100),
          data: data.toString("utf8"),
        });
        longName = longLink = undefined;
      }
    }
    return out;
  },
};
