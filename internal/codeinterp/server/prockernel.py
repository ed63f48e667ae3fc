"""Kernels that are a plain child process: bash, and node running jskernel.js.

The child's stdout and stderr are pipes read as they come and streamed to the
running cell. A cell's end is marked in-band, on each of the two streams, by
a marker carrying a nonce fresh for every cell (\\x1eSPACE-<nonce>-<rc>\\x1e);
text before a marker is the cell's, so no output is lost or misplaced between
stdout and the end. Output that arrives while no cell runs (a background job,
a timer) is kept, up to a limit, and shown at the start of the next cell.
"""

import asyncio
import codecs
import json
import logging
import os
import re
import secrets
import shlex
import signal
import socket
import tempfile

import wire
from kernel import Kernel, KernelStartError, describe_exit

log = logging.getLogger("space-code-interpreter")

HERE = os.path.dirname(os.path.abspath(__file__))

_MARK = re.compile(rb"\x1eSPACE-([0-9a-f]{16})-([0-9]*)\x1e")
# A tail that could still grow into a marker is held back until more arrives.
_MARK_PREFIX = re.compile(rb"\x1e(?:S(?:P(?:A(?:C(?:E(?:-(?:[0-9a-f]{1,16}(?:-[0-9]{0,5})?)?)?)?)?)?)?)?")

STRAY_LIMIT = 64 * 1024


class Demux:
    """Splits one pipe's bytes into text and end markers."""

    __slots__ = ("_held", "_decoder", "_on_text", "_on_marker")

    def __init__(self, on_text, on_marker):
        self._held = b""
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._on_text = on_text
        self._on_marker = on_marker

    def feed(self, data):
        buf = self._held + data if self._held else data
        self._held = b""
        start = search = 0
        while True:
            i = buf.find(b"\x1e", search)
            if i < 0:
                break
            m = _MARK.match(buf, i)
            if m:
                self._text(buf[start:i])
                self._on_marker(m.group(1).decode(), m.group(2).decode())
                start = search = m.end()
                continue
            if _MARK_PREFIX.fullmatch(buf, i):
                self._text(buf[start:i])
                self._held = buf[i:]
                return
            search = i + 1
        self._text(buf[start:])

    def _text(self, data):
        if data:
            text = self._decoder.decode(data)
            if text:
                self._on_text(text)


class _Run:
    """The cell running on a process kernel, and which of its end signals arrived."""

    __slots__ = ("cell", "nonce", "need", "rc", "done_msg")

    def __init__(self, cell, nonce, need):
        self.cell = cell
        self.nonce = nonce
        self.need = set(need)
        self.rc = None
        self.done_msg = None


class ProcessKernel(Kernel):
    """A child process in its own session, its stdout and stderr demultiplexed."""

    def __init__(self, cfg, cwd):
        super().__init__(cfg, cwd)
        self.proc = None
        self.run = None
        self.counter = 0
        self._tasks = []
        self._stray = []
        self._stray_size = 0
        self._init_nonce = None
        self._ready = None
        self._ready_fut = None

    def pgid(self):
        return self.proc.pid if self.proc is not None else None

    def has_process(self):
        return self.proc is not None

    async def _spawn(self, argv, stdin, env, pass_fds=()):
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=stdin,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=self.cwd,
                env=env,
                pass_fds=pass_fds,
                start_new_session=True,
            )
        except OSError as e:
            raise KernelStartError("cannot start the %s kernel (%s): %s" % (self.language, argv[0], e.strerror or e)) from e
        self._tasks.append(asyncio.ensure_future(self._watch()))
        for name, reader in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            demux = Demux(self._text_handler(name), self._marker_handler(name))
            self._tasks.append(asyncio.ensure_future(self._pump(reader, demux)))

    async def _watch(self):
        status = await self.proc.wait()
        self._set_exited(describe_exit(status))

    async def _pump(self, reader, demux):
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                demux.feed(data)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s kernel: reading its output failed", self.language)

    def _text_handler(self, name):
        def on_text(text):
            run = self.run
            if run is not None:
                if self._filter(run, name, text):
                    run.cell.emit(wire.stream(name, text))
            elif self._stray_size < STRAY_LIMIT:
                text = text[: STRAY_LIMIT - self._stray_size]
                self._stray.append((name, text))
                self._stray_size += len(text)
        return on_text

    def _filter(self, run, name, text):
        return True

    def _marker_handler(self, name):
        def on_marker(nonce, rc):
            if self._init_nonce is not None and nonce == self._init_nonce:
                self._init_seen(name)
                return
            run = self.run
            if run is None or nonce != run.nonce or name not in run.need:
                return  # a stale marker (a resync after the cell already ended)
            run.need.discard(name)
            if name == "stdout" and rc:
                run.rc = int(rc)
            self._maybe_done(run)
        return on_marker

    def _init_seen(self, name):
        pending = self._ready
        if pending is None:
            return
        pending.discard(name)
        if not pending:
            self._init_nonce = None
            self._ready_fut.set_result(None)

    def _arm_init(self, nonce):
        """Expects the init marker `nonce` on both streams (before it can arrive)."""
        self._init_nonce = nonce
        self._ready = {"stdout", "stderr"}
        self._ready_fut = self.loop.create_future()

    async def _wait_init(self):
        """Waits for the init marker; what came before it is start-up noise."""
        await asyncio.wait([self._ready_fut, self.exited], return_when=asyncio.FIRST_COMPLETED)
        if not self._ready_fut.done():
            raise KernelStartError("the %s kernel exited while starting: %s" % (self.language, self.exited.result()))
        self._stray.clear()
        self._stray_size = 0

    def _begin(self, cell, need):
        """Makes `cell` the running one; shows output that arrived between cells."""
        self.counter += 1
        cell.count = self.counter
        run = _Run(cell, secrets.token_hex(8), need)
        for name, text in self._stray:
            cell.emit(wire.stream(name, text))
        self._stray.clear()
        self._stray_size = 0
        self.run = run
        return run

    def _maybe_done(self, run):
        if run.need or self.run is not run:
            return
        self.run = None
        self._finish(run)
        run.cell.finish()

    def _finish(self, run):
        """Emits the cell's closing lines (its result or error)."""

    async def _cleanup(self):
        for t in self._tasks:
            t.cancel()
        self._tasks = []


# ----------------------------------------------------------------------------
# bash

_BASH_INIT = r"""PS1=''; PS2=''; PS0=''; unset PROMPT_COMMAND; set +o history; set +H
exec {__space_fd_out}>&1 {__space_fd_err}>&2
__space_env_push() {
  __space_env_undo=
  while [ $# -ge 2 ]; do
    if [[ -v $1 ]]; then builtin printf -v __space_q %q "${!1}"; __space_env_undo+="builtin export $1=$__space_q;"; else __space_env_undo+="builtin unset $1;"; fi
    builtin export "$1=$2"; builtin shift 2
  done
}
__space_env_pop() { builtin eval "$__space_env_undo"; __space_env_undo=; }
__space_setrc() { builtin return "$1"; }
"""


def _bash_end(nonce, rc="$?"):
    """The commands that close a cell: restore env vars, mark both streams, keep $?."""
    return (
        "__space_rc=%s; __space_env_pop; "
        "builtin printf '\\036SPACE-%s-%%s\\036' \"$__space_rc\" >&\"$__space_fd_out\"; "
        "builtin printf '\\036SPACE-%s-\\036' >&\"$__space_fd_err\"; "
        "__space_setrc \"$__space_rc\"\n" % (rc, nonce, nonce)
    )


class BashKernel(ProcessKernel):
    """A persistent interactive bash (no line editing, no job control, no rc
    files) reading its commands from a pipe. Each cell is a file it sources with
    stdin from /dev/null, so state (variables, cwd, functions) is kept and a
    cell reading stdin gets EOF. SIGINT to its process group ends the running
    command list, as Ctrl-C does in a terminal."""

    language = "bash"

    def __init__(self, cfg, cwd):
        super().__init__(cfg, cwd)
        self._dir = None
        self._resync = None
        self._interrupted = False

    async def _start(self):
        self._dir = tempfile.mkdtemp(prefix="bash-", dir=self.cfg.runtime_dir)
        env = dict(os.environ)
        env.update(self.cfg.kernel_env)
        await self._spawn([self.cfg.bash, "--noprofile", "--norc", "--noediting", "-i"], asyncio.subprocess.PIPE, env)
        nonce = secrets.token_hex(8)
        self._arm_init(nonce)
        self._write(_BASH_INIT + _bash_end(nonce, "0"))
        await self._wait_init()

    def _write(self, text):
        try:
            self.proc.stdin.write(text.encode("utf-8", "surrogateescape"))
        except (BrokenPipeError, ConnectionResetError, RuntimeError):
            pass  # it died; the exit watcher reports it

    def submit(self, cell):
        run = self._begin(cell, ("stdout", "stderr"))
        self._interrupted = False
        path = os.path.join(self._dir, "cell.sh")
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(cell.code)
            if not cell.code.endswith("\n"):
                f.write("\n")
        prefix = []
        for k, v in cell.global_env.items():
            prefix.append("builtin export %s=%s; " % (k, shlex.quote(v)))
        prefix.append("__space_env_push %s; " % " ".join("%s %s" % (k, shlex.quote(v)) for k, v in cell.env.items()))
        self._write("".join(prefix) + "builtin source %s </dev/null; " % shlex.quote(path) + _bash_end(run.nonce))

    def terminate(self):
        super().terminate()
        self.signal(signal.SIGHUP)  # an interactive bash ignores SIGTERM; SIGHUP ends it

    def _filter(self, run, name, text):
        # bash writes a newline to stderr when SIGINT ends a command: not the cell's output.
        if self._interrupted and name == "stderr" and text == "\n":
            self._interrupted = False
            return False
        return True

    async def interrupt(self, cell):
        run = self.run
        self._interrupted = True
        self.signal(signal.SIGINT)
        if run is None:
            return
        # SIGINT abandons the whole command line, our end marker with it: send the
        # marker again (a copy arriving after the real one is ignored as stale).
        nonce = run.nonce

        async def resync():
            delay = 0.05
            while self.run is run and not self.dead():
                await asyncio.sleep(delay)
                if self.run is not run:
                    return
                self._write(_bash_end(nonce, "130"))
                delay = 1.0

        self._resync = asyncio.ensure_future(resync())

    def _finish(self, run):
        if self._resync is not None:
            self._resync.cancel()
            self._resync = None
        if run.rc and not run.cell.interrupted:
            run.cell.emit(wire.error("ExitCodeError", "the last command exited with status %d" % run.rc))

    async def _cleanup(self):
        await super()._cleanup()
        if self._resync is not None:
            self._resync.cancel()
        if self._dir is not None:
            try:
                os.unlink(os.path.join(self._dir, "cell.sh"))
            except FileNotFoundError:
                pass
            try:
                os.rmdir(self._dir)
            except OSError:
                pass


# ----------------------------------------------------------------------------
# javascript

class JSKernel(ProcessKernel):
    """node running jskernel.js: commands and results go over a socketpair
    (its fd number given with --fd); console output is the child's stdout and
    stderr, ended by markers the harness writes after each cell."""

    language = "javascript"
    flags = ()

    def __init__(self, cfg, cwd):
        super().__init__(cfg, cwd)
        self._writer = None
        self._hello = None

    async def _start(self):
        ours, theirs = socket.socketpair()
        env = dict(os.environ)
        env.update(self.cfg.kernel_env)
        env.pop("NODE_OPTIONS", None)
        try:
            await self._spawn(
                [self.cfg.node, os.path.join(HERE, "jskernel.js"), "--fd", str(theirs.fileno()), *self.flags],
                asyncio.subprocess.DEVNULL,
                env,
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        reader, self._writer = await asyncio.open_unix_connection(sock=ours, limit=64 * 1024 * 1024)
        self._hello = self.loop.create_future()
        self._tasks.append(asyncio.ensure_future(self._events(reader)))
        await asyncio.wait([self._hello, self.exited], return_when=asyncio.FIRST_COMPLETED)
        if not self._hello.done():
            raise KernelStartError("the javascript kernel exited while starting: %s" % self.exited.result())
        await self._wait_init()

    async def _events(self, reader):
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                try:
                    msg = json.loads(line)
                except ValueError:
                    log.warning("javascript kernel: a bad event line")
                    continue
                op = msg.get("op")
                if op == "ready":
                    # The harness marks both streams with this nonce once it runs.
                    nonce = secrets.token_hex(8)
                    self._arm_init(nonce)
                    self._send({"op": "init", "nonce": nonce})
                    if not self._hello.done():
                        self._hello.set_result(None)
                elif op == "done":
                    run = self.run
                    if run is not None and msg.get("nonce") == run.nonce:
                        run.done_msg = msg
                        run.need.discard("event")
                        self._maybe_done(run)
        except asyncio.CancelledError:
            raise
        except Exception:
            if not self.dead():
                log.exception("javascript kernel: reading its events failed")

    def _send(self, obj):
        try:
            self._writer.write(json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass") + b"\n")
        except (ConnectionResetError, BrokenPipeError, RuntimeError):
            pass

    def submit(self, cell):
        run = self._begin(cell, ("stdout", "stderr", "event"))
        self._send({"op": "exec", "nonce": run.nonce, "code": cell.code, "env": cell.env, "global_env": cell.global_env})

    def _finish(self, run):
        msg = run.done_msg or {}
        cell = run.cell
        err = msg.get("error")
        if err is not None:
            if not (cell.interrupted and msg.get("interrupted")):
                cell.emit(wire.error(err.get("name") or "Error", err.get("value") or "", err.get("traceback") or ""))
        elif msg.get("result") is not None:
            cell.emit(wire.text_result(msg["result"].get("text", "")))

    async def _cleanup(self):
        await super()._cleanup()
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:
                pass


class TSKernel(JSKernel):
    """The same harness for typescript contexts: it strips types when node's
    `typescript` module is installed (Debian: node-typescript), else runs the
    cells as JavaScript."""

    language = "typescript"
    flags = ("--typescript",)
