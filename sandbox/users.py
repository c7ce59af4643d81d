"""Who a command runs as when a harness asks for a user (``ExecRequest.user``).

A name is looked up in the sandbox's own ``/etc/passwd``, read through its agent: a user a
command has just added (inspect's ``adduser``) is found, also under gVisor, whose file
system the engine does not see (``docker exec -u NAME`` there fails with "unable to find
user"). ``uid`` and ``uid:gid`` are taken as they are. The engine then starts an agent for
that user *by number*, so the engine's own lookup is never involved.

Root is uid 0 whatever it is called; a workspace runs commands as root only when its
settings allow it (``allow_root``: see :class:`sandbox.spec.SandboxSpec`).
"""

from __future__ import annotations

import re

_NUMERIC = re.compile(r"(\d{1,10})(?::(\d{1,10}))?")
_NAME = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}\$?")
#: Docker's words for a user the image does not have (``docker exec -u``), so a harness
#: matching on them, as inspect's conformance suite does on the name, sees the same.
NOT_FOUND = "unable to find user {user}: no matching entries in passwd file"


def passwd_entries(text: str) -> dict[str, tuple[int, int]]:
    """``name -> (uid, gid)`` of a passwd file's well-formed lines."""
    out: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) >= 4 and fields[0] and fields[2].isdigit() and fields[3].isdigit():
            out.setdefault(fields[0], (int(fields[2]), int(fields[3])))
    return out


def valid(user: str) -> bool:
    """Whether ``user`` is a name or ``uid[:gid]`` at all (before any lookup)."""
    return bool(_NUMERIC.fullmatch(user) or _NAME.fullmatch(user))


def resolve(user: str, passwd: str) -> tuple[int, int] | None:
    """``(uid, gid)`` for ``user``: a name of ``passwd`` (its group), ``uid`` (the group
    of its passwd line, else the same number) or ``uid:gid``; None for a name the file
    does not have (or that is not a name at all)."""
    m = _NUMERIC.fullmatch(user)
    if m is not None:
        uid = int(m.group(1))
        if m.group(2) is not None:
            return uid, int(m.group(2))
        by_uid = {u: g for u, g in passwd_entries(passwd).values()}
        return uid, by_uid.get(uid, uid)
    if not _NAME.fullmatch(user):
        return None
    return passwd_entries(passwd).get(user)
