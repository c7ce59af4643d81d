"""TLS interception for the hosts of a workspace's secrets, and nothing else.

When a tunnel's destination (``CONNECT host:port``, or a stub address dialled directly) is
a host of one of the workspace's secrets and the sandbox starts TLS, the gateway, after
every check it makes of any tunnel (allowlist, server name, addresses), terminates that
TLS itself with a leaf certificate of the workspace's own CA (:mod:`worker.egress.ca`)
and opens its own TLS to the destination, verified against the host's trust store (plus
``LOOM_EGRESS_UPSTREAM_CA``). Between the two it reads HTTP/1.1 with h11, request by
request on a kept-alive connection, and puts the secrets in (:mod:`worker.egress.session`,
:mod:`worker.egress.rewrite`). ALPN: only ``http/1.1`` is offered to the sandbox (see
:data:`worker.egress.ca.ALPN`).

A sandbox that does not trust the workspace's CA (its own bundle, pinned certificates)
fails its handshake with the gateway: its request, and the secret, never go out. Every
other host stays a spliced tunnel (:mod:`worker.egress.pump`): no CA is involved.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
import traceback
from pathlib import Path
from typing import Any

import h11

from sandbox.logs import get_logger

from .log import EgressRecord
from .session import Session
from .tlsio import TLSStream

log = get_logger("worker.egress")
SEND_BUFFER = 4 << 20


class Interceptor:
    """Decides which tunnels are intercepted and serves them. ``secrets`` is the
    registry's :class:`~worker.egress.provision.SecretsHost`."""

    def __init__(self, secrets: Any, upstream_ctx: ssl.SSLContext) -> None:
        self.secrets = secrets
        self.upstream_ctx = upstream_ctx

    def wants(self, root: Path, host: str, port: int) -> bool:
        """Whether a tunnel of ``root``'s sandbox to ``host:port`` carries a secret's host."""
        return any(s.matches(host, port) for s in self.secrets.store.effective(root).values())

    async def serve(
        self,
        served: Any,
        sock: socket.socket,
        upstream: socket.socket,
        first: bytes,
        host: str,
        port: int,
        started: float,
        kind: str,
        rule: str | None,
        address: str,
    ) -> None:
        """Serve one tunnel (``first``: the ClientHello already read) until it ends, then
        log it. Closes both sockets. Never raises but CancelledError."""
        session = Session(self.secrets.store, served, host, port)
        verdict, reason = "allowed", "allowed; TLS intercepted (a host of the workspace's secrets)"
        client = up = None
        graceful = True
        with contextlib.suppress(OSError):
            # The gateway writes from its event loop, which a unix socket wakes only once
            # three quarters of its buffer are read: a larger buffer keeps the sandbox's
            # side busy meanwhile (the kernel caps it at net.core.wmem_max).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        try:
            ca = self.secrets.loaded_ca(served.root) or await asyncio.to_thread(self.secrets.ca, served.root)
            client = TLSStream.server(sock, ca.server_context(host), first)
            up = TLSStream.client(upstream, self.upstream_ctx, host, charge=served.budget.take)
            session.client, session.up = client, up
            c_err, u_err = await asyncio.gather(client.handshake(), up.handshake(), return_exceptions=True)
            for err in (c_err, u_err):
                if isinstance(err, asyncio.CancelledError):
                    raise err
            if c_err is not None:
                verdict = "error"
                reason = (
                    f"the sandbox did not complete TLS with the gateway's certificate for {host} (does its trust "
                    f"store hold this workspace's CA?): {_why(c_err)}; nothing was sent"
                )
            elif u_err is not None:
                verdict, reason = "error", f"TLS with {host}:{port} failed: {_why(u_err)}"
                await session.refuse_first(502, reason)
            else:
                await session.run()
                reason += f": {session.requests} request{'s' if session.requests != 1 else ''}"
        except asyncio.CancelledError:  # the workspace's gateway is released: no goodbyes
            graceful = False
            reason += "; ended: the gateway stopped serving the workspace"
            raise
        except ConnectionAbortedError:
            verdict, reason = "limited", f"cut: over {served.budget.per_minute} bytes per minute for this workspace"
        except (OSError, EOFError, ssl.SSLError, h11.ProtocolError, TimeoutError) as e:
            if session.requests == 0:
                verdict = "error"
            reason += f"; ended: {type(e).__name__}"
        except Exception as e:  # a bug: logged by type and place only (locals may hold a value)
            verdict, reason = "error", f"the gateway failed ({type(e).__name__}); the connection was closed"
            where = traceback.extract_tb(e.__traceback__)[-1]
            log.warning("egress.intercept_failed", error=type(e).__name__, at=f"{where.filename}:{where.lineno}")
        finally:
            for stream, raw in ((client, sock), (up, upstream)):
                if stream is not None:
                    await stream.close(graceful=graceful)
                else:
                    raw.close()
            served.record(
                EgressRecord(
                    workspace=served.label,
                    kind=kind,  # type: ignore[arg-type]
                    host=host,
                    port=port,
                    verdict=verdict,  # type: ignore[arg-type]
                    reason=reason,
                    rule=rule,
                    address=address,
                    bytes_up=len(first) + (client.raw_in if client else 0),
                    bytes_down=client.raw_out if client else 0,
                    duration_ms=round((time.perf_counter() - started) * 1000, 3),
                )
            )


def _why(e: BaseException) -> str:
    if isinstance(e, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {e.verify_message}"
    if isinstance(e, ssl.SSLError):
        return e.reason or type(e).__name__
    return str(e) or type(e).__name__
