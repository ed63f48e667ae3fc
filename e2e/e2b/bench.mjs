// Times Sandbox.create() + commands.run('echo hi') with the unmodified E2B SDK against spaced.
// Usage: node bench.mjs <sdk-version> <n>; prints {"median_ms": …}.
const [version, n] = [process.argv[2], Number(process.argv[3])]
const { Sandbox } = await import(`e2b-${version}`)
const times = []
for (let i = 0; i < n + 2; i++) {
  const t0 = performance.now()
  const sbx = await Sandbox.create()
  const r = await sbx.commands.run('echo hi')
  const dt = performance.now() - t0
  if (r.stdout !== 'hi\n') throw new Error(`unexpected output ${JSON.stringify(r.stdout)}`)
  await sbx.kill()
  if (i >= 2) times.push(dt) // warm-up
  await new Promise(res => setTimeout(res, 300)) // let the warm pool refill, as between native runs
}
times.sort((a, b) => a - b)
console.log(JSON.stringify({ median_ms: times[Math.floor(times.length / 2)] }))
