"""The agent runtime's volume: images/runtime (CPython, its standard library, ripgrep and
glibc's loader) copied once per image version into a named volume that every sandbox
mounts read-only, so any image can be a sandbox image."""

from __future__ import annotations

import asyncio

import docker.errors
from docker.types import Mount

from ..errors import ImageNotFoundError
from .config import LABEL_RUNTIME, LABEL_WORKER
from .engine import Engine

#: The runtime image's label saying which layout it has (images/runtime/Dockerfile), and the
#: lowest this worker runs with (2: bin/tini).
RUNTIME_LABEL = "dev.loom.agent-runtime"
RUNTIME_VERSION = 2


class RuntimeVolume:
    """The volume holding the agent runtime of one image (:attr:`name` once :meth:`ensure`
    has run)."""

    def __init__(self, engine: Engine, image: str) -> None:
        self._engine = engine
        self._image = image
        self._lock = asyncio.Lock()
        #: ``loom-agent-runtime-<image id>``, None until :meth:`ensure` ran.
        self.name: str | None = None

    async def ensure(self) -> str:
        """Make sure the agent runtime of the image is in a volume
        (``loom-agent-runtime-<image id>``), once per image version: the engine fills an
        empty named volume from the image when a container first mounts it, so creating
        (never starting) one container does the copy. Several workers may race here;
        volume create is idempotent and the copy happens once. Returns the volume's name.

        Raises ImageNotFoundError (the runtime image is not built, or is older than this
        worker), DaemonUnavailableError.
        """
        if self.name is not None:
            return self.name
        async with self._lock:
            if self.name is not None:
                return self.name
            client = await self._engine.connect()
            image = await self._engine.call("agent runtime image " + self._image, client.images.get, self._image)
            version = ((image.attrs.get("Config") or {}).get("Labels") or {}).get(RUNTIME_LABEL, "")
            if not version.isdigit() or int(version) < RUNTIME_VERSION:
                raise ImageNotFoundError(
                    f"agent runtime image {self._image} is older than this worker (version {version or 'none'}, "
                    f"{RUNTIME_VERSION} needed: it lacks the sandbox's init). Rebuild it: "
                    f"`docker build -t {self._image} images/runtime` (scripts/setup does)"
                )
            volume = "loom-agent-runtime-" + image.id.split(":")[-1][:12]

            def fill() -> None:
                try:
                    client.volumes.get(volume)
                    return
                except docker.errors.NotFound:
                    pass
                client.volumes.create(volume, labels={LABEL_WORKER: "1", LABEL_RUNTIME: image.id})
                helper = client.containers.create(
                    image.id,
                    command=["/opt/loom-runtime/lib/loader"],
                    mounts=[Mount(target="/opt/loom-runtime", source=volume, type="volume")],
                    network_mode="none",
                    labels={LABEL_WORKER: "1"},
                )
                helper.remove(force=True)

            await self._engine.call("fill the agent runtime volume", fill)
            self.name = volume
            return volume
