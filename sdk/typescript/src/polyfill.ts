// `Symbol.asyncDispose` / `Symbol.dispose` exist from Node 20.4 (and 18.18); define them on
// older runtimes so `await using` works wherever the SDK loads.
const S = Symbol as unknown as { asyncDispose?: symbol; dispose?: symbol };
S.asyncDispose ??= Symbol.for("Symbol.asyncDispose");
S.dispose ??= Symbol.for("Symbol.dispose");

export {};
