"""The composition: the production :class:`~.core.ToolRegistry`, wired from the settings.

Everything a registry is built from is made here and passed in (the Docker backend, the
changelog of each workspace, the per-workspace settings, the egress gateway's factory, the
call journal, the tool catalog); nothing is set on it from outside afterwards.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..background import BackgroundLimits
from ..workspace import ChangeRecorder
from ..workspace_settings import Caps, Configs, SettingsStore
from .core import ToolRegistry
from .pool import RecorderFactory

if TYPE_CHECKING:
    from ..settings import Settings


def default_registry(
    settings: Settings | None = None,
    *,
    recorder_factory: RecorderFactory | None = None,
    changelog: bool = True,
    catalog: bool | None = None,
    **settings_overrides: Any,
) -> ToolRegistry:
    """The six built-in tools on the Docker sandbox backend, configured by ``Settings``,
    recording every change in each workspace's changelog under ``settings.data_dir``
    (``changelog=False`` or an explicit ``recorder_factory`` replaces that).

    With the catalog (``catalog``, default ``settings.catalog``) it also has
    ``tool_search``, the custom YAML tools and the configured MCP servers' tools (see
    :mod:`worker.tools.catalog_tools`); the catalog database opens on the first search.

    ``settings_overrides`` are ``worker.settings.Settings`` fields (``image="..."``,
    ``runtime="runsc"``). No daemon is contacted until the first call. Use as
    ``async with default_registry() as registry:``. Raises pydantic's ValidationError
    for settings that do not validate.
    """
    # Imported here: the Docker SDK, the settings' sources and the catalog cost a fraction
    # of a second that a registry built by hand (unit tests, the CLI's listings) never pays.
    from sandbox.docker import DockerBackend
    from sandbox.spec import SandboxSpec

    from ..calls import CallJournal
    from ..egress.setup import egress_parts, secrets_host
    from ..settings import Settings

    if settings is None:
        settings = Settings(**settings_overrides)
    elif settings_overrides:
        settings = settings.model_copy(update=settings_overrides)
    backend = DockerBackend(
        SandboxSpec(**settings.sandbox_spec_kwargs()),
        base_url=settings.docker_host,
        max_parallel_starts=settings.max_parallel_starts,
        pool=settings.pool_config(),
    )
    own_recorders = False
    if recorder_factory is None and changelog:
        # Every change is recorded (Spec 11) unless the caller opts out: the changelog of
        # each workspace lives under settings.data_dir, outside the workspace.
        from ..changelog import Changelog

        data_dir, limits = settings.data_dir, settings.changelog_limits()

        def recorder_factory(root: Path) -> ChangeRecorder:
            return Changelog.open(data_dir, root, limits=limits)

        own_recorders = True
    egress_default, socket_dir, make_gateway = egress_parts(settings)
    configs = Configs(
        SettingsStore(settings.data_dir),
        settings.sandbox_spec_kwargs(),
        Caps.from_settings(settings),
        egress_default=egress_default,
        egress_socket_dir=socket_dir,
        secrets=secrets_host(settings),
    )
    background = BackgroundLimits(
        max_processes=settings.max_processes,
        timeout=settings.process_timeout,
        max_timeout=settings.max_process_timeout,
        linger=settings.process_linger,
    )
    catalog_tools = None
    if catalog if catalog is not None else settings.catalog:
        # tool_search, the custom YAML tools and the configured MCP servers' tools.
        from ..tools.catalog_tools import CatalogTools

        catalog_tools = CatalogTools.from_settings(settings)
    journal = CallJournal(settings.data_dir, max_bytes=settings.call_journal_bytes)
    registry = ToolRegistry(
        backend=backend,
        recorder_factory=recorder_factory,
        own_recorders=own_recorders,
        configs=configs,
        background=background,
        egress_factory=lambda: make_gateway(configs),
        journal=journal,
        catalog_tools=catalog_tools,
    )

    async def close_journal() -> None:
        journal.close()

    registry.add_closer(close_journal)
    return registry
