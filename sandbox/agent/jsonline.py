"""The agent's JSON: ``dumps`` and ``loads`` as the standard ``json`` module does them (the
same output, the same objects, the same errors), through the standard library's own C
accelerator ``_json`` when it is there.

Why not ``import json``: its package imports ``re`` (and compiles six patterns) for its
pure-Python paths, ~3-4 ms of every agent's boot in a sandbox (``-X importtime``), and 100
sandboxes starting at once share two cores for it (issue 44). The C scanner and encoder are
what ``json`` itself uses for these calls; only the whitespace at the ends of a line is
handled here. Anything unusual (malformed input, bytes that are not UTF-8, an interpreter
without ``_json`` or with another signature) goes to ``json`` itself, imported then, so
errors read exactly as ``json``'s."""

#: JSON's four whitespace characters (RFC 8259), all ``json.loads`` skips at either end.
_WS = " \t\n\r"
_fast = []  # type: list  # [scanner, encoder] once made, [] when ``_json`` cannot serve


def _stdlib():
    import json

    return json


def _default(o):
    raise TypeError("Object of type %s is not JSON serializable" % type(o).__name__)


def _make():
    try:
        import _json

        inf = float("inf")
        constants = {"-Infinity": -inf, "Infinity": inf, "NaN": float("nan")}

        class _Context(object):
            # What ``json.JSONDecoder()`` hands ``make_scanner``: json.loads's defaults.
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            parse_constant = constants.__getitem__
            memo = {}  # type: dict

        scanner = _json.make_scanner(_Context())  # type: ignore[arg-type]  # (the stub names json's class)
        # json.dumps(obj, separators=(",", ":")): check_circular, ensure_ascii, allow_nan.
        encoder = _json.make_encoder({}, _default, _json.encode_basestring_ascii, None, ":", ",", False, False, True)
        sample, text = {"a": [1, 2.5, None, True, "\u00e9"]}, '{"a":[1,2.5,null,true,"\\u00e9"]}'
        if "".join(encoder(sample, 0)) != text or scanner(text, 0) != (sample, len(text)):
            raise ValueError("_json differs here from what this module expects")
        _fast[:] = [scanner, encoder]
    except Exception:
        _fast[:] = [None, None]


def dumps(obj):
    """``json.dumps(obj, separators=(",", ":")).encode()``: compact, ASCII, as bytes.

    Raises TypeError for an object JSON cannot hold, ValueError for a circular one."""
    if not _fast:
        _make()
    encoder = _fast[1]
    if encoder is None:
        return _stdlib().dumps(obj, separators=(",", ":")).encode("utf-8")
    if isinstance(obj, str):
        return _stdlib().dumps(obj).encode("utf-8")  # (a bare string: json's own path, never ours)
    return "".join(encoder(obj, 0)).encode("utf-8")


def loads(data):
    """``json.loads(data)`` for one document in ``str`` or UTF-8 ``bytes``.

    Raises ValueError (``json.JSONDecodeError``, as ``json`` raises it) when it is not one."""
    if not _fast:
        _make()
    scanner = _fast[0]
    if scanner is None:
        return _stdlib().loads(data)
    if isinstance(data, (bytes, bytearray)):
        if data[:3] == b"\xef\xbb\xbf":
            return _stdlib().loads(data)  # (a BOM: json's encoding detection deals with it)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return _stdlib().loads(data)
    elif isinstance(data, str):
        text = data
    else:
        return _stdlib().loads(data)  # (raises json's TypeError)
    text = text.strip(_WS)
    try:
        obj, end = scanner(text, 0)
    except StopIteration:
        end = -1
    if end != len(text):
        return _stdlib().loads(data)  # not one whole document: json says what is wrong
    return obj
