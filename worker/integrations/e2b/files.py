"""envd's REST API (``spec/envd/envd.yaml`` in e2b-dev/E2B): ``GET /files`` (a file's
bytes), ``POST /files`` (files written: multipart or octet-stream, gzip), signed file
URLs, and ``GET /health``.

Which sandbox: the ``E2b-Sandbox-Id`` header, or, for a URL made by the SDK's
``download_url``/``upload_url`` (it carries no header), the sandbox whose access token
signed it: :meth:`Access.signed_file_sandbox <worker.auth.Access.signed_file_sandbox>`,
the one place signatures are checked, tells which (the signature covers the path, the
operation, the user and the expiry as the URL gives them). A request that carries the
sandbox's access token (``X-Access-Token``) needs no signature, as with envd.

A download streams the file in pieces as the sandbox's agent reads them (gzip when the
client accepts it); an upload is spooled on the host as it arrives (:mod:`.uploads`) and
written through the harness API, so a change inside the workspace is recorded in its
changelog (a large file in pieces, inside a recorded bracket). Errors are envd's JSON
``{"code", "message"}`` (:mod:`.errors`).
"""

from __future__ import annotations

import asyncio
import mimetypes
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from sandbox.treeops import PathReader
from worker.http.state import Service

from .entries import upload_entry
from .errors import EnvdUnsupported, NoSandboxNamed, http_error, json_error
from .sandboxfs import WHOLE_WRITE, SandboxFiles, e2b_path
from .target import Target, sandbox_id_of, target_of
from .uploads import Upload, multipart, octet_stream

router = APIRouter(include_in_schema=False)
#: gzip's level for downloads: the fastest (the bytes are the same gzip either way).
GZIP_LEVEL = 1


class BadSignature(PermissionError):
    """A signed URL that no sandbox signed, or that expired (401)."""


async def _target(request: Request, operation: str) -> Target:
    """The sandbox a ``/files`` request is for. Raises BadSignature, NoSandboxNamed,
    SandboxNotFound."""
    q = request.query_params
    signature = q.get("signature")
    if signature is not None and not request.headers.get("x-access-token"):
        service: Service = request.app.state.service
        try:
            expiration = int(q["signature_expiration"]) if q.get("signature_expiration") else None
        except ValueError:
            raise BadSignature("invalid signature_expiration: a Unix time in seconds") from None
        ids = [w.id for w in await service.workspaces.list()]
        sid = service.access.signed_file_sandbox(
            ids,
            path=q.get("path", ""),
            operation=operation,
            username=q.get("username"),
            signature=signature,
            expiration=expiration,
            now=time.time(),
        )
        if sid is None or (sandbox_id_of(request) not in (None, sid)):
            raise BadSignature("invalid signature, or the signature is already expired")
        return await target_of(request, sid)
    if not sandbox_id_of(request):
        raise NoSandboxNamed("no sandbox named: send the E2b-Sandbox-Id header, or use a signed URL")
    return await target_of(request)


def _failed(e: Exception) -> Response:
    if isinstance(e, BadSignature):
        return json_error(401, str(e))
    answer = http_error(e)
    if answer is None:
        raise e
    return answer


def _accepts_gzip(header: str) -> bool:
    """Whether ``Accept-Encoding`` takes gzip (``q`` above 0)."""
    for part in header.split(","):
        name, _, params = part.strip().partition(";")
        if name.strip().lower() in ("gzip", "*"):
            q = params.strip().lower()
            if q.startswith("q="):
                try:
                    return float(q[2:]) > 0
                except ValueError:
                    return False
            return True
    return False


@router.get("/files")
async def download(request: Request) -> Response:
    """A file's bytes (``path``, ``username``): 404 when it is not there, 400 for a
    directory, in envd's JSON error shape."""
    path = request.query_params.get("path", "")
    try:
        target = await _target(request, "read")
        files = SandboxFiles(target, request.query_params.get("username"))
        shown = e2b_path(path)
        async with target.service.runner.slot():  # (its first piece; the rest as the client reads)
            reader = await files.open(path)
    except Exception as e:
        return _not_found_as_envd(e, path) or _failed(e)
    name = shown.rsplit("/", 1)[-1]
    headers = {"Content-Disposition": f'inline; filename="{_quoted(name)}"', "Vary": "Accept-Encoding"}
    media = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if _accepts_gzip(request.headers.get("accept-encoding", "")):
        headers["Content-Encoding"] = "gzip"
        return StreamingResponse(_gzipped(reader), media_type=media, headers=headers)
    headers["Content-Length"] = str(reader.size)
    return StreamingResponse(_plain(reader), media_type=media, headers=headers)


def _quoted(name: str) -> str:
    return name.replace("\\", "\\\\").replace('"', '\\"')


def _not_found_as_envd(e: Exception, path: str) -> Response | None:
    """envd's words for a missing file and a directory (its SDKs show them)."""
    from sandbox.errors import IsADirError, PathNotFoundError

    try:
        shown = e2b_path(path)
    except ValueError:
        return None
    if isinstance(e, PathNotFoundError):
        return json_error(404, f"path '{shown}' does not exist")
    if isinstance(e, IsADirError):
        return json_error(400, f"path '{shown}' is a directory")
    return None


async def _plain(reader: PathReader) -> AsyncIterator[bytes]:
    async for data in reader:
        yield data


async def _gzipped(reader: PathReader) -> AsyncIterator[bytes]:
    deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)
    async for data in reader:
        # (a piece of megabytes takes milliseconds to compress: off the event loop)
        out = await asyncio.to_thread(deflate.compress, data) if len(data) > 65536 else deflate.compress(data)
        if out:
            yield out
    yield deflate.flush()


@router.post("/files")
async def upload(request: Request) -> Response:
    """Write the files of the body (``path``, ``username``): the list of what was
    written, ``[{"path", "name", "type": "file"}]``, as envd answers."""
    q = request.query_params
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    uploads: list[Upload] = []
    try:
        target = await _target(request, "write")
        files = SandboxFiles(target, q.get("username"))
        if any(k.lower().startswith("x-metadata-") for k in request.headers):
            raise EnvdUnsupported(
                "file metadata (X-Metadata-* headers, envd 0.6.2) is not offered by loom's sandboxes: "
                "upload without metadata"
            )
        if media == "application/octet-stream":
            uploads = await octet_stream(request, q.get("path"))
        elif media.startswith("multipart/"):
            uploads = await multipart(request, q.get("path"))
        else:
            shown = request.headers.get("content-type") or "none"
            return json_error(
                400,
                f"unsupported content type: {shown}, expected multipart/form-data or application/octet-stream",
            )
        written: list[dict[str, Any]] = []
        async with target.service.runner.slot():  # (the body is spooled already: no slot held while it came)
            for u in uploads:
                shown = e2b_path(u.path)
                if any(w["path"] == shown for w in written):
                    return json_error(
                        400,
                        f"you cannot upload multiple files to the same path '{shown}' in one upload request, "
                        "only the first specified file was uploaded",
                    )
                if u.size <= WHOLE_WRITE:
                    await files.write(u.path, await u.read())
                else:
                    await files.write_pieces(u.path, u.size, u.pieces)
                written.append(upload_entry(shown))
    except Exception as e:
        return _upload_failed(e, uploads)
    finally:
        for u in uploads:
            u.file.close()
    return JSONResponse(written)


def _upload_failed(e: Exception, uploads: list[Upload]) -> Response:
    from sandbox.errors import IsADirError

    if isinstance(e, IsADirError) and uploads:
        return json_error(400, f"path is a directory: {e}")
    return _failed(e)


@router.get("/health")
async def health(request: Request) -> Response:
    """204 while the sandbox named is there (502 "was not found" once it is gone, as E2B's
    proxy answers: the SDKs probe this to tell a sandbox gone from one unreachable)."""
    try:
        if sandbox_id_of(request):
            await target_of(request)
    except Exception as e:
        return _failed(e)
    return Response(status_code=204)


def routes(settings: Any) -> list[Any]:
    return list(router.routes)
