"""The egress pieces of a registry, from the process settings (``LOOM_EGRESS_*``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.logs import get_logger

from .policy import parse_allow_env

log = get_logger("worker.egress")


def workspace_key(root: Path) -> str:
    """The key of a workspace's socket directory (the one its container is named by)."""
    return hashlib.sha256(str(root).encode()).hexdigest()[:16]


def egress_dir_of(settings: Any) -> Path:
    return Path(settings.egress_dir) if settings.egress_dir else Path(settings.data_dir) / "egress"


def egress_parts(settings: Any) -> tuple[list[str], Callable[[Path], Path], Callable[[Any], Any]]:
    """``(default allowlist, socket directory of a workspace, gateway factory)``; the
    factory takes the registry's :class:`~worker.workspace_settings.Configs` and imports
    the gateway only when a workspace allowed out is first opened."""
    egress_dir = egress_dir_of(settings)

    def socket_dir(root: Path) -> Path:
        return egress_dir / workspace_key(root)

    def make_gateway(configs: Any) -> Any:
        from sandbox.spec import parse_size

        from ..workspace_settings import SettingsError
        from .addresses import HostAddresses, parse_networks
        from .gateway import EgressGateway, Limits
        from .log import EgressLog
        from .policy import EgressPolicy
        from .upstream import Upstream

        def policy_of(root: Path) -> EgressPolicy | None:
            try:
                policy: EgressPolicy = configs.policy(root)
                return policy
            except (SettingsError, OSError) as e:  # an unreadable settings file: nothing out
                log.warning("egress.policy_unreadable", workspace=str(root), error=str(e))
                return None

        upstream = Upstream(HostAddresses(), trusted=parse_networks(settings.egress_trusted_networks))
        limits = Limits(settings.egress_max_connections, parse_size(settings.egress_bytes_per_minute))
        interceptor = None
        if getattr(configs, "secrets", None) is not None:
            from .ca import upstream_context
            from .intercept import Interceptor

            extra = settings.egress_upstream_ca
            interceptor = Interceptor(configs.secrets, upstream_context(str(extra) if extra else None))
        log_store = EgressLog(Path(settings.data_dir))
        return EgressGateway(egress_dir, log_store, policy_of, upstream, limits, interceptor)

    return parse_allow_env(settings.egress_allow), socket_dir, make_gateway


def secrets_host(settings: Any) -> Any:
    """The registry's :class:`~worker.egress.provision.SecretsHost` (the secrets under the
    data directory, the workspaces' CAs)."""
    from .provision import SecretsHost

    return SecretsHost(Path(settings.data_dir))
