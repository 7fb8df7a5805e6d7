// The Node.js side of the kernel driver's `javascript` contexts (see driver.py's
// NodeKernel): reads cells as JSON lines on stdin, writes events as JSON lines to the fd
// given as its last argument. The host hands it to the driver as NODE_BOOT.
const fs = require('fs'), vm = require('vm'), util = require('util'), readline = require('readline');
const ctl = Number(process.argv[process.argv.length - 1]);
const send = (event) => fs.writeSync(ctl, JSON.stringify(event) + '\n');
const line = (...args) => util.formatWithOptions({ colors: false }, ...args) + '\n';
const quiet = new console.Console({ stdout: process.stdout, stderr: process.stderr });
globalThis.require = require;
globalThis.console = Object.assign(Object.create(quiet), {
  log: (...a) => send({ type: 'stdout', text: line(...a) }),
  info: (...a) => send({ type: 'stdout', text: line(...a) }),
  debug: (...a) => send({ type: 'stdout', text: line(...a) }),
  warn: (...a) => send({ type: 'stderr', text: line(...a) }),
  error: (...a) => send({ type: 'stderr', text: line(...a) }),
});
const rl = readline.createInterface({ input: process.stdin });
let busy = Promise.resolve();
rl.on('line', (text) => { busy = busy.then(() => run(JSON.parse(text))); });
async function run(cell) {
  const env = cell.env || {}, saved = {};
  for (const k of Object.keys(env)) { saved[k] = process.env[k]; process.env[k] = env[k]; }
  const timeout = cell.timeout_ms || undefined;
  try {
    let value = vm.runInThisContext(cell.code, { filename: `cell${cell.count}.js`, timeout, breakOnSigint: true });
    if (value && typeof value.then === 'function') {
      let timer;
      const late = new Promise((_, reject) => {
        if (timeout) timer = setTimeout(() => reject(Object.assign(new Error('timeout'), { code: 'ERR_SCRIPT_EXECUTION_TIMEOUT' })), timeout);
      });
      try { value = await Promise.race([value, late]); } finally { clearTimeout(timer); }
    }
    if (value !== undefined) {
      send({ type: 'result', text: util.inspect(value, { colors: false }) });
    }
  } catch (err) {
    const e = err instanceof Error ? err : new Error(String(err));
    if (e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT' || e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') {
      send({ type: 'timeout' });
    } else {
      send({ type: 'error', name: e.name || 'Error', value: e.message || String(err), traceback: String(e.stack || '').split('\n') });
    }
  } finally {
    for (const k of Object.keys(saved)) {
      if (saved[k] === undefined) delete process.env[k]; else process.env[k] = saved[k];
    }
    send({ type: 'done' });
  }
}
