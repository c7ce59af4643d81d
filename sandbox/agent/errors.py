"""How an operation fails: :class:`Refused` with a code the host maps to its own error
types (``sandbox.errors.agent_error``), and how any exception becomes an error answer,
so one bad request never ends the agent."""

import errno


class Refused(Exception):
    """A request the agent will not or cannot carry out; ``code`` names why (``escape``,
    ``not_found``, ``not_a_file``, ``conflict``, ``invalid``, ...) and ``message`` is meant
    for the model."""

    def __init__(self, code, message):
        Exception.__init__(self, message)
        self.code = code
        self.message = message


def error_answer(rid, e):
    """The answer to request ``rid`` that raised ``e``."""
    if isinstance(e, Refused):
        return {"id": rid, "ok": False, "code": e.code, "error": e.message}
    if isinstance(e, FileNotFoundError):
        return {"id": rid, "ok": False, "code": "not_found", "error": "Not found: %s" % (e.filename or e)}
    if isinstance(e, IsADirectoryError):
        return {"id": rid, "ok": False, "code": "is_a_directory", "error": "Is a directory: %s" % (e.filename or e)}
    if isinstance(e, PermissionError):
        return {"id": rid, "ok": False, "code": "permission", "error": "Permission denied: %s" % (e.filename or e)}
    if isinstance(e, NotADirectoryError):
        return {"id": rid, "ok": False, "code": "not_a_directory", "error": "Not a directory: %s" % (e.filename or e)}
    if isinstance(e, OSError):
        code = "no_space" if e.errno in (errno.ENOSPC, errno.EDQUOT) else "os_error"
        if e.errno == errno.EROFS:
            code = "permission"
        return {"id": rid, "ok": False, "code": code, "error": "%s: %s" % (e.strerror or e, e.filename or "")}
    return {"id": rid, "ok": False, "code": "internal", "error": "%s: %s" % (type(e).__name__, e)}
