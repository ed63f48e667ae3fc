"""Contexts: a kernel each, keyed by a random id, and the state file that lets
them outlive the server (a file-only snapshot keeps files, not processes).

A Context owns at most one Kernel at a time and a lock that serialises its
executions. Restart and delete do not take the lock: they replace or end the
kernel at once, and a cell running on it then ends with an error saying so.
The state file lists id, language, cwd and the default flag of every context;
it is rewritten (temp file, fsync, rename, fsync of the dir) on every change.
"""

import asyncio
import json
import logging
import os
import secrets

import wire
from kernel import Cell, KernelStartError, run_cell
from prockernel import BashKernel, JSKernel, TSKernel
from pykernel import PythonKernel

log = logging.getLogger("space-code-interpreter")

# typescript runs on the javascript kernel (the node harness), which strips types
# when the typescript compiler is installed; its contexts are its own.
KERNELS = {"python": PythonKernel, "javascript": JSKernel, "typescript": TSKernel, "bash": BashKernel}
ALIASES = {"js": "javascript", "ts": "typescript", "sh": "bash"}
LANGUAGES = "python, javascript (also js), typescript (also ts; the javascript kernel) and bash (also sh)"

RESTORED = "restored from a file snapshot: kernel state was not kept"


class BadRequest(Exception):
    pass


class NotFound(Exception):
    pass


class TooMany(Exception):
    pass


def normalize_language(name):
    """The kernel language for a name the SDK sends, or BadRequest."""
    if not isinstance(name, str):
        raise BadRequest("language must be a string")
    lang = name.strip().lower()
    lang = ALIASES.get(lang, lang)
    if lang not in KERNELS:
        raise BadRequest("unknown language %r: this server runs %s" % (name, LANGUAGES))
    return lang


class Context:
    def __init__(self, registry, cid, language, cwd, default):
        self.registry = registry
        self.id = cid
        self.language = language
        self.cwd = cwd
        self.default = default
        self.kernel = None
        self.lock = asyncio.Lock()
        self.notice = None  # why the kernel was replaced behind the user's back; told once
        self.envs_loaded = False
        self.deleted = False

    def describe(self):
        d = {"id": self.id, "language": self.language, "cwd": self.cwd}
        if self.notice is not None:
            d["restarted"] = True
        return d

    def record(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd, "default": self.default}

    def new_kernel(self):
        cwd = self.cwd if os.path.isdir(self.cwd) else self.registry.cfg.home_cwd
        if cwd != self.cwd:
            log.warning("context %s: its cwd is gone; its kernel starts in %s", self.id[:8], cwd)
        self.kernel = KERNELS[self.language](self.registry.cfg, cwd)
        self.kernel.start()
        self.envs_loaded = False
        return self.kernel

    async def ensure_kernel(self, out):
        """The context's kernel, started; restarted first if it had died (and
        then says so on `out`). Returns None after emitting an error line."""
        while True:
            k = self.kernel
            if k is None or k.dead() or k.start_failed():
                if k is not None and k.dead() and not k.start_failed() and self.notice is None:
                    if k.stop_reason == "stuck":
                        self.notice = "the kernel was killed: a cell did not stop after an interrupt"
                    else:
                        self.notice = k.exited.result()
                if k is not None:
                    await k.stop("restart")  # a dead one too: its sockets, tasks and files go
                k = self.new_kernel()
            try:
                if not k.started():
                    await k.ready()
                break
            except KernelStartError as e:
                if self.kernel is not k and not self.deleted:
                    continue  # restarted while it started: use the new one
                out.emit(wire.error("KernelStartError", str(e)))
                return None
        if self.notice is not None:
            out.emit(wire.stream("stderr", wire.RESTART_NOTICE))
            out.emit(wire.kernel_restarted(self.notice))
            self.notice = None
        return k

    async def execute(self, code, env, timeout, token, out):
        """Runs one cell, after any earlier one on this context; emits its lines."""
        if self.lock.locked():
            waiter = asyncio.ensure_future(self.lock.acquire())
            await asyncio.wait([waiter, out.closed], return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                waiter.cancel()  # the client left while waiting: do not run it
                try:
                    await waiter
                    self.lock.release()
                except asyncio.CancelledError:
                    pass
                return
        else:
            await self.lock.acquire()  # free: taken at once
        try:
            if self.deleted:
                out.emit(wire.error("ContextDeleted", "the context was removed before the cell ran"))
                return
            kernel = await self.ensure_kernel(out)
            if kernel is None:
                return
            global_env = None
            if not self.envs_loaded and token:
                self.envs_loaded = True
                global_env = await self.registry.fetch_envs(token)
            await run_cell(kernel, Cell(code, env, global_env, out), timeout)
        finally:
            self.lock.release()


class Registry:
    def __init__(self, cfg, http_client):
        self.cfg = cfg
        self.http = http_client
        self.contexts = {}  # id -> Context, in creation order
        self.python_ready = False
        self.python_error = None
        self._restarting_python = None

    # --- start, persistence ----------------------------------------------------

    def load(self):
        """Contexts from the state file, or none. A broken file is logged and ignored."""
        try:
            with open(self.cfg.state, "rb") as f:
                data = json.load(f)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            log.error("ignoring the state file %s: %s", self.cfg.state, e)
            return []
        out = []
        for rec in data.get("contexts", []) if isinstance(data, dict) else []:
            try:
                cid, lang, cwd = rec["id"], rec["language"], rec["cwd"]
                if not (isinstance(cid, str) and isinstance(cwd, str) and lang in KERNELS):
                    raise ValueError
                out.append((cid, lang, cwd, bool(rec.get("default"))))
            except (KeyError, TypeError, ValueError):
                log.error("ignoring a bad context record in %s", self.cfg.state)
        return out

    def save(self):
        path = self.cfg.state
        data = json.dumps({"version": 1, "contexts": [c.record() for c in self.contexts.values()]}, indent=1).encode()
        d = os.path.dirname(path) or "."
        os.makedirs(d, exist_ok=True)
        tmp = "%s.tmp.%d" % (path, os.getpid())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        try:
            dfd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass

    async def start(self):
        """Restores or creates the contexts and starts their kernels: the default
        python one first (health waits for it), the default javascript one beside
        it, any others after python is up."""
        restored = self.load()
        for cid, lang, cwd, default in restored:
            if cid in self.contexts or (default and self.default_context(lang) is not None):
                continue
            ctx = Context(self, cid, lang, cwd, default)
            ctx.notice = RESTORED
            self.contexts[cid] = ctx
        for lang in ("python", "javascript"):
            if self.default_context(lang) is None:
                self._add(lang, self.cfg.home_cwd, True)
        # Python first in the list, then javascript, then the rest.
        order = [self.default_context("python"), self.default_context("javascript")]
        order += [c for c in self.contexts.values() if c not in order]
        self.contexts = {c.id: c for c in order}
        self.save()
        py = order[0]
        py.new_kernel()
        order[1].new_kernel()
        asyncio.ensure_future(self._python_up(py.kernel, rest=order[2:]))
        if restored:
            log.info("restored %d contexts from %s", len(self.contexts), self.cfg.state)

    async def _python_up(self, kernel, rest=()):
        try:
            await kernel.ready()
            self.python_ready = True
            self.python_error = None
            log.info("the default python kernel is ready")
        except KernelStartError as e:
            self.python_error = str(e)
            log.error("the default python kernel did not start: %s", e)
        for ctx in rest:  # one at a time: this box has two cores
            if ctx.kernel is None and not ctx.deleted:
                k = ctx.new_kernel()
                try:
                    await k.ready()
                except KernelStartError as e:
                    log.error("context %s: %s", ctx.id[:8], e)

    def health(self):
        """(ok, text). A default python kernel that failed to start is retried here,
        so the ready check that polls health also drives the retry."""
        if self.python_ready:
            return True, "OK"
        py = self.default_context("python")
        if py is not None and py.kernel is not None and py.kernel.start_failed() and self._restarting_python is None:
            k = py.new_kernel()

            async def retry():
                try:
                    await self._python_up(k)
                finally:
                    self._restarting_python = None

            self._restarting_python = asyncio.ensure_future(retry())
        return False, "starting: the default python kernel is not ready" + (" (%s)" % self.python_error if self.python_error else "")

    async def shutdown(self):
        await asyncio.gather(*(c.kernel.stop("shutdown", graceful=True) for c in self.contexts.values() if c.kernel is not None), return_exceptions=True)

    # --- contexts ----------------------------------------------------------------

    def _add(self, language, cwd, default, cid=None):
        if len(self.contexts) >= self.cfg.max_contexts:
            raise TooMany("at most %d contexts per sandbox: remove one first" % self.cfg.max_contexts)
        cid = cid or secrets.token_hex(16)
        ctx = Context(self, cid, language, cwd, default)
        self.contexts[cid] = ctx
        return ctx

    def listing(self):
        """Every context: the default python one first, then the default javascript one."""
        first = [c for c in (self.default_context("python"), self.default_context("javascript")) if c is not None]
        return [c.describe() for c in first + [c for c in self.contexts.values() if c not in first]]

    def get(self, cid):
        ctx = self.contexts.get(cid) if isinstance(cid, str) else None
        if ctx is None:
            raise NotFound("context %r not found" % cid)
        return ctx

    def default_context(self, language):
        for c in self.contexts.values():
            if c.default and c.language == language:
                return c
        return None

    def for_language(self, language):
        """The language's default context, created (and its kernel started) on first use."""
        ctx = self.default_context(language)
        if ctx is None:
            ctx = self._add(language, self.cfg.home_cwd, True)
            ctx.new_kernel()
            self.save()
        return ctx

    def resolve_cwd(self, cwd):
        if cwd is None:
            return self.cfg.home_cwd
        if not isinstance(cwd, str) or not cwd.strip():
            raise BadRequest("cwd must be a non-empty string")
        path = os.path.normpath(os.path.join(self.cfg.home_cwd, cwd))
        if not os.path.isdir(path):
            raise BadRequest("cwd %r is not an existing directory" % cwd)
        return path

    async def create(self, language, cwd):
        ctx = self._add(language, cwd, False)
        self.save()
        k = ctx.new_kernel()
        try:
            await k.ready()
        except KernelStartError:
            await self.delete(ctx.id)
            raise
        return ctx

    async def delete(self, cid):
        ctx = self.get(cid)
        ctx.deleted = True
        del self.contexts[cid]
        self.save()
        if ctx.kernel is not None:
            await ctx.kernel.stop("delete")

    async def restart(self, cid):
        ctx = self.get(cid)
        old = ctx.kernel
        ctx.notice = None
        k = ctx.new_kernel()
        if old is not None:
            await old.stop("restart")
        await k.ready()

    # --- the agent's global env vars ---------------------------------------------

    async def fetch_envs(self, token):
        """The sandbox's env vars from the agent (GET /envs), or None. Never logs the token."""
        from tornado.httpclient import HTTPClientError, HTTPRequest

        req = HTTPRequest(self.cfg.envs_url, headers={"X-Access-Token": token}, connect_timeout=1.0, request_timeout=2.0)
        try:
            resp = await self.http.fetch(req)
            data = json.loads(resp.body)
        except HTTPClientError as e:
            log.info("agent envs: %s answered %s; skipping them", self.cfg.envs_url, e.code)
            return None
        except Exception as e:
            log.info("agent envs: %s: %s; skipping them", self.cfg.envs_url, type(e).__name__)
            return None
        if not isinstance(data, dict):
            log.info("agent envs: not a JSON object; skipping them")
            return None
        return {k: str(v) for k, v in data.items() if isinstance(k, str) and valid_env_name(k) and v is not None}


def valid_env_name(name):
    return bool(name) and (name[0].isalpha() or name[0] == "_") and all(ch.isalnum() or ch == "_" for ch in name) and name.isascii()
