// The unmodified @e2b/code-interpreter SDK against the code-interpreter server (through mock.mjs):
// state, streaming callbacks, errors, rich results, contexts, languages, env vars, the agent's
// global env vars, unicode, timeoutMs aborts and what follows them, and SDK-level round trips.
// Run by run.sh; it exits non-zero on the first failed assertion.
import { Sandbox } from '@e2b/code-interpreter';
import assert from 'node:assert/strict';
const t0 = Date.now();
const el = () => ((Date.now() - t0) / 1000).toFixed(2);
const log = (...a) => console.log(`[${el()}s]`, ...a);
const sbx = await Sandbox.create({ timeoutMs: 300000 });
log('created', sbx.sandboxId);

let ex = await sbx.runCode('x = 1');
ex = await sbx.runCode('x += 1; x');
assert.equal(ex.text, '2'); log('state kept:', ex.text, 'count', ex.executionCount);

const seen = [];
const start = Date.now();
ex = await sbx.runCode("import time, sys\nfor i in range(3):\n    print('tick', i)\n    time.sleep(0.5)\nprint('err', file=sys.stderr)", {
  onStdout: (m) => seen.push(['out', m.line, Date.now() - start]), onStderr: (m) => seen.push(['err', m.line, Date.now() - start]) });
assert.deepEqual(ex.logs.stdout, ['tick 0\n', 'tick 1\n', 'tick 2\n']);
assert.deepEqual(ex.logs.stderr, ['err\n']);
assert.ok(seen[0][2] < 800, 'first stdout callback came late: ' + seen[0][2]);
log('streamed:', JSON.stringify(seen));

ex = await sbx.runCode('1/0');
assert.equal(ex.error.name, 'ZeroDivisionError'); assert.equal(ex.error.value, 'division by zero');
assert.ok(ex.error.traceback.includes('ZeroDivisionError'));
log('error ok; next:', (await sbx.runCode('1+1')).text);

ex = await sbx.runCode("import matplotlib.pyplot as plt\nplt.plot([1,2,3])\nplt.show()");
assert.ok(ex.results[0].png && !ex.results[0].isMainResult); log('plt.show png', ex.results[0].png.length, 'formats', ex.results[0].formats());
ex = await sbx.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})");
assert.ok(ex.results[0].html.includes('<table')); log('dataframe formats', ex.results[0].formats(), 'data', JSON.stringify(ex.results[0].data));
ex = await sbx.runCode("{'k': [1, 2]}");
log('dict json', JSON.stringify(ex.results[0].json), 'text', ex.text);
ex = await sbx.runCode("'/home/user'");
assert.equal(ex.text, '/home/user');

const ctx = await sbx.createCodeContext({ cwd: '/tmp' });
log('context', JSON.stringify(ctx));
assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp');
await sbx.runCode('y = 5', { context: ctx });
assert.equal((await sbx.runCode('y', { context: ctx })).text, '5');
assert.equal((await sbx.runCode('y')).error.name, 'NameError');
const list = await sbx.listCodeContexts();
log('contexts', JSON.stringify(list.map((c) => c.language)));
assert.ok(list.some((c) => c.language === 'python') && list.some((c) => c.language === 'javascript'));
await sbx.restartCodeContext(ctx);
ex = await sbx.runCode('y', { context: ctx });
assert.equal(ex.error.name, 'NameError'); assert.equal(ex.error.value, "name 'y' is not defined");
await sbx.removeCodeContext(ctx.id);
await assert.rejects(sbx.runCode('1', { context: ctx }), (e) => { log('removed context ->', e.name); return e.name === 'NotFoundError'; });

ex = await sbx.runCode("console.log('from js'); const z = await Promise.resolve(21); z * 2", { language: 'js' });
assert.equal(ex.text, '42'); assert.deepEqual(ex.logs.stdout, ['from js\n']);
ex = await sbx.runCode("const t: number = 3\nt * 2", { language: 'typescript' });
log('typescript:', ex.error ? ex.error.name + ' (no typescript compiler installed)' : ex.text);
ex = await sbx.runCode('N=6; echo $((N*7)); echo oops >&2', { language: 'bash' });
assert.deepEqual(ex.logs.stdout, ['42\n']); assert.deepEqual(ex.logs.stderr, ['oops\n']);
ex = await sbx.runCode('echo $N', { language: 'bash' });
assert.deepEqual(ex.logs.stdout, ['6\n']); log('bash ok');

ex = await sbx.runCode("import os; os.environ.get('ONLY_HERE')", { envs: { ONLY_HERE: 'yes' } });
assert.equal(ex.text, 'yes');
assert.equal((await sbx.runCode("str(os.environ.get('ONLY_HERE'))")).text, 'None');
const fresh = await sbx.createCodeContext();
ex = await sbx.runCode("import os; os.environ.get('SANDBOX_GLOBAL')", { context: fresh });
assert.equal(ex.text, 'from-envd'); log('global envd env var:', ex.text);

ex = await sbx.runCode("print('h\u00e9llo \u2603 \u65e5\u672c ' * 2000)");
assert.equal(ex.logs.stdout.join(''), 'h\u00e9llo \u2603 \u65e5\u672c '.repeat(2000) + '\n'); log('unicode ok');

// E2B's interrupt test: timeoutMs aborts, then 1 + 1 works.
let t = Date.now();
await assert.rejects(sbx.runCode('import time; time.sleep(30)', { timeoutMs: 2000 }), (e) => { log('timeoutMs ->', e.name, 'after', Date.now() - t, 'ms'); return e.name === 'TimeoutError'; });
t = Date.now();
ex = await sbx.runCode('1 + 1', { timeoutMs: 10000 });
assert.equal(ex.text, '2'); log('right after the abort: 1 + 1 =', ex.text, 'in', Date.now() - t, 'ms');
await assert.rejects(sbx.runCode('while True: pass', { timeoutMs: 1000 }), (e) => e.name === 'TimeoutError');
await new Promise((r) => setTimeout(r, 5000));
ex = await sbx.runCode('1 + 1', { timeoutMs: 10000 });
assert.equal(ex.text, '2'); log('after a busy loop abort + 5 s: 1 + 1 =', ex.text);

// Round trips through the SDK.
const rt = [];
for (let i = 0; i < 30; i++) { const s = performance.now(); await sbx.runCode('1+1'); rt.push(performance.now() - s); }
rt.sort((a, b) => a - b);
log('SDK runCode(1+1) median', rt[15].toFixed(2), 'ms');
await sbx.kill();
log('ALL OK');
