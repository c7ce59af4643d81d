"""A sandbox entry as E2B's envd describes it: ``filesystem.EntryInfo`` (its protobuf
message: name, type, path, size, mode, permissions, owner, group, modified_time,
symlink_target, is_symlink), and the ``/files`` upload answer's ``{name, type, path}``.

envd (Go) describes a link by the link itself (its size, time, owner, and Go's
``FileMode.String()`` of its own mode as ``permissions``) and by its target (``type``,
the permission bits as ``mode``, ``symlink_target`` with every link resolved); newer
envd marks it ``is_symlink``, which the SDKs read as the type "symlink"."""

from __future__ import annotations

import posixpath
import stat

from e2b.envd.filesystem import filesystem_pb as pb
from protobuf.wkt import Timestamp

from sandbox.results import PathEntry

from .target import to_e2b

_TYPES = {"file": pb.FileType.FILE, "dir": pb.FileType.DIRECTORY}


def go_mode_string(mode: int) -> str:
    """Go's ``os.FileMode.String()`` of a ``st_mode``: the type and special letters of
    ``dalTLDpSugct?`` that apply (``-`` for none), then ``rwxrwxrwx``."""
    letters = ""
    if stat.S_ISDIR(mode):
        letters += "d"
    if stat.S_ISLNK(mode):
        letters += "L"
    if stat.S_ISBLK(mode) or stat.S_ISCHR(mode):
        letters += "D"
    if stat.S_ISFIFO(mode):
        letters += "p"
    if stat.S_ISSOCK(mode):
        letters += "S"
    if mode & stat.S_ISUID:
        letters += "u"
    if mode & stat.S_ISGID:
        letters += "g"
    if stat.S_ISCHR(mode):
        letters += "c"
    if mode & stat.S_ISVTX:
        letters += "t"
    perms = "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
    return (letters or "-") + perms


def entry_info(e: PathEntry, path: str) -> pb.EntryInfo:
    """``e`` as envd's EntryInfo, at E2B's ``path``."""
    info = pb.EntryInfo(
        name=posixpath.basename(path) or "/",  # (E2B's name: /home/user is "user", not "workspace")
        type=_TYPES.get(e.type, pb.FileType.UNSPECIFIED),
        path=path,
        size=e.size,
        mode=e.perm,
        permissions=go_mode_string(e.mode),
        owner=e.owner,
        group=e.group,
        modified_time=Timestamp.from_nanos(e.mtime_ns) if e.mtime_ns else None,
        is_symlink=e.symlink,
    )
    if e.symlink:
        info.symlink_target = to_e2b(e.target or "")
    return info


def upload_entry(path: str) -> dict[str, str]:
    """A file written by ``POST /files``, as envd answers it."""
    return {"path": path, "name": path.rstrip("/").rsplit("/", 1)[-1], "type": "file"}
