// Drives spaced with the unmodified E2B SDK. Usage: node test.mjs <sdk-version>
// Environment: E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL (all pointing at spaced).
// Prints one line per check and exits non-zero on the first failure.
import assert from 'node:assert/strict'
import { step } from './step.mjs'

const version = process.argv[2]
const { Sandbox, CommandExitError, FileNotFoundError } = await import(`e2b-${version}`)

let sbx
try {
  await step('create', async () => {
    sbx = await Sandbox.create('base', { envs: { GREETING: 'hello-from-env' }, metadata: { suite: 'e2b' }, timeoutMs: 120_000 })
    assert.match(sbx.sandboxId, /^sbx_/)
  })

  await step('run: streamed output, exit code, env, cwd', async () => {
    const out = [], err = []
    const r = await sbx.commands.run('echo out-line; echo err-line >&2; echo $GREETING $EXTRA; pwd', {
      envs: { EXTRA: 'extra' }, cwd: '/tmp', onStdout: d => out.push(d), onStderr: d => err.push(d),
    })
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'out-line\nhello-from-env extra\n/tmp\n')
    assert.equal(r.stderr, 'err-line\n')
    assert.ok(out.join('').includes('out-line'), 'onStdout called')
    assert.ok(err.join('').includes('err-line'), 'onStderr called')
    await assert.rejects(sbx.commands.run('exit 3'), e => e instanceof CommandExitError && e.exitCode === 3)
  })

  await step("E2B's default user: user in /home/user, unless a call names one", async () => {
    const r = await sbx.commands.run('whoami; pwd; echo ~')
    assert.equal(r.stdout, 'user\n/home/user\n/home/user\n')
    await sbx.files.write('/home/user/owned.txt', 'mine')
    const st = await sbx.commands.run('stat -c %U /home/user/owned.txt')
    assert.equal(st.stdout, 'user\n')
    assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
  })

  await step('background + wait', async () => {
    const h = await sbx.commands.run('sleep 1; echo done-late', { background: true })
    assert.ok(h.pid > 0)
    const r = await h.wait()
    assert.equal(r.stdout, 'done-late\n')
  })

  await step('stdin + closeStdin', async () => {
    const h = await sbx.commands.run('cat', { background: true, stdin: true })
    await sbx.commands.sendStdin(h.pid, 'piped through\n')
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    assert.equal(r.stdout, 'piped through\n')
  })

  await step('kill a process', async () => {
    const h = await sbx.commands.run('sleep 600', { background: true })
    assert.equal(await sbx.commands.kill(h.pid), true)
    await assert.rejects(h.wait())
    assert.equal(await sbx.commands.kill(999999), false)
  })

  await step('files: text, binary, list, exists, makeDir, rename, remove, getInfo', async () => {
    await sbx.files.write('/home/user/notes.txt', 'some text\n')
    assert.equal(await sbx.files.read('/home/user/notes.txt'), 'some text\n')
    const bin = new Uint8Array(1 << 20)
    for (let i = 0; i < bin.length; i++) bin[i] = (i * 7919) & 0xff
    await sbx.files.write('/tmp/blob.bin', bin.buffer)
    const back = new Uint8Array(await sbx.files.read('/tmp/blob.bin', { format: 'bytes' }))
    assert.equal(back.length, bin.length)
    assert.ok(back.every((v, i) => v === bin[i]), '1 MiB binary round trip')
    const names = (await sbx.files.list('/home/user')).map(e => e.name)
    assert.ok(names.includes('notes.txt'), `list: ${names}`)
    assert.equal(await sbx.files.exists('/home/user/notes.txt'), true)
    assert.equal(await sbx.files.exists('/home/user/nope.txt'), false)
    assert.equal(await sbx.files.makeDir('/home/user/dir'), true)
    assert.equal(await sbx.files.makeDir('/home/user/dir'), false)
    await sbx.files.rename('/home/user/notes.txt', '/home/user/dir/moved.txt')
    const info = await sbx.files.getInfo('/home/user/dir/moved.txt')
    assert.equal(info.name, 'moved.txt')
    assert.equal(info.size, 10)
    await sbx.files.remove('/home/user/dir/moved.txt')
    assert.equal(await sbx.files.exists('/home/user/dir/moved.txt'), false)
    await assert.rejects(sbx.files.read('/home/user/dir/moved.txt'), e => e instanceof FileNotFoundError)
  })

  await step('getInfo, list, setTimeout, isRunning, getMetrics', async () => {
    const info = await sbx.getInfo()
    assert.equal(info.sandboxId, sbx.sandboxId)
    assert.equal(info.templateId, 'base')
    assert.equal(info.metadata.suite, 'e2b')
    const listed = await Sandbox.list({ query: { metadata: { suite: 'e2b' } } }).nextItems()
    assert.ok(listed.some(s => s.sandboxId === sbx.sandboxId), 'list finds it')
    await sbx.setTimeout(300_000)
    assert.equal(await sbx.isRunning(), true)
    const metrics = await sbx.getMetrics()
    assert.ok(metrics.length >= 1 && metrics[0].memUsed > 0 && metrics[0].cpuCount >= 1, `metrics: ${JSON.stringify(metrics)}`)
  })

  await step('pause, connect: files and running processes still there', async () => {
    await sbx.files.write('/home/user/kept.txt', 'kept across pause')
    const h = await sbx.commands.run('sleep 600', { background: true })
    assert.equal(await sbx.pause(), true)
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal(await again.files.read('/home/user/kept.txt'), 'kept across pause')
    const procs = await again.commands.list()
    assert.ok(procs.some(p => p.pid === h.pid), `process ${h.pid} still running: ${JSON.stringify(procs.map(p => p.pid))}`)
    sbx = again
  })

  await step('kill', async () => {
    assert.equal(await sbx.kill(), true)
    assert.equal(await Sandbox.kill(sbx.sandboxId), false)
    sbx = undefined
  })
} catch {
  // reported by step
} finally {
  if (sbx) await sbx.kill().catch(() => {})
}
