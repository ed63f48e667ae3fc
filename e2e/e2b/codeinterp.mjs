// Drives spaced with the unmodified @e2b/code-interpreter SDK (pinned in package-lock.json).
// Environment: E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL (all pointing at spaced).
// Prints one line per check and exits non-zero on the first failure.
import assert from 'node:assert/strict'
import { step } from './step.mjs'
import { Sandbox, NotFoundError } from '@e2b/code-interpreter'

let sbx
try {
  await step('create (default template code-interpreter-v1)', async () => {
    sbx = await Sandbox.create({ timeoutMs: 300_000, envs: { SANDBOX_WIDE: 'from-create' } })
    assert.match(sbx.sandboxId, /^sbx_/)
  })

  await step('state kept across calls; execution counts grow', async () => {
    const a = await sbx.runCode('x = 21')
    const b = await sbx.runCode('x * 2')
    assert.equal(b.text, '42')
    assert.ok(b.executionCount > a.executionCount, `counts ${a.executionCount} then ${b.executionCount}`)
  })

  await step('sandbox variables reach the kernel; per-call envs do not stay', async () => {
    const a = await sbx.runCode('import os; os.environ.get("SANDBOX_WIDE")')
    assert.equal(a.text, 'from-create')
    const b = await sbx.runCode('os.environ.get("PER_CALL")', { envs: { PER_CALL: 'only-now' } })
    assert.equal(b.text, 'only-now')
    const c = await sbx.runCode('str(os.environ.get("PER_CALL"))')
    assert.equal(c.text, 'None')
  })

  await step('runs as user in /home/user', async () => {
    const r = await sbx.runCode('import os, getpass; (getpass.getuser(), os.getcwd())')
    assert.equal(r.text, "('user', '/home/user')")
  })

  await step('stdout and stderr, streamed while the cell runs', async () => {
    const seen = []
    const t0 = Date.now()
    let firstAt = 0
    const r = await sbx.runCode('import sys, time\nfor i in range(3):\n    print("tick", i, flush=True)\n    time.sleep(0.5)\nprint("err", file=sys.stderr)', {
      onStdout: m => { if (!firstAt) firstAt = Date.now(); seen.push(m.line) },
      onStderr: m => seen.push('E:' + m.line),
    })
    assert.deepEqual(r.logs.stdout, ['tick 0\n', 'tick 1\n', 'tick 2\n'])
    assert.deepEqual(r.logs.stderr, ['err\n'])
    assert.ok(seen.includes('tick 0\n') && seen.includes('E:err\n'), JSON.stringify(seen))
    assert.ok(firstAt - t0 < Date.now() - t0 - 500, 'the first line came before the cell ended')
  })

  await step('an exception is a result; the kernel goes on', async () => {
    let cb
    const r = await sbx.runCode('1/0', { onError: e => { cb = e } })
    assert.equal(r.error.name, 'ZeroDivisionError')
    assert.equal(r.error.value, 'division by zero')
    assert.ok(r.error.traceback.includes('ZeroDivisionError'))
    assert.equal(cb?.name, 'ZeroDivisionError')
    assert.equal((await sbx.runCode('x')).text, '21')
  })

  await step('a matplotlib chart is a PNG result', async () => {
    const results = []
    const r = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 9])\nplt.title("t")\nplt.show()', { onResult: x => results.push(x) })
    const png = r.results.find(x => x.png)
    assert.ok(png, `results: ${JSON.stringify(r.results.map(x => Object.keys(x)))}`)
    assert.equal(Buffer.from(png.png, 'base64').subarray(1, 4).toString(), 'PNG')
    assert.equal(png.isMainResult, false)
    assert.ok(results.some(x => x.png), 'onResult got it')
    const fig = await sbx.runCode('fig, ax = plt.subplots(); ax.bar(["a", "b"], [3, 5]); fig')
    assert.ok(fig.results.some(x => x.png && x.isMainResult), 'a Figure as the last expression')
  })

  await step('a DataFrame is an HTML table; a dict is JSON', async () => {
    const r = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": [3, 4]})')
    const main = r.results.find(x => x.isMainResult)
    assert.ok(main?.html?.includes('<table'), `html: ${main?.html}`)
    const j = await sbx.runCode('{"k": [1, 2], "v": "w"}')
    assert.deepEqual(j.results[0].json, { k: [1, 2], v: 'w' })
  })

  await step('a CSV written with files.write, cleaned and totalled with pandas', async () => {
    const rows = ['region,amount']
    let want = 0
    for (let i = 0; i < 200; i++) {
      const amount = (i * 37) % 101
      if (i % 10 === 3) { rows.push(`r${i % 4},`); continue } // a missing amount: dropped
      if (i % 17 === 5) { rows.push(`r${i % 4},n/a`); continue } // not a number: dropped
      rows.push(`r${i % 4},${amount}`)
      want += amount
    }
    await sbx.files.write('/home/user/sales.csv', rows.join('\n') + '\n')
    const r = await sbx.runCode(
      'df = pd.read_csv("sales.csv")\n' +
      'df["amount"] = pd.to_numeric(df["amount"], errors="coerce")\n' +
      'df = df.dropna(subset=["amount"])\n' +
      'int(df["amount"].sum())')
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    assert.equal(r.text, String(want))
  })

  await step('contexts: independent kernels, listed, restarted, removed', async () => {
    const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
    assert.equal(ctx.cwd, '/tmp')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp')
    await sbx.runCode('y = "only here"', { context: ctx })
    const other = await sbx.runCode('y')
    assert.equal(other.error?.name, 'NameError')
    const list = await sbx.listCodeContexts()
    assert.ok(list.some(c => c.id === ctx.id), 'listed')
    assert.ok(list.some(c => c.language === 'python') && list.some(c => c.language === 'javascript'), JSON.stringify(list))
    await sbx.restartCodeContext(ctx)
    const gone = await sbx.runCode('y', { context: ctx })
    assert.equal(gone.error?.name, 'NameError')
    await sbx.removeCodeContext(ctx)
    await assert.rejects(sbx.runCode('1', { context: ctx }), e => e instanceof NotFoundError)
  })

  await step('bash and javascript kernels keep their state', async () => {
    await sbx.runCode('export N=6', { language: 'bash' })
    const b = await sbx.runCode('echo $((N * 7))', { language: 'bash' })
    assert.deepEqual(b.logs.stdout, ['42\n'])
    await sbx.runCode('const z = 40', { language: 'js' })
    const j = await sbx.runCode('z + 2', { language: 'javascript' })
    assert.equal(j.text, '42')
  })

  await step('a timeout interrupts the cell and leaves the kernel usable', async () => {
    const t0 = Date.now()
    await assert.rejects(sbx.runCode('import time; time.sleep(30)', { timeoutMs: 2000 }))
    assert.ok(Date.now() - t0 < 10_000, `took ${Date.now() - t0} ms`)
    const r = await sbx.runCode('1 + 1', { timeoutMs: 20_000 })
    assert.equal(r.text, '2')
    assert.equal((await sbx.runCode('x')).text, '21')
  })

  await step('pause, then connect: the variables are still there', async () => {
    await sbx.runCode('kept = [i * i for i in range(5)]')
    assert.equal(await sbx.pause(), true)
    const again = await Sandbox.connect(sbx.sandboxId)
    const r = await again.runCode('sum(kept)')
    assert.equal(r.text, '30')
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
// The SDK leaves each runCode's timeoutMs timer running after the call returns; do not wait
// out the last one.
process.exit(process.exitCode ?? 0)
