"""The real installer of the agents store (:data:`worker.agents.store.Installer`): ``npm
install`` run inside a loom sandbox of the default image whose workspace is the staging
directory, reaching the network only through loom's egress gateway with the npm registry's
hosts allowed (the ``npm`` preset) and nothing else. npm's cache is in the staging directory
(an agent's native binary and the cache outgrow a sandbox's $HOME); nothing is recorded:
the registry has no changelog, and the staging workspace's data directory is removed after.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from .store import NPM_CACHE, Installer, InstallError, Progress

if TYPE_CHECKING:
    from ..settings import Settings

#: npm in the sandbox: no audit nor funding calls (hosts the allowlist does not have), no
#: dev dependencies, errors only; the cache in the staging directory (the workspace).
NPM_ARGS = ("npm", "install", "--no-audit", "--no-fund", "--omit=dev", "--loglevel=error", "--no-update-notifier")
#: A whole agent (its native binary ~200-400 MB) through a slow link: generous.
INSTALL_TIMEOUT = 1800.0


#: npm's codes for a certificate it cannot verify: on a network whose proxy intercepts TLS,
#: the sandbox trusts only its image's CAs unless it is given the proxy's.
_TLS_CODES = (
    "SELF_SIGNED_CERT_IN_CHAIN",
    "DEPTH_ZERO_SELF_SIGNED_CERT",
    "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
    "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
    "CERT_UNTRUSTED",
)


def tls_hint(npm_output: str) -> str:
    """What to do when npm's failure is a certificate the sandbox cannot verify ("" else)."""
    code = next((c for c in _TLS_CODES if c in npm_output), None)
    if code is None:
        return ""
    return (
        f"\n\nnpm could not verify the registry's certificate ({code}): a proxy between this host "
        "and the registry intercepts TLS, and the sandbox does not trust its CA. Give the sandbox "
        "that CA: LOOM_CA_BUNDLE=/path/to/ca-bundle.pem (for example this host's own "
        "/etc/ssl/certs/ca-certificates.crt, if it trusts the proxy); see docs/egress.md."
    )


def sandbox_installer(settings: Settings) -> Installer:
    """An installer running npm in a sandbox made from ``settings`` (their image, runtime,
    CA bundle), with the ``npm`` egress preset only and room for npm in $HOME and /tmp."""

    async def install(stage: Path, package_spec: str, progress: Progress) -> None:
        from ..changelog.recorder import workspace_dir
        from ..registry import default_registry

        own = settings.model_copy(update={"egress_allow": "npm", "home_size": "1g", "tmp_size": "1g", "memory": "2g"})
        registry = default_registry(own, changelog=False, catalog=False)
        tail = bytearray()

        def on_output(_stream: str, data: bytes) -> None:
            tail.extend(data)
            del tail[:-4000]
            for line in data.decode(errors="replace").splitlines():
                if line.strip():
                    progress(f"npm: {line.strip()}")

        try:
            async with registry:
                out = await registry.sandbox(stage).exec(
                    [*NPM_ARGS, f"--cache=/workspace/{NPM_CACHE}", package_spec],
                    timeout=INSTALL_TIMEOUT,
                    on_output=on_output,
                )
                await registry.stop(stage)
        finally:
            # The staging workspace's own data (settings, egress log) must not outlive it.
            shutil.rmtree(workspace_dir(settings.data_dir, stage), ignore_errors=True)
        if out.returncode != 0:
            why = out.outcome if out.returncode is None else f"exit {out.returncode}"
            text = (out.stderr or out.stdout or bytes(tail)).decode(errors="replace").strip()
            raise InstallError(f"npm install {package_spec} failed ({why}): {text[-2000:]}{tls_hint(text)}")

    return install
