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
// Cells as a notebook user writes them (what Node's own REPL does, with acorn from Debian's
// node-acorn, which nodejs brings): top-level `let`, `const` and `class` declare globals a
// later cell may declare again, and a cell with a top-level `await` runs in an async
// function whose declarations are hoisted to globals and whose last expression is its
// result. Without acorn, or for code acorn cannot parse (V8 then reports the error), a
// cell runs as it is.
const acorn = (() => {
  for (const path of ['/usr/share/nodejs/acorn', 'acorn']) {
    try { return require(path); } catch { /* try the next */ }
  }
  return null;
})();

/** Names a declaration pattern binds. */
function boundNames(pattern, out) {
  switch (pattern.type) {
    case 'Identifier': out.push(pattern.name); break;
    case 'ObjectPattern':
      for (const p of pattern.properties) boundNames(p.type === 'RestElement' ? p.argument : p.value, out);
      break;
    case 'ArrayPattern': for (const e of pattern.elements) if (e) boundNames(e, out); break;
    case 'RestElement': boundNames(pattern.argument, out); break;
    case 'AssignmentPattern': boundNames(pattern.left, out); break;
  }
  return out;
}

/** Whether `node` has an `await` (or `for await`) outside any function of its own. */
function awaitsAtTop(node) {
  if (!node || typeof node.type !== 'string') return false;
  if (node.type === 'AwaitExpression' || (node.type === 'ForOfStatement' && node.await)) return true;
  if (/Function/.test(node.type)) return false;
  for (const key of Object.keys(node)) {
    const v = node[key];
    if (Array.isArray(v)) { if (v.some((c) => c && typeof c.type === 'string' && awaitsAtTop(c))) return true; }
    else if (v && typeof v.type === 'string' && awaitsAtTop(v)) return true;
  }
  return false;
}

/** The source to run for cell `code`. */
function prepareCell(code) {
  if (!acorn) return code;
  let ast;
  try {
    ast = acorn.parse(code, { ecmaVersion: 'latest', sourceType: 'script', allowAwaitOutsideFunction: true, allowHashBang: true });
  } catch { return code; }
  const edits = []; // [start, end, text], applied from the end
  const src = (n) => code.slice(n.start, n.end);
  if (!ast.body.some(awaitsAtTop)) {
    for (const node of ast.body) {
      if (node.type === 'VariableDeclaration' && node.kind !== 'var') {
        edits.push([node.start, node.start + node.kind.length, 'var']);
      } else if (node.type === 'ClassDeclaration') {
        edits.push([node.start, node.start, `var ${node.id.name} = `], [node.end, node.end, ';']);
      }
    }
    return apply(code, edits);
  }
  const hoisted = [];
  ast.body.forEach((node, i) => {
    if (node.type === 'VariableDeclaration') {
      const parts = [];
      for (const d of node.declarations) {
        boundNames(d.id, hoisted);
        parts.push(`(${src(d.id)} = ${d.init ? src(d.init) : 'undefined'})`);
      }
      edits.push([node.start, node.end, `void (${parts.join(', ')});`]);
    } else if (node.type === 'ClassDeclaration') {
      hoisted.push(node.id.name);
      edits.push([node.start, node.start, `${node.id.name} = `], [node.end, node.end, ';']);
    } else if (node.type === 'FunctionDeclaration') {
      hoisted.push(node.id.name);
      edits.push([node.end, node.end, `\nglobalThis[${JSON.stringify(node.id.name)}] = ${node.id.name};`]);
    } else if (i === ast.body.length - 1 && node.type === 'ExpressionStatement') {
      edits.push([node.start, node.end, `return (${src(node.expression)});`]);
    }
  });
  const head = hoisted.length ? `var ${[...new Set(hoisted)].join(', ')};\n` : '';
  return `${head}(async () => {\n${apply(code, edits)}\n})()`;
}

function apply(code, edits) {
  edits.sort((a, b) => b[0] - a[0] || b[1] - a[1]);
  for (const [start, end, text] of edits) code = code.slice(0, start) + text + code.slice(end);
  return code;
}

const rl = readline.createInterface({ input: process.stdin });
let busy = Promise.resolve();
rl.on('line', (text) => { busy = busy.then(() => run(JSON.parse(text))); });
async function run(cell) {
  const env = cell.env || {}, saved = {};
  for (const k of Object.keys(env)) { saved[k] = process.env[k]; process.env[k] = env[k]; }
  const timeout = cell.timeout_ms || undefined;
  try {
    let value = vm.runInThisContext(prepareCell(cell.code), { filename: `cell${cell.count}.js`, timeout, breakOnSigint: true });
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
