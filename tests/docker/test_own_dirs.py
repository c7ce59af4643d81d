"""The sandbox's own directories: /tmp is 1777 and $HOME the user's (0700), whatever the
image has at those paths. runc before 1.2 gives a tmpfs the mode of the image's directory
it covers, over the mount's own ``mode=``: an image whose /tmp is 0755 left it unwritable
("Permission denied" for the sandbox's user). Both are mounted owned by the sandbox's uid
and every agent sets their modes at start (sandbox/docker/config.py, sandbox/agent/main.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import docker
import pytest

from sandbox.base import ExecRequest
from tests.conftest import REQUIRE_DOCKER, SANDBOX_IMAGE
from tests.docker.conftest import own_backend, require_runtime

pytestmark = pytest.mark.docker

#: loom-sandbox:minimal with /tmp 0755 and a root-owned 0500 /home/sandbox
#: (images/test/build-test-images.sh).
ODD_IMAGE = "loom-test-tmp0755:latest"


def _require(image: str) -> None:
    client = docker.from_env()
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        if REQUIRE_DOCKER:
            pytest.fail(f"REQUIRE_DOCKER=1 but {image} is not built (images/test/build-test-images.sh)")
        pytest.skip(f"{image} is not built (images/test/build-test-images.sh)")
    finally:
        client.close()


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
@pytest.mark.parametrize("owner", [1000, 0], ids=["user", "root"])
@pytest.mark.parametrize("image", [ODD_IMAGE, SANDBOX_IMAGE], ids=["tmp-0755-image", "default-image"])
async def test_tmp_is_1777_and_home_the_users_whatever_the_image_has(
    docker_ready: None, workspace: Path, runtime: str, owner: int, image: str
) -> None:
    require_runtime(runtime)
    _require(image)
    os.chown(workspace, owner, owner)
    async with own_backend(runtime, image=image) as backend:
        box = await backend.get(workspace)
        r = await box.exec(
            ExecRequest(
                'stat -c "%a %u" /tmp "$HOME"; echo "$HOME"'
                ' && echo x > /tmp/f && echo x > "$HOME/f" && mkdir /tmp/d "$HOME/d"'
                " && python3 -c 'import tempfile; tempfile.mkstemp(); tempfile.mkdtemp(); print(\"ok\")'"
            )
        )
        assert r.exit_code == 0, r
        assert r.stdout.decode().split("\n") == [f"1777 {owner}", f"700 {owner}", "/home/sandbox", "ok", ""]
