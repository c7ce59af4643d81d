"""The egress pieces of a registry, from the process settings (``LOOM_EGRESS_*``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sandbox.identity import workspace_key
from sandbox.logs import get_logger

from .policy import parse_allow_env

if TYPE_CHECKING:  # only for annotations: the gateway's imports are paid when it is made
    from ..settings import Settings
    from ..workspace_settings import Configs
    from .gateway import EgressGateway
    from .provision import SecretsHost

log = get_logger("worker.egress")

GatewayFactory = Callable[["Configs"], "EgressGateway"]


def egress_dir_of(settings: Settings) -> Path:
    return Path(settings.egress_dir) if settings.egress_dir else Path(settings.data_dir) / "egress"


def egress_parts(settings: Settings) -> tuple[list[str], Callable[[Path], Path], GatewayFactory]:
    """``(default allowlist, socket directory of a workspace, gateway factory)``; the
    factory takes the registry's :class:`~worker.workspace_settings.Configs` and imports
    the gateway only when a workspace allowed out is first opened."""
    egress_dir = egress_dir_of(settings)

    def socket_dir(root: Path) -> Path:
        # The same directory EgressGateway.socket_dir names: both use the workspace key.
        return egress_dir / workspace_key(root)

    def make_gateway(configs: Configs) -> EgressGateway:
        from sandbox.spec import parse_size

        from ..workspace_settings import SettingsError
        from .addresses import HostAddresses, parse_networks
        from .gateway import EgressGateway, Limits
        from .log import EgressLog
        from .overrides import parse_overrides
        from .policy import EgressPolicy
        from .upstream import Upstream

        def policy_of(root: Path) -> EgressPolicy | None:
            try:
                return configs.policy(root)
            except (SettingsError, OSError) as e:  # an unreadable settings file: nothing out
                log.warning("egress.policy_unreadable", workspace=str(root), error=str(e))
                return None

        upstream = Upstream(
            HostAddresses(),
            trusted=parse_networks(settings.egress_trusted_networks),
            overrides=parse_overrides(settings.egress_hosts),
        )
        limits = Limits(settings.egress_max_connections, parse_size(settings.egress_bytes_per_minute))
        interceptor = None
        if configs.secrets is not None:
            from .ca import upstream_context
            from .intercept import Interceptor

            extra = settings.egress_upstream_ca
            interceptor = Interceptor(configs.secrets, upstream_context(str(extra) if extra else None))
        log_store = EgressLog(Path(settings.data_dir))
        return EgressGateway(egress_dir, log_store, policy_of, upstream, limits, interceptor)

    return parse_allow_env(settings.egress_allow), socket_dir, make_gateway


def secrets_host(settings: Settings) -> SecretsHost:
    """The registry's :class:`~worker.egress.provision.SecretsHost` (the secrets under the
    data directory, the workspaces' CAs)."""
    from .provision import SecretsHost

    return SecretsHost(Path(settings.data_dir))
