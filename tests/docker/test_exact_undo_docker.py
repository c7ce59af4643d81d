"""Undo gives back exactly the tree there was, on the real engine, runc and gVisor.

A realistic session on a real project's source (``tests/fixtures/tinycalc``: a package, a
test suite, a ``pyproject.toml``/``setup.py`` build) run as an agent would: its tests,
bytecode, a venv, a build, an install with ``pip --target``, git (init, commit, branch),
edits, renames, deletions, modes and links. Then ``undo --all`` and the whole tree state
(paths, kinds, modes, bytes, link targets) must equal the one taken before the first call.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandbox.base import ExecRequest
from tests.treehash import tree_diff, tree_state
from worker.changelog import Changelog
from worker.workspace import Workspace

pytestmark = pytest.mark.docker

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "tinycalc"
GIT = "git -c user.name=agent -c user.email=agent@example.invalid -c init.defaultBranch=main"


def _own(root: Path, uid: int = 1000) -> None:
    for p in [root, *root.rglob("*")]:
        os.lchown(p, uid, uid)


@pytest.fixture
async def session(runtime_backend, user_workspace: Path, tmp_path: Path) -> AsyncIterator[Workspace]:
    shutil.copytree(FIXTURE, user_workspace, dirs_exist_ok=True)
    _own(user_workspace)
    box = await runtime_backend.get(user_workspace)
    cl = Changelog.open(tmp_path / "data", user_workspace)
    try:
        yield Workspace(user_workspace, box, cl)
    finally:
        await cl.aclose()


async def run(ws: Workspace, command: str, call_id: str, timeout: float = 300) -> list[str]:
    r, changed = await ws.run_shell(ExecRequest(command, timeout=timeout), call_id=call_id)
    assert r.exit_code == 0, (command, r.outcome, r.stdout[-2000:], r.stderr[-2000:])
    return changed


async def test_a_real_project_session_is_undone_exactly(session: Workspace) -> None:
    ws, cl, box = session, session.recorder, session.sandbox
    assert isinstance(cl, Changelog)
    root = ws.root
    before = tree_state(root)
    await run(ws, "python3 -m unittest discover -s tests -q", "tests")
    await run(ws, "python3 -m compileall -q tinycalc tests && test -d tinycalc/__pycache__", "bytecode")
    new_ops = (root / "tinycalc/ops.py").read_bytes() + b"\n\ndef neg(a):\n    return -a\n"
    await ws.write("tinycalc/ops.py", new_ops, tool="edit_file", call_id="edit")
    await run(ws, "python3 -m venv .venv && .venv/bin/python -m pip --version", "venv")
    await run(ws, ".venv/bin/python setup.py -q build && test -f build/lib/tinycalc/parser.py", "build")
    await run(ws, ".venv/bin/python setup.py -q egg_info && python3 -m compileall -q build", "egg-info")
    after_build = tree_state(root)
    # A real wheel the image has (no index is reachable): hundreds of files in deps/.
    wheel = "/usr/share/python-wheels/setuptools-*.whl"
    await run(ws, f".venv/bin/pip install -q --no-index --target deps {wheel}", "target")
    await run(ws, f"{GIT} init -q && {GIT} add -A && {GIT} commit -qm import && {GIT} checkout -qb fix", "git")
    await run(
        ws,
        f"sed -i 's/division by zero/cannot divide by zero/' tinycalc/ops.py && {GIT} commit -qam fix"
        f" && {GIT} stash list && {GIT} status --porcelain",
        "commit",
    )
    await run(
        ws,
        "mv README.md README.rst && chmod 755 tinycalc/cli.py && ln -s tinycalc/cli.py tinycalc-run"
        " && rm tests/__init__.py && mkdir -p dist && tar -czf dist/tinycalc.tgz tinycalc && chmod 700 tests",
        "misc",
    )
    entries = await cl.log()
    # Whole trees are one entry each (.venv, .git, each __pycache__), not thousands.
    assert len(entries) < 150, len(entries)
    assert any(e.path == ".venv" and e.is_tree and (e.tree_files or 0) > 100 for e in entries)
    # Undo of one command among several removes exactly what it did.
    later = tree_state(root)
    await cl.undo(box, call_id="venv")
    gone = sorted({p.split("/")[0] for p in set(later) - set(tree_state(root))})
    assert gone == [".venv"]
    # The rest goes back too: exactly the tree there was.
    preview = await cl.undo(box, all=True, dry_run=True)
    assert [s for s in preview.steps if s.status == "not_restorable"] == []
    result = await cl.undo(box, all=True)
    assert [s for s in result.steps if s.status not in ("reverted", "already_reverted")] == []
    assert tree_diff(before, tree_state(root)) == []
    assert after_build != before  # the session did change the tree


async def test_a_deep_node_modules_is_one_entry_and_undone(session: Workspace) -> None:
    ws, cl = session, session.recorder
    assert isinstance(cl, Changelog)
    before = tree_state(ws.root)
    await run(ws, "true", "baseline")
    made = await run(
        ws,
        'python3 -c "import os\n'
        "for i in range(150):\n"
        "    d = 'node_modules/@scope/p%d/lib/sub' % i\n"
        "    os.makedirs(d)\n"
        "    for j in range(20):\n"
        "        open('%s/f%d.js' % (d, j), 'w').write('module.exports = %d' % j)\n\"",
        "install",
    )
    assert made == ["node_modules/"]
    (entry,) = await cl.log(call_id="install")
    assert entry.is_tree and entry.tree_files == 3000
    assert await run(ws, "true", "noop") == []
    assert await cl.log(call_id="noop") == []
    await cl.undo(ws.sandbox, call_id="install")
    assert tree_diff(before, tree_state(ws.root)) == []


async def test_a_file_over_the_cap_is_the_one_path_not_restorable(session: Workspace) -> None:
    ws, cl = session, session.recorder
    assert isinstance(cl, Changelog)
    big = ws.root / "data.bin"
    big.write_bytes(os.urandom(20 << 20))  # 20 MiB: over the 16 MiB per-file cap
    os.chown(big, 1000, 1000)
    before = tree_state(ws.root)
    await run(ws, "true", "baseline")
    await run(ws, "echo tail >> data.bin && echo x >> tinycalc/ops.py && rm setup.py && mkdir out && touch out/o", "c")
    preview = await cl.undo(ws.sandbox, all=True, dry_run=True)
    assert [s.path for s in preview.steps if s.status == "not_restorable"] == ["data.bin"]
    await cl.undo(ws.sandbox, all=True)
    diff = tree_diff(before, tree_state(ws.root))
    assert len(diff) == 1 and diff[0].startswith("data.bin:"), diff
