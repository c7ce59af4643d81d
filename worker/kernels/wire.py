"""A kernel bridge's events read as untrusted input: each checked and capped here, then
made the model's types (:mod:`.model`). The bridge already keeps to the caps below; a
bridge that does not (the sandbox's code can replace it) gets its excess dropped, never
buffered on."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sandbox.errors import ProtocolError

from .model import MIME_FIELDS, OUTCOMES, ExecutionError, Outcome, OutputMessage, Result, strip_ansi

#: What an execution keeps of each stream (then a line says how much was not kept).
MAX_STREAM = 1 << 20
#: The largest MIME value of a result kept (an image's base64); larger ones are dropped
#: and the result's text says so.
MAX_VALUE = 10 << 20
#: The results of one execution, in all, and how many.
MAX_RESULTS = 48 << 20
MAX_RESULT_COUNT = 1000
#: A traceback's characters kept (its end: where it was raised).
MAX_TRACEBACK = 64 << 10
#: The fields that are base64 of bytes.
_BASE64 = {"png", "jpeg", "pdf"}
#: Other MIME types kept in ``Result.extra`` per result.
MAX_EXTRA = 16


def _size(v: Any) -> int:
    if isinstance(v, str):
        return len(v)
    import json

    try:
        return len(json.dumps(v))
    except (TypeError, ValueError):
        return MAX_VALUE + 1


@dataclass
class Reader:
    """One execution's events: what is kept so far, checked against the caps."""

    kept: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    results_bytes: int = 0
    results: int = 0

    def output(self, ev: dict[str, Any]) -> OutputMessage | None:
        """A ``stdout``/``stderr`` event as an OutputMessage (None: nothing left to keep)."""
        kind = ev["type"]
        text = ev.get("text")
        if not isinstance(text, str):
            raise ProtocolError("the kernel bridge sent output that is not text")
        room = MAX_STREAM + 4096 - self.kept[kind]  # (the bridge's own marker line fits)
        if room <= 0:
            return None
        text = text[:room]
        self.kept[kind] += len(text)
        return OutputMessage(kind, text, time.time_ns())

    def result(self, ev: dict[str, Any]) -> Result | None:
        """A ``result`` event as a Result (None: over the execution's caps)."""
        data = ev.get("data")
        if not isinstance(data, dict):
            raise ProtocolError("the kernel bridge sent a result that is not a MIME bundle")
        r = Result(is_main_result=ev.get("main") is True)
        extra: dict[str, Any] = {}
        notes: list[str] = []
        size = 0
        for mime, value in data.items():
            if not isinstance(mime, str) or len(mime) > 256:
                continue
            n = _size(value)
            if n > MAX_VALUE:
                notes.append(f"[{mime[:100]} of {n} bytes not kept: a value may have {MAX_VALUE >> 20} MiB]")
                continue
            name = MIME_FIELDS.get(mime)
            if name is None:
                if len(extra) < MAX_EXTRA:
                    extra[mime] = value
                    size += n
                continue
            if name != "json" and not isinstance(value, str):
                raise ProtocolError(f"the kernel bridge sent {mime} that is not text")
            if name in _BASE64:
                value = "".join(value.split())  # (IPython's base64 may hold line breaks)
            setattr(r, name, value)
            size += n
        if notes:
            r.text = ((r.text + "\n") if r.text else "") + "\n".join(notes)
        if self.results >= MAX_RESULT_COUNT or self.results_bytes + size > MAX_RESULTS:
            return None
        self.results += 1
        self.results_bytes += size
        r.extra = extra or None
        return r


@dataclass(frozen=True)
class End:
    """The bridge's ``end`` event: how the execution ended."""

    status: Outcome
    execution_count: int | None
    error: ExecutionError | None
    notes: list[str]
    why: str | None
    exit_code: int | None
    signal: int | None
    oom: bool
    detail: str


def end(ev: dict[str, Any]) -> End:
    """Raises ProtocolError."""
    status = ev.get("status")
    if status not in OUTCOMES:
        raise ProtocolError("the kernel bridge sent an unknown outcome")
    count = ev.get("execution_count")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
        raise ProtocolError("the kernel bridge sent an invalid execution count")
    raw = ev.get("error")
    error = None
    if isinstance(raw, dict):
        tb = raw.get("traceback")
        lines = [str(x) for x in tb] if isinstance(tb, list) else [str(tb or "")]
        text = strip_ansi("\n".join(lines))
        if len(text) > MAX_TRACEBACK:
            text = "[...]\n" + text[-MAX_TRACEBACK:]
        error = ExecutionError(str(raw.get("name", ""))[:256], strip_ansi(str(raw.get("value", "")))[:4096], text)
    notes = [str(n)[:600] for n in ev.get("notes") or [] if isinstance(n, str)][:10]
    why = ev.get("why") if isinstance(ev.get("why"), str) else None
    raw_exit = ev.get("exit")
    ex: dict[str, Any] = raw_exit if isinstance(raw_exit, dict) else {}
    code, sig = ex.get("code"), ex.get("signal")
    return End(
        status=status,
        execution_count=count,
        error=error,
        notes=notes,
        why=why,
        exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        signal=sig if isinstance(sig, int) and not isinstance(sig, bool) else None,
        oom=ev.get("oom") is True,
        detail=str(ev.get("detail") or ev.get("log") or "")[-2000:],
    )
