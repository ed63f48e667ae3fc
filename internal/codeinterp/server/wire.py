"""The NDJSON lines of POST /execute, as the @e2b/code-interpreter SDK reads them.

Every line is one JSON object with a "type" (stdout, stderr, result, error,
number_of_executions, keepalive, end_of_execution, and our kernel_restarted,
which the SDK ignores). This module builds those objects and encodes them; it
knows nothing about kernels or HTTP.
"""

import json
import re

# Jupyter MIME types and the flattened keys E2B's Result carries them in. Any
# other MIME type of a bundle goes into the result's "extra" object.
MIME_KEYS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def strip_ansi(text):
    """Removes terminal escape sequences (a traceback should have none already)."""
    if "\x1b" not in text:
        return text
    return _ANSI.sub("", text)


def strip_quotes(text):
    """Drops ONE pair of surrounding quotes, as E2B's server does for a str's repr."""
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def result(bundle, is_main):
    """A result line from a Jupyter MIME bundle (execute_result or display_data)."""
    line = {"type": "result", "is_main_result": is_main}
    extra = {}
    for mime, value in bundle.items():
        key = MIME_KEYS.get(mime)
        if key is None:
            extra[mime] = value
            continue
        if key == "text" and isinstance(value, str):
            value = strip_quotes(value)
        line[key] = value
    line["extra"] = extra
    return line


def text_result(text, is_main=True):
    return {"type": "result", "is_main_result": is_main, "text": strip_quotes(text), "extra": {}}


def stream(name, text):
    return {"type": name, "text": text}


def error(name, value, traceback=""):
    if isinstance(traceback, (list, tuple)):
        traceback = "\n".join(str(t) for t in traceback)
    return {
        "type": "error",
        "name": str(name),
        "value": strip_ansi(str(value)),
        "traceback": strip_ansi(str(traceback)),
    }


def executions(count):
    return {"type": "number_of_executions", "execution_count": count}


KEEPALIVE = {"type": "keepalive"}
END = {"type": "end_of_execution"}

RESTART_NOTICE = "[space] the kernel had died and was restarted; its state is lost\n"


def kernel_restarted(reason):
    return {"type": "kernel_restarted", "reason": reason}


def _finite(value):
    """value with NaN and infinities replaced by null, which JSON.parse accepts."""
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def encode(obj):
    """One line: compact JSON and a newline. JSON escapes every newline inside
    strings, so the line never contains a raw one, and it is never blank.

    The line is pure ASCII (\\uXXXX escapes, which JSON.parse decodes): the SDK
    decodes every network read with a fresh TextDecoder, so a UTF-8 character
    that a proxy or the network splits between two reads would turn into U+FFFD,
    however whole our writes are. ASCII cannot be split. (It also carries a
    kernel's lone surrogates safely.)"""
    try:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(obj), separators=(",", ":"))
    return text.encode("ascii") + b"\n"
