// Non-ASCII output through a proxy that delivers the body in small pieces (mock.mjs with
// MOCK_CHOP): the SDK decodes each network read on its own, so this passes only if the server
// keeps its lines ASCII. Run by run.sh.
import { Sandbox } from '@e2b/code-interpreter';
import assert from 'node:assert/strict';

const sbx = await Sandbox.create();
const want = 'h\u00e9llo \u2603 \u65e5\u672c \ud83d\ude00 '.repeat(500) + '\n';
let ex = await sbx.runCode("print('h\\u00e9llo \\u2603 \\u65e5\\u672c \\U0001F600 ' * 500)");
const got = ex.logs.stdout.join('');
assert.equal((got.match(/\ufffd/g) || []).length, 0, 'replacement characters in stdout');
assert.equal(got, want);
ex = await sbx.runCode("'\u00fcber \u4e2d\u6587'");
assert.equal(ex.text, '\u00fcber \u4e2d\u6587');
ex = await sbx.runCode("console.log('\u00e9\u00e8'.repeat(3000))", { language: 'js' });
assert.equal(ex.logs.stdout.join(''), '\u00e9\u00e8'.repeat(3000) + '\n');
console.log('utf-8 through a chopping proxy: OK');
