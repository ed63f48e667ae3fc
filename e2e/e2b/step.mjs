// step runs one named check of an SDK script, printing "ok" or "FAIL" with the error, and marks
// the process failed (and rethrows, ending the script) on a failure.
export const step = async (name, fn) => {
  const t0 = Date.now()
  try {
    await fn()
    console.log(`ok   ${name} (${Date.now() - t0} ms)`)
  } catch (e) {
    console.log(`FAIL ${name}: ${e?.stack || e}`)
    process.exitCode = 1
    throw e
  }
}
