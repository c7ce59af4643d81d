"""Reading files: ``read``, ``stat`` and ``hash``, and the check of a file's current
content that writes and removals make first (:func:`check_expect`)."""

import os
import stat

from . import channel, paths, state
from .errors import Refused


def sha256(data=b""):
    """hashlib's sha256 of ``data``; hashlib (OpenSSL's) is imported at the first hash, not
    at every agent's start (a sandbox's first result rarely needs it)."""
    import hashlib

    return hashlib.sha256(data)


def _hash_fd(f):
    h = sha256()
    os.lseek(f, 0, 0)
    while True:
        chunk = os.read(f, 1 << 20)
        if not chunk:
            break
        h.update(chunk)
    return h.hexdigest()


def _data(req, data):
    """The bytes read, in the answer: raw after its line when the host asks (no base64, no
    JSON escaping: a large file costs a copy, not ~3 ms a MiB), else base64 in it."""
    return {"_raw": data} if req.get("raw_out") else {"data": channel.b64(data)}


def op_read(req):
    path = req.get("path", ".")
    max_bytes = min(int(req.get("max_bytes") or state.MAX_READ), state.MAX_READ)
    fd, name, parts, st = paths.resolve(path)
    try:
        if name is None:
            raise Refused("not_a_file", "Not a file: %s is a directory" % path)
        f, fst = paths.open_file(fd, name, st, path)
    finally:
        os.close(fd)
    try:
        # A whole small file is read once; its first 8 KiB decide "binary" (NUL byte).
        whole = fst.st_size <= min(max_bytes, 8192) and not req.get("line_range") and not req.get("offset")
        head = os.pread(f, 8192, 0)
        binary = b"\x00" in head
        if whole and req.get("length") is None and len(head) == fst.st_size:
            return {
                **_data(req, head),
                "size": fst.st_size,
                "truncated": False,
                "sha256": sha256(head).hexdigest(),
                "mtime_ns": fst.st_mtime_ns,
                "binary": binary,
                "total_lines": None,
            }
        line_range = req.get("line_range")
        total_lines = None
        digest = None
        if line_range:
            start, end = int(line_range[0]), int(line_range[1])
            out = []
            n = 0
            size = 0
            truncated = False
            with os.fdopen(os.dup(f), "rb") as fh:
                for line in fh:
                    n += 1
                    if start <= n <= end:
                        if size + len(line) > max_bytes:
                            out.append(line[: max_bytes - size])
                            size = max_bytes
                            truncated = True
                        elif not truncated:
                            out.append(line)
                            size += len(line)
            total_lines = n
            data = b"".join(out)
        else:
            offset = int(req.get("offset") or 0)
            length = req.get("length")
            want = fst.st_size - offset if length is None else int(length)
            want = max(0, min(want, fst.st_size - offset))
            truncated = want > max_bytes
            want = min(want, max_bytes)
            chunks = []
            pos = offset
            remaining = want
            while remaining > 0:
                chunk = os.pread(f, min(remaining, 1 << 20), pos)
                if not chunk:
                    break
                chunks.append(chunk)
                pos += len(chunk)
                remaining -= len(chunk)
            data = b"".join(chunks)
            if offset == 0 and not truncated and len(data) == fst.st_size:
                digest = sha256(data).hexdigest()
        return {
            **_data(req, data),
            "size": fst.st_size,
            "truncated": truncated,
            "sha256": digest,
            "mtime_ns": fst.st_mtime_ns,
            "binary": binary,
            "total_lines": total_lines,
        }
    finally:
        os.close(f)


def check_expect(fd, name, st, path, req):
    expect = req.get("expect_sha256")
    if req.get("expect_absent") and st is not None:
        raise Refused("conflict", "Conflict: %s already exists" % path)
    if expect:
        if st is None:
            raise Refused("conflict", "Conflict: %s no longer exists" % path)
        f, _ = paths.open_file(fd, name, st, path)
        try:
            current = _hash_fd(f)
        finally:
            os.close(f)
        if current != expect:
            raise Refused("conflict", "Conflict: %s changed since it was read" % path)


def op_stat(req):
    path = req.get("path", ".")
    fd, name, parts, st = paths.resolve(path, follow_last=False)
    try:
        target = None
        # A process in the sandbox may swap the link for a file between the lstat and the
        # readlink: look again (a few times) rather than fail the caller on EINVAL.
        for _ in range(8):
            if st is None or not stat.S_ISLNK(st.st_mode):
                break
            target = paths.read_link(name, fd)
            if target is not None:
                break
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                st = None
        if st is None:
            raise Refused("not_found", "Not found: %s" % path)
        if stat.S_ISLNK(st.st_mode) and target is None:
            raise Refused("conflict", "Conflict: %s kept changing while it was read" % path)
        return {
            "path": paths.rel(parts),
            "type": paths.type_of(st.st_mode),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "mode": st.st_mode,
            "target": target,
        }
    finally:
        os.close(fd)


def op_hash(req):
    out = {}  # type: dict
    for path in req.get("paths") or []:
        try:
            fd, name, parts, st = paths.resolve(path)
            try:
                if name is None or st is None or not stat.S_ISREG(st.st_mode):
                    out[path] = None
                    continue
                f, _ = paths.open_file(fd, name, st, path)
                try:
                    out[path] = _hash_fd(f)
                finally:
                    os.close(f)
            finally:
                os.close(fd)
        except Refused:
            out[path] = None
    return {"hashes": out}
