// E2B's published JavaScript SDKs against Hutch's E2B-compatible API: create, commands,
// files and runCode, with only E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY set.
// tests/e2b_js.rs runs it; it prints "ok" when every check held.
import assert from 'node:assert/strict'
import { CommandExitError, Sandbox } from 'e2b'
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter'

const sb = await Sandbox.create('base', { timeoutMs: 120_000, metadata: { lang: 'js' }, envs: { WHO: 'js' } })
try {
  const info = await sb.getInfo()
  assert.deepEqual(info.metadata, { lang: 'js' })
  const r = await sb.commands.run('echo "hi from $WHO"; echo e >&2')
  assert.equal(r.stdout, 'hi from js\n')
  assert.equal(r.stderr, 'e\n')
  await assert.rejects(sb.commands.run('exit 4'), (e) => e instanceof CommandExitError && e.exitCode === 4)
  const chunks = []
  await sb.commands.run('echo a; echo b', { onStdout: (d) => chunks.push(d) })
  assert.equal(chunks.join(''), 'a\nb\n')
  await sb.files.write('/tmp/js/one.txt', 'written by js')
  assert.equal(await sb.files.read('/tmp/js/one.txt'), 'written by js')
  const bytes = new Uint8Array([0, 1, 2, 250, 255])
  await sb.files.write('/tmp/js/two.bin', bytes.buffer)
  assert.deepEqual(new Uint8Array(await sb.files.read('/tmp/js/two.bin', { format: 'bytes' })), bytes)
  assert.deepEqual((await sb.files.list('/tmp/js')).map((e) => e.name).sort(), ['one.txt', 'two.bin'])
  assert.equal(await sb.files.exists('/tmp/js/none'), false)
  await sb.files.rename('/tmp/js/one.txt', '/tmp/js/moved.txt')
  assert.equal(await sb.files.read('/tmp/js/moved.txt'), 'written by js')
  await sb.files.remove('/tmp/js')
  assert.equal(await sb.files.exists('/tmp/js'), false)
  const bg = await sb.commands.run('sleep 60', { background: true })
  assert.ok((await sb.commands.list()).some((p) => p.pid === bg.pid))
  assert.equal(await sb.commands.kill(bg.pid), true)
} finally {
  await sb.kill()
}
assert.equal(await sb.isRunning(), false)

const cs = await CodeSandbox.create({ timeoutMs: 180_000 })
try {
  await cs.runCode('y = 20')
  const ex = await cs.runCode('y * 2 + 2')
  assert.equal(ex.text, '42')
  const err = await cs.runCode('raise ValueError("bad")')
  assert.equal(err.error.name, 'ValueError')
  const js = await cs.runCode('console.log(6 * 7)', { language: 'js' })
  assert.deepEqual(js.logs.stdout, ['42\n'])
} finally {
  await cs.kill()
}
console.log('ok')
