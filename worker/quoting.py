"""File names that are not plain text, shown and taken back the way git does.

A Linux file name is any bytes but NUL and "/": a command may create one that is not
UTF-8 (it reaches the host as a str with lone surrogates, which JSON encoders and UTF-8
streams refuse), or one holding a newline or a terminal escape (which would forge lines
in a listing, or recolour a terminal). Such a path is shown the way git shows it
(``core.quotePath`` with UTF-8 left readable): in double quotes, with C escapes and octal
bytes, e.g. ``"bad\\377.txt"`` or ``"new\\nline.txt"``. Every tool accepts that form back
as a path argument (:func:`worker.policy.paths.normalize` unquotes), so a model can act on what
it was shown.
"""

from __future__ import annotations

_C_ESCAPES = {"\a": "a", "\b": "b", "\t": "t", "\n": "n", "\v": "v", "\f": "f", "\r": "r", '"': '"', "\\": "\\"}
_C_UNESCAPES = {v: k for k, v in _C_ESCAPES.items()}


def _needs_quote(c: str) -> bool:
    o = ord(c)
    return o < 0x20 or c in '"\\' or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xDFFF


def quote_path(path: str) -> str:
    """``path`` as shown to a model or a client: unchanged when it is plain text, else
    C-quoted like git (:func:`unquote_path` gives the path back)."""
    if path.isascii() and path.isprintable() and '"' not in path and "\\" not in path:
        return path  # the common case, decided in C
    if not any(_needs_quote(c) for c in path):
        return path
    out = ['"']
    for c in path:
        if c in _C_ESCAPES:
            out.append("\\" + _C_ESCAPES[c])
        elif _needs_quote(c):
            out.extend(
                f"\\{b:03o}" for b in c.encode("utf-8", "surrogateescape" if ord(c) >= 0xDC80 else "surrogatepass")
            )
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def unquote_path(text: str) -> str:
    """The path a :func:`quote_path` string stands for; anything else unchanged (a
    string that merely starts and ends with a double quote but is not a valid quoted
    path is taken literally)."""
    if len(text) < 2 or text[0] != '"' or text[-1] != '"':
        return text
    body, out, i = text[1:-1], bytearray(), 0
    while i < len(body):
        c = body[i]
        if c == '"':
            return text  # an unescaped quote inside: not a quoted path
        if c != "\\":
            try:
                out += c.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:
                return text  # a lone surrogate no file name decodes to
            i += 1
            continue
        nxt = body[i + 1 : i + 2]
        if nxt in _C_UNESCAPES:
            out += _C_UNESCAPES[nxt].encode()
            i += 2
        elif len(body) >= i + 4 and all(d in "01234567" for d in body[i + 1 : i + 4]) and body[i + 1] in "0123":
            out.append(int(body[i + 1 : i + 4], 8))
            i += 4
        else:
            return text
    return out.decode("utf-8", "surrogateescape")
