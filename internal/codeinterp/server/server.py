#!/usr/bin/python3
"""The SPACE code-interpreter server: the HTTP API that the unmodified
@e2b/code-interpreter SDK talks to inside a sandbox (port 49999).

  GET    /health                 200 "OK" once the default python kernel answered kernel_info; 503 before
  POST   /execute                NDJSON stream of a cell's output (see wire.py)
  GET    /contexts               [{id, language, cwd}]
  POST   /contexts               {language?, cwd?} -> {id, language, cwd}
  DELETE /contexts/{id}          null
  POST   /contexts/{id}/restart  null

It runs as the sandbox's unprivileged user, with Debian bookworm's python3,
tornado, jupyter_client and ipykernel, and node 18 for javascript. Logs go to
stderr; they never carry tokens, env var values or code.
"""

import argparse
import asyncio
import json
import logging
import math
import os
import shutil
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import tornado.httpclient  # noqa: E402
import tornado.web  # noqa: E402
from tornado.iostream import StreamClosedError  # noqa: E402

import wire  # noqa: E402
from contexts import BadRequest, NotFound, Registry, TooMany, normalize_language, valid_env_name  # noqa: E402
from kernel import KernelStartError  # noqa: E402

log = logging.getLogger("space-code-interpreter")

MAX_CODE = 1 << 20  # bytes of code in one /execute
MAX_BODY = 16 << 20  # bytes of a request body (JSON escaping can grow the code)


class Output:
    """The NDJSON body of one /execute: lines are buffered whole and flushed
    together once per loop iteration (never split), a keepalive goes out after
    each `keepalive` seconds of silence, and `closed` resolves when the client
    goes away."""

    def __init__(self, handler, keepalive):
        self.h = handler
        self.loop = asyncio.get_running_loop()
        self.closed = self.loop.create_future()
        self.last = self.loop.time()
        self._flush_due = False
        self._every = keepalive
        self._ka = self.loop.call_at(self.last + keepalive, self._keepalive)

    def emit(self, obj):
        if self.closed.done():
            return
        self.h.write(wire.encode(obj))
        self.last = self.loop.time()
        if not self._flush_due:
            self._flush_due = True
            self.loop.call_soon(self._flush)

    def _flush(self):
        self._flush_due = False
        if self.closed.done():
            return
        try:
            fut = self.h.flush()
        except StreamClosedError:
            self.close()
            return
        fut.add_done_callback(self._flushed)

    def _flushed(self, fut):
        if fut.cancelled() or fut.exception() is not None:
            self.close()

    def close(self):
        if not self.closed.done():
            self.closed.set_result(None)

    def _keepalive(self):
        if self.closed.done():
            return
        if self.loop.time() >= self.last + self._every - 0.001:
            self.emit(wire.KEEPALIVE)
        self._ka = self.loop.call_at(self.last + self._every, self._keepalive)

    def end(self):
        self._ka.cancel()
        if self.closed.done():
            return
        self.h.write(wire.encode(wire.END))
        try:
            self.h.finish()
        except (StreamClosedError, RuntimeError):
            pass


class Base(tornado.web.RequestHandler):
    def initialize(self, registry, cfg):
        self.registry = registry
        self.cfg = cfg

    def set_default_headers(self):
        self.clear_header("Server")

    def plain(self, status, text):
        self.set_status(status)
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(text)

    def json(self, obj, status=200):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    def write_error(self, status_code, **kwargs):
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(self._reason)

    def body(self, empty_ok):
        raw = self.request.body
        if not raw.strip():
            if empty_ok:
                return {}
            raise BadRequest("the body must be a JSON object")
        try:
            data = json.loads(raw)
        except ValueError:
            raise BadRequest("the body is not valid JSON")
        if not isinstance(data, dict):
            raise BadRequest("the body must be a JSON object")
        return data

    async def guarded(self, fn, *args):
        try:
            await fn(*args)
        except BadRequest as e:
            self.plain(400, str(e))
        except NotFound as e:
            self.plain(404, str(e))
        except TooMany as e:
            self.plain(429, str(e))
        except KernelStartError as e:
            self.plain(500, str(e))


class Health(Base):
    def get(self):
        ok, text = self.registry.health()
        self.plain(200 if ok else 503, text)


class Contexts(Base):
    def get(self):
        self.json(self.registry.listing())

    async def post(self):
        await self.guarded(self.handle_create)

    async def handle_create(self):
        body = self.body(empty_ok=True)
        lang = body.get("language")
        lang = "python" if lang is None else normalize_language(lang)
        cwd = self.registry.resolve_cwd(body.get("cwd"))
        ctx = await self.registry.create(lang, cwd)
        self.json(ctx.describe())


class OneContext(Base):
    async def delete(self, cid):
        await self.guarded(self.handle_delete, cid)

    async def handle_delete(self, cid):
        await self.registry.delete(cid)
        self.json(None)


class Restart(Base):
    async def post(self, cid):
        await self.guarded(self.handle_restart, cid)

    async def handle_restart(self, cid):
        await self.registry.restart(cid)
        self.json(None)


class Execute(Base):
    out = None

    async def post(self):
        await self.guarded(self.handle_execute)

    def on_connection_close(self):
        if self.out is not None:
            self.out.close()

    async def handle_execute(self):
        body = self.body(empty_ok=False)
        code = body.get("code")
        if not isinstance(code, str):
            raise BadRequest("code must be a string")
        if len(code) > MAX_CODE or len(code.encode("utf-8", "surrogatepass")) > MAX_CODE:
            self.plain(413, "code is larger than 1 MiB")
            return
        cid, lang = body.get("context_id"), body.get("language")
        if cid is not None and lang is not None:
            raise BadRequest("give context_id or language, not both")
        env = _env_vars(body.get("env_vars"))
        timeout = _timeout(body.get("timeout"))
        if cid is not None:
            ctx = self.registry.get(cid)
        elif lang is not None:
            ctx = self.registry.for_language(normalize_language(lang))
        else:
            ctx = self.registry.for_language("python")

        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("Cache-Control", "no-store")
        stream = self.request.connection.stream
        if stream is not None:
            stream.set_nodelay(True)  # small lines must not wait for an ACK (Nagle)
        self.out = Output(self, self.cfg.keepalive)
        # Headers at once (the SDK's timeoutMs starts when they arrive), with a first
        # keepalive line in the same write: a proxy that holds headers back until the
        # first body byte (node's http, Go's ReverseProxy) passes them on at once too.
        self.write(wire.encode(wire.KEEPALIVE))
        self.flush()
        try:
            await ctx.execute(code, env, timeout, self.request.headers.get("X-Access-Token"), self.out)
        except Exception:
            log.exception("execute failed")
            self.out.emit(wire.error("InternalError", "the code-interpreter server failed running the cell; see its log"))
        self.out.end()


def _env_vars(value):
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest("env_vars must be an object of strings")
    for k, v in value.items():
        if not valid_env_name(k):
            raise BadRequest("env var name %r is not a valid name (letters, digits and _, not starting with a digit)" % k)
        if not isinstance(v, str) or "\0" in v:
            raise BadRequest("env var %s: the value must be a string without NUL" % k)
    return dict(value)


def _timeout(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BadRequest("timeout must be a positive number of seconds")
    return float(value)


class Missing(Base):
    def prepare(self):
        self.plain(404, "not found")


def _access_log(handler):
    """Server errors only: health is polled while it answers 503, and a line per
    request would cost the hot path."""
    status = handler.get_status()
    if status >= 500 and not isinstance(handler, Health):
        log.warning("%d %s %s %.1fms", status, handler.request.method, handler.request.path, 1000 * handler.request.request_time())


class Config:
    def __init__(self, args):
        home = os.environ.get("HOME") or "/home/user"
        self.host = args.host
        self.port = args.port
        self.state = os.path.abspath(args.state or os.path.join(home, ".local", "state", "space-code-interpreter", "contexts.json"))
        self.home_cwd = os.path.abspath(args.home_cwd or home)
        self.envs_url = args.envs_url
        self.python = args.python
        self.node = args.node
        self.bash = args.bash
        self.max_contexts = args.max_contexts
        self.interrupt_grace = args.interrupt_grace
        self.start_timeout = args.start_timeout
        self.keepalive = args.keepalive
        self.work_dir = os.path.dirname(self.state)
        self.ipython_dir = os.path.join(self.work_dir, "ipython")
        self.runtime_dir = os.path.join(self.work_dir, "runtime")
        self.kernel_env = {}


def parse_args(argv):
    p = argparse.ArgumentParser(description="SPACE code-interpreter server (the E2B code-interpreter wire)")
    p.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=49999, help="port to listen on (default 49999)")
    p.add_argument("--state", default=None, help="contexts state file (default $HOME/.local/state/space-code-interpreter/contexts.json)")
    p.add_argument("--home-cwd", default=None, help="default cwd of contexts (default $HOME)")
    p.add_argument("--envs-url", default="http://127.0.0.1:49983/envs", help="the agent's global env vars (GET, X-Access-Token)")
    p.add_argument("--python", default=sys.executable or "/usr/bin/python3", help="python of the ipykernel kernels")
    p.add_argument("--node", default="/usr/bin/node", help="node for javascript contexts")
    p.add_argument("--bash", default="/bin/bash", help="bash for bash contexts")
    p.add_argument("--max-contexts", type=int, default=32)
    p.add_argument("--interrupt-grace", type=float, default=10.0, help="seconds an interrupted cell may take to stop before its kernel is killed")
    p.add_argument("--start-timeout", type=float, default=60.0, help="seconds a kernel may take to start")
    p.add_argument("--keepalive", type=float, default=5.0, help="seconds of silence before a keepalive line")
    return p.parse_args(argv)


async def serve(cfg):
    from pykernel import prepare_ipython_dir

    os.makedirs(cfg.work_dir, mode=0o700, exist_ok=True)
    # Kernel connection files (they hold HMAC keys) and bash cell files. Whatever an
    # earlier server left there (it was killed) belongs to no kernel any more.
    shutil.rmtree(cfg.runtime_dir, ignore_errors=True)
    os.makedirs(cfg.runtime_dir, mode=0o700, exist_ok=True)
    os.environ["JUPYTER_RUNTIME_DIR"] = cfg.runtime_dir
    prepare_ipython_dir(cfg)

    registry = Registry(cfg, tornado.httpclient.AsyncHTTPClient())
    kw = dict(registry=registry, cfg=cfg)
    app = tornado.web.Application(
        [
            (r"/health", Health, kw),
            (r"/execute", Execute, kw),
            (r"/contexts", Contexts, kw),
            (r"/contexts/([^/]+)", OneContext, kw),
            (r"/contexts/([^/]+)/restart", Restart, kw),
        ],
        default_handler_class=Missing,
        default_handler_args=kw,
        compress_response=False,
        log_function=_access_log,
    )
    server = app.listen(cfg.port, address=cfg.host, max_body_size=MAX_BODY, xheaders=False)
    log.info("listening on %s:%d (state %s)", cfg.host, cfg.port, cfg.state)
    await registry.start()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    server.stop()
    await registry.shutdown()
    await asyncio.sleep(0.05)  # cells that were running flush their closing lines
    log.info("stopped")


def main(argv=None):
    cfg = Config(parse_args(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s space-code-interpreter %(levelname)s %(message)s")
    asyncio.run(serve(cfg))


if __name__ == "__main__":
    main()
