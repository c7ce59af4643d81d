"""The body of envd's ``POST /files`` as the files it carries: ``multipart/form-data``
(each part named ``file``, its file name the path unless the query names one) or
``application/octet-stream`` (one file, at the query's ``path``; envd >= 0.5.7), either
of them gzip-compressed (``Content-Encoding: gzip``).

Nothing is held whole in memory: the body is decompressed as it streams in and each
file is spooled to a temporary file on the host (in memory up to :data:`SPOOL_MEMORY`),
so the write can go to the sandbox in pieces. What one upload may carry, decompressed,
is bounded (:data:`MAX_UPLOAD`; the compressed body by the service's body limit).
"""

from __future__ import annotations

import asyncio
import tempfile
import zlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import IO

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request

from sandbox.errors import TooLargeError
from worker.harness import MAX_WRITE

from .errors import EnvdInvalid

#: Most bytes one upload may carry once decompressed (the harness's largest write).
MAX_UPLOAD = MAX_WRITE
#: A spooled file stays in memory up to this size, then goes to disk.
SPOOL_MEMORY = 1 << 20
#: The most bytes one piece of a gzip body inflates to at a time.
INFLATE_PIECE = 1 << 20
#: The pieces a spooled file is read back in.
READ_PIECE = 4 << 20


@dataclass
class Upload:
    """One file of an upload: where it goes (as the client named it) and its bytes."""

    path: str
    size: int
    file: IO[bytes]

    async def read(self) -> bytes:
        """All of it (for a small file)."""

        def whole() -> bytes:
            self.file.seek(0)
            return self.file.read()

        return await asyncio.to_thread(whole)

    async def pieces(self) -> AsyncIterator[bytes]:
        """Its bytes from the start, in pieces (each read off the event loop)."""
        await asyncio.to_thread(self.file.seek, 0)
        while True:
            data = await asyncio.to_thread(self.file.read, READ_PIECE)
            if not data:
                return
            yield data


class UnsupportedEncoding(EnvdInvalid):
    """A ``Content-Encoding`` other than gzip or identity."""


async def body(request: Request) -> AsyncGenerator[bytes, None]:
    """The request's body as it comes, gunzipped when it says so (a gzip of several
    members too, as Go's reader takes it), in pieces of at most :data:`INFLATE_PIECE`
    bytes, at most :data:`MAX_UPLOAD` in all. Raises UnsupportedEncoding, EnvdInvalid
    (bad gzip), TooLargeError."""
    encoding = (request.headers.get("content-encoding") or "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        raise UnsupportedEncoding(f"unsupported Content-Encoding: {encoding} (supported: gzip, identity)")
    gz = encoding == "gzip"
    inflate = zlib.decompressobj(wbits=31)
    seen = 0
    async for chunk in request.stream():
        pending = chunk
        while pending:
            if gz:
                if inflate.eof:  # the next member
                    inflate = zlib.decompressobj(wbits=31)
                try:
                    data = inflate.decompress(pending, INFLATE_PIECE)
                except zlib.error as e:
                    raise EnvdInvalid(f"error decompressing request body: {e}") from e
                pending = inflate.unconsumed_tail or (inflate.unused_data if inflate.eof else b"")
            else:
                data, pending = pending, b""
            seen += len(data)
            if seen > MAX_UPLOAD:
                raise TooLargeError(f"the upload is larger than {MAX_UPLOAD} bytes: write it in several files")
            if data:
                yield data
    while gz and seen and not inflate.eof:  # output zlib still holds (a piece's worth came out each round)
        data = inflate.decompress(b"", INFLATE_PIECE)
        if not data:
            raise EnvdInvalid("error decompressing request body: unexpected EOF")
        seen += len(data)
        if seen > MAX_UPLOAD:
            raise TooLargeError(f"the upload is larger than {MAX_UPLOAD} bytes: write it in several files")
        yield data


async def spool(chunks: AsyncIterator[bytes]) -> tuple[IO[bytes], int]:
    """``chunks`` in a temporary file (in memory while small); it and its size."""
    f: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY)  # (the caller closes it)
    size = 0
    buf = bytearray()
    try:
        async for chunk in chunks:
            buf += chunk
            size += len(chunk)
            if len(buf) >= SPOOL_MEMORY:
                await asyncio.to_thread(f.write, bytes(buf))
                buf.clear()
        if buf:
            await asyncio.to_thread(f.write, bytes(buf))
    except BaseException:
        f.close()
        raise
    return f, size


async def octet_stream(request: Request, path: str | None) -> list[Upload]:
    """An ``application/octet-stream`` upload: one file. Raises EnvdInvalid (no path),
    what :func:`body` raises."""
    if not path:
        raise EnvdInvalid("path query parameter is required for raw body upload")
    f, size = await spool(body(request))
    return [Upload(path, size, f)]


async def multipart(request: Request, path: str | None) -> list[Upload]:
    """A ``multipart/form-data`` upload: its ``file`` parts, at the query's ``path`` or
    each at its file name. Raises EnvdInvalid (a malformed body, a part without a path,
    two parts for one path), what :func:`body` raises."""
    parser = MultiPartParser(request.headers, body(request), max_files=10_000, max_fields=10_000)
    try:
        form = await parser.parse()
    except MultiPartException as e:
        raise EnvdInvalid(f"error parsing multipart form: {e.message}") from e
    out: list[Upload] = []
    try:
        for name, value in form.multi_items():
            if name != "file":
                continue
            if isinstance(value, UploadFile):
                target = path or value.filename
                f: IO[bytes] = value.file
                size = value.size if value.size is not None else 0
            else:  # a part without a file name: a field, its text the content
                target = path
                raw = value.encode("utf-8")
                f, size = await spool(_one(raw))
            if not target:
                raise EnvdInvalid("a file part has no file name and no path query parameter names it")
            out.append(Upload(target, size, f))
    except BaseException:
        await form.close()
        raise
    return out


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data
