'use strict';
// The javascript kernel of the SPACE code-interpreter server: one node process
// per context, started as `node jskernel.js --fd N`.
//
// Cells run through node's own REPL evaluator (repl.start with useGlobal), so
// state persists the way it does in `node`'s REPL: top-level let/const/var,
// functions and classes stay defined, `await` works at top level, built-in
// modules (fs, path, ...) are globals and require() resolves from the cwd.
// The REPL's input and output streams are unused: we call its eval directly.
//
// Protocol, one JSON object a line on the socket fd N:
//   harness -> server  {"op":"ready"}
//   server -> harness  {"op":"init","nonce":n}    harness marks stdout and stderr
//   server -> harness  {"op":"exec","nonce":n,"code":s,"env":{},"global_env":{}}
//   harness -> server  {"op":"done","nonce":n,"result":{"text":s}|null,
//                       "error":{"name","value","traceback"}|null,"interrupted":b}
// Console output goes to this process's stdout and stderr, which the server
// streams; after a cell the harness writes "\x1eSPACE-<nonce>-\x1e" on both, so
// the server knows all of the cell's output has arrived.
//
// Interrupt is SIGINT: synchronous code is stopped by the REPL's
// breakEvalOnSigint; a cell waiting on a promise is ended at once (the promise
// is abandoned). Stdin is /dev/null. Runs on node 18 (Debian bookworm) and later.
// Started with --typescript, it strips TypeScript types first (see toJavaScript).

const net = require('net');
const repl = require('repl');
const util = require('util');
const domain = require('domain');
const { PassThrough, Writable } = require('stream');

// --typescript: cells are TypeScript; their types are stripped with the `typescript` module
// when it can be required (Debian's node-typescript puts it in /usr/share/nodejs), else
// they run as they are, as JavaScript (said once, on stderr).
const typescript = process.argv.includes('--typescript');
let tsCompiler; // undefined: not looked up yet; null: not installed
function toJavaScript(code) {
  if (!typescript) return code;
  if (tsCompiler === undefined) {
    try {
      tsCompiler = require('typescript');
    } catch (_) {
      tsCompiler = null;
      process.stderr.write('[space] the typescript compiler is not installed: cells run as JavaScript, type annotations are syntax errors\n');
    }
  }
  if (tsCompiler === null) return code;
  return tsCompiler.transpileModule(code, {
    compilerOptions: { target: tsCompiler.ScriptTarget.ES2022, module: tsCompiler.ModuleKind.ESNext },
    reportDiagnostics: false,
  }).outputText;
}

const fdIndex = process.argv.indexOf('--fd');
if (fdIndex < 0) {
  process.stderr.write('usage: node jskernel.js --fd N\n');
  process.exit(2);
}
const chan = new net.Socket({ fd: Number(process.argv[fdIndex + 1]), readable: true, writable: true });

function send(obj) {
  chan.write(JSON.stringify(obj) + '\n');
}

function mark(nonce) {
  const m = '\x1eSPACE-' + nonce + '-\x1e';
  process.stdout.write(m);
  process.stderr.write(m);
}

function inspect(value) {
  try {
    return util.inspect(value, { colors: false });
  } catch (e) {
    try {
      return String(value);
    } catch (_) {
      return '[uninspectable value]';
    }
  }
}

function describe(err) {
  if (err && typeof err === 'object' && err.constructor && err.constructor.name === 'Recoverable' && err.err) {
    err = err.err; // the REPL's "incomplete input": the SyntaxError inside
  }
  if (err instanceof Error || (err && typeof err === 'object' && typeof err.stack === 'string')) {
    let stack = '';
    try {
      stack = String(err.stack || '');
    } catch (_) { /* a getter that throws */ }
    return { name: String(err.name || 'Error'), value: String(err.message === undefined ? '' : err.message), traceback: stack };
  }
  return { name: 'Error', value: typeof err === 'string' ? err : inspect(err), traceback: '' };
}

// Output of code that runs between cells (timers, callbacks) still shows up:
// the server holds it for the next cell.
function stray(prefix, err) {
  const text = err instanceof Error ? String(err.stack || err) : inspect(err);
  process.stderr.write(prefix + text + '\n');
}

const sink = new Writable({ write(_chunk, _enc, cb) { cb(); } });
const errors = domain.create();
const server = repl.start({
  input: new PassThrough(),
  output: sink,
  prompt: '',
  terminal: false,
  useColors: false,
  useGlobal: true,
  ignoreUndefined: true,
  breakEvalOnSigint: true,
  preview: false,
  domain: errors,
});

let current = null; // { nonce, saved, settled }

function setEnv(env) {
  const saved = [];
  for (const k of Object.keys(env || {})) {
    saved.push([k, Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined]);
    process.env[k] = String(env[k]);
  }
  return saved;
}

function restoreEnv(saved) {
  for (let i = saved.length - 1; i >= 0; i--) {
    const [k, v] = saved[i];
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
}

function finish(cell, outcome) {
  if (cell.settled) return;
  cell.settled = true;
  if (current === cell) current = null;
  restoreEnv(cell.saved);
  let result = null;
  let error = null;
  let interrupted = Boolean(outcome.interrupted);
  if ('error' in outcome) {
    error = describe(outcome.error);
    if (outcome.error && outcome.error.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') interrupted = true;
  } else if (outcome.value !== undefined) {
    result = { text: inspect(outcome.value) };
  }
  // After the evaluation has unwound (and SIGINT is listened to again): the
  // server may interrupt as soon as it reads this.
  process.nextTick(() => {
    mark(cell.nonce);
    send({ op: 'done', nonce: cell.nonce, result, error, interrupted });
  });
}

// The REPL evaluator reports a cell's error through its domain (or, with no
// domain active, through the callback). An error thrown later by a timer or
// callback also lands here, flagged domainThrown: that one is not the cell's.
errors.on('error', (err) => {
  const thrownLater = err !== null && (typeof err === 'object' || typeof err === 'function') && err.domainThrown;
  if (current && !current.settled && !thrownLater) finish(current, { error: err });
  else stray('Uncaught ', err);
});
process.on('uncaughtException', (err) => stray('Uncaught ', err));
process.on('unhandledRejection', (reason) => stray('Unhandled promise rejection: ', reason));

// SIGINT while a cell waits on a promise (or while nothing runs). This
// listener is removed while a cell's synchronous part runs: there the REPL's
// breakEvalOnSigint watchdog must get the signal (a JS listener would make
// node swap its handlers out from under the watchdog), and when the watchdog
// stops it resets SIGINT to node's exit handler, so the listener is added
// afresh after every evaluation to get libuv's handler installed again.
function onSigint() {
  if (current && !current.settled) {
    const err = new Error('Script execution was interrupted by `SIGINT`');
    err.name = 'KeyboardInterrupt';
    finish(current, { error: err, interrupted: true });
  }
}

function listenSigint() {
  process.removeListener('SIGINT', onSigint);
  process.on('SIGINT', onSigint);
}

function exec(msg) {
  if (current && !current.settled) finish(current, { error: new Error('superseded by the next cell'), interrupted: true });
  setEnv(msg.global_env);
  const cell = { nonce: msg.nonce, saved: setEnv(msg.env), settled: false };
  current = cell;
  process.removeListener('SIGINT', onSigint);
  try {
    server.eval(toJavaScript(msg.code), server.context, 'cell', (err, value) => {
      if (err) finish(cell, { error: err });
      else finish(cell, { value });
    });
  } catch (e) {
    finish(cell, { error: e });
  } finally {
    listenSigint();
  }
}

let buffered = '';
chan.setEncoding('utf8');
chan.on('data', (chunk) => {
  buffered += chunk;
  let i;
  while ((i = buffered.indexOf('\n')) >= 0) {
    const line = buffered.slice(0, i);
    buffered = buffered.slice(i + 1);
    if (!line) continue;
    let msg;
    try {
      msg = JSON.parse(line);
    } catch (e) {
      process.stderr.write('jskernel: bad command line\n');
      continue;
    }
    if (msg.op === 'exec') exec(msg);
    else if (msg.op === 'init') mark(msg.nonce);
  }
});
listenSigint();
chan.on('end', () => process.exit(0));
chan.on('error', () => process.exit(0));

send({ op: 'ready' });
