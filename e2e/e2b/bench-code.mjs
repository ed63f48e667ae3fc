// Times Sandbox.create() + the first runCode('1+1') with the unmodified @e2b/code-interpreter
// against spaced. Usage: node bench-code.mjs <n> <warm>: before each run it waits until spaced's
// warm pools hold <warm> sandboxes, so every create is served from the pool. Prints
// {"median_ms": …} of n runs after 2 warm-up runs.
import { Sandbox } from '@e2b/code-interpreter'

const [n, warm] = [Number(process.argv[2]), Number(process.argv[3])]
const waitWarm = async () => {
  for (const deadline = Date.now() + 60_000; Date.now() < deadline;) {
    const m = await (await fetch(`${process.env.E2B_API_URL}/metrics`)).text()
    const ready = Number(/^space_warm_pool_ready (\d+)$/m.exec(m)?.[1] ?? 0)
    if (ready >= warm) return
    await new Promise(r => setTimeout(r, 20))
  }
  throw new Error('the warm pool did not refill within a minute')
}
const times = []
for (let i = 0; i < n + 2; i++) {
  await waitWarm()
  const t0 = performance.now()
  const sbx = await Sandbox.create()
  const r = await sbx.runCode('1+1')
  const dt = performance.now() - t0
  if (r.text !== '2') throw new Error(`unexpected result ${JSON.stringify(r)}`)
  await sbx.kill()
  if (i >= 2) times.push(dt)
}
times.sort((a, b) => a - b)
console.log(JSON.stringify({ median_ms: times[Math.floor(times.length / 2)] }))
process.exit(0) // the SDK leaves its runCode timers running
