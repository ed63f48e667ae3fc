"""The python kernel: ipykernel, started by jupyter_client's AsyncKernelManager,
spoken to with jupyter_client's Session (message format and HMAC signing) over
the kernel's shell and iopub sockets, read on the event loop (see _Wire: not
zmq.asyncio, which now and then missed a message under load).

Each message is routed by its parent's msg_id to the handler of the request
that caused it; nothing polls. Every execute_request goes with
stop_on_error=False: executions are serialised by the server, so ipykernel's
aborting of queued requests after an error or an interrupt (which would drop
the next cell) is never wanted.

The kernel runs with a profile dir the server owns (IPYTHONDIR): its config
turns colours off and its startup file registers the JSON formatter and the
env helper (ipython/ in the install dir; see prepare_ipython_dir).
"""

import asyncio
import json
import logging
import os
import secrets
import signal
import threading

import zmq
from jupyter_client import AsyncKernelManager
from jupyter_client.kernelspec import KernelSpecManager

import wire
from kernel import Kernel, KernelStartError, describe_exit

log = logging.getLogger("space-code-interpreter")

HERE = os.path.dirname(os.path.abspath(__file__))


def prepare_ipython_dir(cfg):
    """Writes the kernel spec and the IPython profile into the server's state dir.
    (The spec is not named python3: jupyter_client would import ipykernel, and
    with it debugpy, into the server to look that one up.)"""
    spec_dir = os.path.join(cfg.work_dir, "kernels", "space-python")
    os.makedirs(spec_dir, exist_ok=True)
    spec = {
        "argv": [cfg.python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (space)",
        "language": "python",
        "interrupt_mode": "signal",
    }
    _write(os.path.join(spec_dir, "kernel.json"), json.dumps(spec, indent=1).encode())
    profile = os.path.join(cfg.ipython_dir, "profile_default")
    os.makedirs(os.path.join(profile, "startup"), exist_ok=True)
    src = os.path.join(HERE, "ipython")
    _write(os.path.join(profile, "ipython_kernel_config.py"), _read(os.path.join(src, "ipython_kernel_config.py")))
    startup = os.path.join(profile, "startup")
    for name in os.listdir(startup):  # ours only: a stale one from an older server goes
        if name.startswith("00-space"):
            os.unlink(os.path.join(startup, name))
    _write(os.path.join(startup, "00-space.py"), _read(os.path.join(src, "startup", "00-space.py")))


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _write(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class _Handler:
    """Waits for one request's reply (shell) and its idle status (iopub)."""

    __slots__ = ("idle", "reply", "on_done")

    def __init__(self, on_done):
        self.idle = False
        self.reply = None
        self.on_done = on_done

    def on_iopub(self, msg):
        if msg["msg_type"] == "status" and msg["content"].get("execution_state") == "idle":
            self.idle = True
            self._check()

    def on_reply(self, msg):
        self.reply = msg
        self._check()

    def _check(self):
        if self.idle and self.reply is not None and self.on_done is not None:
            done, self.on_done = self.on_done, None
            done(self)


class _CellHandler(_Handler):
    """The cell itself: its iopub output becomes NDJSON lines.

    `started` is set by its execute_input, which ipykernel publishes once it has
    installed its SIGINT handler for the request: an interrupt asked for before
    that is held back until then (it would hit the env set-up before the cell,
    or a kernel between requests, which ignores SIGINT). An interrupted cell is
    done at its idle status: ipykernel sends no reply when the KeyboardInterrupt
    lands outside the user's code."""

    __slots__ = ("cell", "started", "on_start")

    def __init__(self, cell, on_done):
        super().__init__(on_done)
        self.cell = cell
        self.started = False
        self.on_start = None

    def _check(self):
        if self.idle and (self.reply is not None or self.cell.interrupted) and self.on_done is not None:
            done, self.on_done = self.on_done, None
            done(self)

    def on_iopub(self, msg):
        t = msg["msg_type"]
        c = msg["content"]
        cell = self.cell
        if t == "stream":
            cell.emit(wire.stream("stderr" if c.get("name") == "stderr" else "stdout", c.get("text", "")))
        elif t == "execute_result":
            cell.emit(wire.result(c.get("data", {}), True))
        elif t == "display_data" or t == "update_display_data":
            cell.emit(wire.result(c.get("data", {}), False))
        elif t == "error":
            if not (cell.interrupted and c.get("ename") == "KeyboardInterrupt"):
                cell.emit(wire.error(c.get("ename", "Error"), c.get("evalue", ""), c.get("traceback", [])))
        elif t == "status":
            if c.get("execution_state") == "idle":
                self.idle = True
                self._check()
        elif t == "execute_input":
            cell.count = c.get("execution_count")
            self.started = True
            if self.on_start is not None:
                start, self.on_start = self.on_start, None
                start()


class _Probe:
    """kernel_info at start: resolves one future on its reply, one on any iopub message."""

    __slots__ = ("replied", "seen")

    def __init__(self, replied, seen):
        self.replied = replied
        self.seen = seen

    def on_reply(self, msg):
        if not self.replied.done():
            self.replied.set_result(None)

    def on_iopub(self, msg):
        if not self.seen.done():
            self.seen.set_result(None)


def _cell_done(handler):
    cell = handler.cell
    if handler.reply is None:  # interrupted, and ipykernel sent no reply
        return
    content = handler.reply["content"]
    if content.get("execution_count") is not None:
        cell.count = content["execution_count"]
    if content.get("status") == "aborted" and not cell.interrupted:
        cell.emit(wire.error("ExecutionAborted", "the kernel aborted the cell (it was still handling an earlier interrupt or error)"))


def _env_done(handler):
    content = handler.reply["content"]
    if content.get("status") != "ok":
        log.warning("python kernel: setting or restoring env vars failed: %s", content.get("ename", content.get("status")))


class _Wire:
    """A kernel's shell and iopub sockets on the event loop, without zmq.asyncio.

    zmq's FD is edge-triggered: it signals when the socket's state changes, and
    any operation on the socket (a send too) can take that signal. So after
    every wake-up and after every send the socket is drained until ZMQ_EVENTS
    has no POLLIN left: a message can never sit unseen. (zmq.asyncio, which
    AsyncKernelClient uses, missed such an edge now and then under load: a
    reply sat in the socket while its reader waited forever.)"""

    def __init__(self, loop, conn, on_shell, on_iopub):
        def url(port):
            if conn["transport"] == "ipc":
                return "ipc://%s-%d" % (conn["ip"], port)
            return "%s://%s:%d" % (conn["transport"], conn["ip"], port)

        self._loop = loop
        ctx = zmq.Context.instance()
        self.shell = ctx.socket(zmq.DEALER)
        self.iopub = ctx.socket(zmq.SUB)
        for sock in (self.shell, self.iopub):
            sock.linger = 0
        self.shell.connect(url(conn["shell_port"]))
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(url(conn["iopub_port"]))
        self._routes = ((self.shell, on_shell), (self.iopub, on_iopub))
        self._fds = []
        for sock, deliver in self._routes:
            fd = sock.getsockopt(zmq.FD)
            loop.add_reader(fd, self._drain, sock, deliver)
            self._fds.append(fd)
            loop.call_soon(self._drain, sock, deliver)

    def _drain(self, sock, deliver):
        while not sock.closed and sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            deliver(frames)

    def send(self, frames):
        self.shell.send_multipart(frames, copy=False)
        self._loop.call_soon(self._drain, *self._routes[0])  # the send may have taken a reply's edge

    def close(self):
        for fd in self._fds:
            self._loop.remove_reader(fd)
        self._fds = []
        for sock, _ in self._routes:
            sock.close()


class PythonKernel(Kernel):
    language = "python"

    def __init__(self, cfg, cwd):
        super().__init__(cfg, cwd)
        self.km = None
        self.session = None
        self._wire = None
        self._handlers = {}
        self._pgid = None
        self._proc = None
        self._cell = None

    def pgid(self):
        return self._pgid

    async def _start(self):
        cfg = self.cfg
        env = dict(os.environ)
        env.update(cfg.kernel_env)
        env["IPYTHONDIR"] = cfg.ipython_dir
        env["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
        env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
        ksm = KernelSpecManager(kernel_dirs=[os.path.join(cfg.work_dir, "kernels")], ensure_native_kernel=False)
        # The connection file (it holds the HMAC key) in the server's runtime dir,
        # which a restarted server clears: jupyter_client would put it in /tmp.
        conn_file = os.path.join(cfg.runtime_dir, "kernel-%s.json" % secrets.token_hex(8))
        self.km = AsyncKernelManager(kernel_name="space-python", kernel_spec_manager=ksm, connection_file=conn_file)
        try:
            await self.km.start_kernel(cwd=self.cwd, env=env)
        finally:
            self._watch()  # also when the start was cut short after the launch
        if self._proc is None:
            raise KernelStartError("jupyter_client started no python kernel process")
        self.session = self.km.session
        self._wire = _Wire(self.loop, self.km.get_connection_info(), self._on_shell, self._on_iopub)
        await self._handshake()

    def _watch(self):
        """Watches the launched process: one thread per kernel blocked in waitpid (no polling)."""
        prov = self.km.provisioner if self.km is not None else None
        proc = getattr(prov, "process", None)
        if proc is None or self._proc is not None:
            return
        self._proc = proc
        self._pgid = getattr(prov, "pgid", None) or proc.pid
        threading.Thread(target=self._wait_process, args=(proc,), name="kernel-wait", daemon=True).start()

    def has_process(self):
        return self._proc is not None

    def _wait_process(self, proc):
        status = proc.wait()
        try:
            self.loop.call_soon_threadsafe(self._set_exited, describe_exit(status))
        except RuntimeError:  # the loop is closed: the server is exiting
            pass

    async def _handshake(self):
        """Ready means: a kernel_info reply arrived AND iopub delivers (a SUB socket
        that is not subscribed yet would lose the first cell's output)."""
        loop = self.loop
        while True:
            replied = loop.create_future()
            seen_iopub = loop.create_future()
            msg_id = self._send("kernel_info_request", {})
            self._handlers[msg_id] = _Probe(replied, seen_iopub)
            try:
                await asyncio.wait([replied, self.exited], return_when=asyncio.FIRST_COMPLETED)
                if self.dead():
                    raise KernelStartError("the python kernel died while starting: %s" % self.exited.result())
                try:
                    await asyncio.wait_for(seen_iopub, 0.5)
                    return
                except asyncio.TimeoutError:
                    pass  # iopub was not connected yet: ask again
            finally:
                self._handlers.pop(msg_id, None)

    def _send(self, msg_type, content):
        msg = self.session.msg(msg_type, content=content)
        self._wire.send(self.session.serialize(msg))
        return msg["header"]["msg_id"]

    def _execute(self, code, silent):
        return self._send("execute_request", {
            "code": code,
            "silent": silent,
            "store_history": not silent,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": False,
        })

    def _decode(self, frames):
        try:
            _, parts = self.session.feed_identities(frames, copy=False)
            return self.session.deserialize(parts, content=True, copy=False)
        except Exception:
            log.warning("python kernel: dropped a message that did not deserialize")
            return None

    def _on_shell(self, frames):
        msg = self._decode(frames)
        if msg is not None:
            try:
                self._route_reply(msg)
            except Exception:
                log.exception("python kernel: handling a %s message failed", msg.get("msg_type"))

    def _on_iopub(self, frames):
        msg = self._decode(frames)
        if msg is not None:
            try:
                self._route_iopub(msg)
            except Exception:
                log.exception("python kernel: handling a %s message failed", msg.get("msg_type"))

    def _route_reply(self, msg):
        h = self._handlers.get(msg["parent_header"].get("msg_id"))
        if h is not None:
            h.on_reply(msg)

    def _route_iopub(self, msg):
        h = self._handlers.get(msg["parent_header"].get("msg_id"))
        if h is not None:
            h.on_iopub(msg)

    def submit(self, cell):
        pending = [0]

        def track(handler, msg_id, after):
            pending[0] += 1

            def done(h):
                self._handlers.pop(msg_id, None)
                after(h)
                pending[0] -= 1
                if pending[0] == 0:
                    cell.finish()

            handler.on_done = done
            self._handlers[msg_id] = handler

        # Both requests are queued at once; the kernel runs them in order. The
        # cell's env vars are restored by the kernel itself when the cell ends.
        if cell.env or cell.global_env:
            code = "__import__('_space_env').push(%r, %r)" % (cell.env, cell.global_env)
            track(_Handler(None), self._execute(code, True), _env_done)
        msg_id = self._execute(cell.code, False)
        self._cell = _CellHandler(cell, None)
        track(self._cell, msg_id, _cell_done)

    async def interrupt(self, cell):
        """Jupyter's interrupt for a signal-mode kernel: SIGINT to its process group
        (what AsyncKernelManager.interrupt_kernel does), once the cell has started."""
        h = self._cell
        if h is not None and h.cell is cell and not h.started:
            h.on_start = lambda: self.signal(signal.SIGINT)
            return
        self.signal(signal.SIGINT)

    async def _cleanup(self):
        if self._wire is not None:
            self._wire.close()
            self._wire = None
        if self.km is not None and self.km.has_kernel:
            try:
                await self.km.cleanup_resources()
            except Exception as e:
                log.debug("python kernel cleanup: %s", e)
