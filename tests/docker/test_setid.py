"""No setuid or setgid file, device node or file capability reaches the host from a
workspace, whoever owns it and whatever the runtime; and the kernel files that leak facts
about the host are masked.

Every way a command makes such a file is tried (``chmod``, ``install -m``, ``open`` with
a mode, ``tar -x``, ``cp -p``, ``mknod``, setting ``security.capability`` as ``setcap``
does), in a workspace owned by an ordinary user and in one owned by root (the sandbox then
runs as uid 0, without capabilities): the sandbox refuses, and the host's guard clears
whatever arrived another way, after the call.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from tests.docker.conftest import own_registry

pytestmark = pytest.mark.docker

#: A capability set as setcap writes it (VFS_CAP_REVISION_2, cap_net_raw permitted).
CAP = b"\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"

ATTEMPTS = r"""
cp /bin/true t1 && chmod 4755 t1
cp /bin/true t2 && chmod u+s,g+s t2
cp /bin/true t3 && chmod 2755 t3
install -m 4755 /bin/true t4
install -m 6755 /bin/true t5
python3 -c "import os; os.close(os.open('t6', os.O_CREAT | os.O_WRONLY, 0o4755))"
python3 -c "import os; os.close(os.open('t7', os.O_CREAT | os.O_WRONLY, 0o2755))"
python3 -c "import os; open('t8', 'w').close(); os.chmod('t8', 0o6755)"
python3 -c "import os; fd = os.open('t9', os.O_CREAT | os.O_WRONLY, 0o755); os.fchmod(fd, 0o4755)"
tar -xpf setid.tar
cp -p /usr/bin/su t10 || cp -p "$(command -v su || command -v passwd || echo /bin/su)" t10
mknod c1 c 1 3
mknod b1 b 7 0
python3 -c "import os; os.mknod('c2', 0o600 | 0o020000, os.makedev(1, 3))"
python3 -c "import os; os.mknod('f1', 0o4644 | 0o010000)"
cp /bin/true cap1 && python3 -c "import os; os.setxattr('cap1', 'security.capability', open('cap.bin', 'rb').read())"
command -v setcap && cp /bin/true cap2 && setcap cap_net_raw+ep cap2
mkdir d1 && chmod 2755 d1
true
"""


def _setid_tar() -> bytes:
    """An archive holding a setuid-root and a setgid file (as a downloaded tarball may)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, mode in (("x1", 0o4755), ("x2", 0o2755), ("dir/x3", 0o6755)):
            info = tarfile.TarInfo(name)
            info.mode, info.size, info.uid, info.gid = mode, 4, 0, 0
            tar.addfile(info, io.BytesIO(b"#!/\n"))
    return buf.getvalue()


def _offenders(ws: Path) -> list[str]:
    """Every setuid/setgid regular file, device node and file capability under ``ws``."""
    bad = []
    for dirpath, dirnames, filenames in os.walk(ws):
        for name in filenames + dirnames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                bad.append(f"{p}: device")
            elif stat.S_ISREG(st.st_mode):
                if st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                    bad.append(f"{p}: mode {oct(st.st_mode)}")
                if "security.capability" in os.listxattr(p, follow_symlinks=False):
                    bad.append(f"{p}: file capability")
    return bad


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
@pytest.mark.parametrize("owner", [1000, 0], ids=["user", "root"])
async def test_no_setid_file_device_or_capability_reaches_the_host(runtime: str, owner: int, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "setid.tar").write_bytes(_setid_tar())
    (ws / "cap.bin").write_bytes(CAP)
    for p in (ws, ws / "setid.tar", ws / "cap.bin"):
        os.chown(p, owner, owner)
    async with own_registry(tmp_path, runtime) as reg:
        r = await reg.execute("shell_execute", {"command": ATTEMPTS}, ws)
        said = r.output
        # What the sandbox refused shows in its output; what it let through the guard undid.
        assert "Operation not permitted" in said, said
        # Something that arrives another way (here: put there on the host, as a tool the
        # owner runs might) is caught after the next call, before anyone runs it.
        arrived = ws / "arrived"
        arrived.write_bytes(b"#!/bin/sh\n")
        os.chmod(arrived, 0o6755)
        os.setxattr(arrived, "security.capability", CAP)
        await reg.execute("shell_execute", {"command": "true"}, ws)
        w = await reg.workspace(ws)
        seen = {a.path for a in w.guard.last}
    assert "arrived" in seen
    assert _offenders(ws) == [], said
    assert not stat.S_IMODE(os.stat(arrived).st_mode) & 0o6000


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
async def test_kernel_facts_are_masked(runtime: str, tmp_path: Path) -> None:
    """/proc/config.gz and /sys/kernel/vmcoreinfo (the kernel's build configuration, its
    physical base address) read as nothing in a sandbox, whatever the host has."""
    ws = tmp_path / "ws"
    ws.mkdir()
    paths = ("/proc/config.gz", "/sys/kernel/vmcoreinfo", "/proc/kallsyms", "/sys/kernel/notes")
    async with own_registry(tmp_path, runtime) as reg:
        cmd = "; ".join(f"printf '%s ' $(cat {p} 2>/dev/null | wc -c)" for p in paths)
        r = await reg.execute("shell_execute", {"command": cmd}, ws)
    sizes = [int(x) for x in r.output.split()]
    assert sizes == [0] * len(paths), (paths, sizes)
    if runtime == "runc":
        # The test means something here: the host's own kernel has them to leak.
        assert os.path.getsize("/sys/kernel/vmcoreinfo") > 0 or not os.path.exists("/sys/kernel/vmcoreinfo")
