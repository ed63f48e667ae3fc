"""What every kernel of a context is, and how one cell runs on it.

A Kernel is one process (an IPython kernel, a bash, a node harness) owned by
one context. Its lifecycle: start() once; then submit() cells one at a time
(the context's lock serialises them); interrupt() asks the running cell to
stop; kill() ends the process. `exited` resolves, with a sentence saying how,
once the process is gone, whoever ended it. A Kernel is never restarted in
place: the context replaces it with a new one.

run_cell() is the one place that waits on a cell: for its end, the kernel's
death, the client's disconnect or the request's timeout, and that interrupts,
escalates to a kill and reports.
"""

import asyncio
import logging
import os
import signal

import wire

log = logging.getLogger("space-code-interpreter")


class KernelStartError(Exception):
    pass


class Cell:
    """One execution: the code, the env vars for it, and where its lines go.

    The kernel calls emit() for output as it arrives and resolves `done` once
    the cell (and any restoring of env vars after it) has finished. When the
    server interrupted the cell, `interrupted` is set first, so the kernel
    leaves out its own KeyboardInterrupt-like error.
    """

    __slots__ = ("code", "env", "global_env", "out", "done", "interrupted", "count")

    def __init__(self, code, env, global_env, out):
        self.code = code
        self.env = env or {}
        self.global_env = global_env or {}
        self.out = out
        self.done = asyncio.get_running_loop().create_future()
        self.interrupted = False
        self.count = None

    def emit(self, obj):
        self.out.emit(obj)

    def finish(self):
        if not self.done.done():
            self.done.set_result(None)


def describe_exit(status):
    """How a process ended, from a waitpid-style return code (negative: signal)."""
    if status is None:
        return "the kernel process is gone"
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = "signal %d" % -status
        return "the kernel process was killed by %s" % name
    return "the kernel process exited with status %d" % status


# Why we ended a kernel ourselves, and what a cell that was running then reports.
STOPPED = {
    "restart": ("KernelRestarted", "the context was restarted while the cell ran; its state is lost"),
    "delete": ("ContextDeleted", "the context was removed while the cell ran"),
    "shutdown": ("ServerShutdown", "the code-interpreter server shut down while the cell ran"),
    "stuck": ("DeadKernelError", "the kernel was killed: it did not stop after an interrupt; it will be restarted on the next call"),
}


class Kernel:
    language = None

    def __init__(self, cfg, cwd):
        self.cfg = cfg
        self.cwd = cwd
        self.loop = asyncio.get_running_loop()
        self.exited = self.loop.create_future()
        self.stop_reason = None
        self._start_task = None

    # --- lifecycle -----------------------------------------------------------

    def start(self):
        """Starts the kernel in the background; ready() waits for it."""
        if self._start_task is None:
            self._start_task = asyncio.ensure_future(self._start_guarded())
        return self._start_task

    async def _start_guarded(self):
        try:
            await asyncio.wait_for(self._start(), self.cfg.start_timeout)
        except asyncio.CancelledError:
            # stop() while starting: a waiter sees a start error, not a cancellation.
            self.kill()
            raise KernelStartError("the %s kernel was stopped while it started" % self.language) from None
        except asyncio.TimeoutError:
            self.kill()
            raise KernelStartError("the %s kernel did not start within %g s" % (self.language, self.cfg.start_timeout))
        except KernelStartError:
            self.kill()
            raise
        except Exception as e:  # a kernel that cannot start is reported, not fatal
            log.exception("%s kernel failed to start", self.language)
            self.kill()
            raise KernelStartError("the %s kernel failed to start: %s" % (self.language, e)) from e

    async def ready(self):
        await asyncio.shield(self.start())

    def started(self):
        """Started and up (the hot path's check before awaiting ready())."""
        t = self._start_task
        return t is not None and t.done() and not t.cancelled() and t.exception() is None

    def start_failed(self):
        t = self._start_task
        return t is not None and t.done() and (t.cancelled() or t.exception() is not None)

    def dead(self):
        return self.exited.done()

    def _set_exited(self, how):
        if not self.exited.done():
            self.exited.set_result(how)

    async def stop(self, reason, graceful=False):
        """Ends the kernel for `reason` (a key of STOPPED) and waits for its process."""
        if self.stop_reason is None:
            self.stop_reason = reason
        if self._start_task is not None and not self._start_task.done():
            self._start_task.cancel()
            try:
                await self._start_task
            except (KernelStartError, asyncio.CancelledError):
                pass
        if not self.has_process():
            self._set_exited("the kernel was never started")
        if graceful and not self.dead():
            self.terminate()
            try:
                await asyncio.wait_for(asyncio.shield(self.exited), 1.0)
            except asyncio.TimeoutError:
                pass
        self.kill()
        try:
            await asyncio.wait_for(asyncio.shield(self.exited), 5.0)
        except asyncio.TimeoutError:
            log.warning("%s kernel did not exit after SIGKILL", self.language)
        await self._cleanup()

    # --- what a kernel implements -------------------------------------------

    async def _start(self):
        raise NotImplementedError

    def submit(self, cell):
        """Sends a cell to the kernel; the kernel emits its lines and resolves cell.done."""
        raise NotImplementedError

    def pgid(self):
        """The kernel's process group (it leads its own session), or None."""
        raise NotImplementedError

    def has_process(self):
        """Whether a process was started (and so `exited` will resolve)."""
        raise NotImplementedError

    async def interrupt(self, cell):
        self.signal(signal.SIGINT)

    def signal(self, signum):
        pgid = self.pgid()
        if pgid is None:
            return
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def terminate(self):
        """Asks the kernel's process group to exit (SIGKILL follows after 1 s)."""
        self.signal(signal.SIGTERM)

    def kill(self):
        self.signal(signal.SIGKILL)

    async def _cleanup(self):
        pass


async def run_cell(kernel, cell, timeout):
    """Runs `cell` on a started `kernel` and emits its closing lines (not
    end_of_execution). Returns once the kernel is free for the next cell: after
    the cell ended, after an interrupt took effect, or after the kernel died or
    was killed."""
    loop = kernel.loop
    out = cell.out
    kernel.submit(cell)
    waits = [cell.done, kernel.exited, out.closed]
    timer = None
    expired = None
    if timeout is not None:
        expired = loop.create_future()
        timer = loop.call_later(timeout, _resolve, expired)
        waits.append(expired)
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if timer is not None:
            timer.cancel()
    if not cell.done.done() and not kernel.dead():
        # Timed out, or the client went away: interrupt, and wait for the kernel
        # to be idle again so that the next cell on this context runs normally.
        cell.interrupted = True
        why = "timeout" if expired is not None and expired.done() else "client disconnect"
        log.info("interrupting a %s cell (%s)", kernel.language, why)
        await kernel.interrupt(cell)
        grace = kernel.cfg.interrupt_grace
        await asyncio.wait([cell.done, kernel.exited], timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        if not cell.done.done() and not kernel.dead():
            log.warning("a %s cell did not stop within %g s of the interrupt; killing its kernel", kernel.language, grace)
            kernel.stop_reason = kernel.stop_reason or "stuck"
            kernel.kill()
            cell.emit(wire.stream("stderr", "[space] the cell did not stop within %g s of the interrupt; the kernel was killed and will be restarted on the next call\n" % grace))
            try:
                await asyncio.wait_for(asyncio.shield(kernel.exited), 5.0)
            except asyncio.TimeoutError:
                pass
        if why == "timeout":
            cell.emit(wire.error("TimeoutError", "execution timed out after %s s; the cell was interrupted" % _seconds(timeout)))
    elif not cell.done.done():
        name, value = STOPPED.get(kernel.stop_reason, (None, None))
        if name is None or kernel.stop_reason == "stuck":
            name, value = "DeadKernelError", "%s while the cell ran; it will be restarted on the next call" % kernel.exited.result()
        cell.emit(wire.error(name, value))
    if cell.count is not None:
        cell.emit(wire.executions(cell.count))


def _resolve(fut):
    if not fut.done():
        fut.set_result(None)


def _seconds(value):
    return "%g" % value
