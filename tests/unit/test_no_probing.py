"""No ``getattr``/``hasattr`` probing of our own registry, sandbox and service objects in
``worker/`` (issue 39): what a registry offers is declared (:mod:`worker.registry.contract`:
:class:`~worker.registry.contract.ServiceRegistry` and its capability Protocols, checked
with ``isinstance``), and so is what a sandbox, a recorder or a workspace offers. A probe
hides a contract: the object that passes it may be a stand-in made to pass it.

Found from the source (``ast``): a ``getattr``/``hasattr`` whose object is named as ours
(:data:`OURS`) is refused unless :data:`ALLOWED` lists it, with why. Attributes of other
libraries' objects (argparse's namespaces, FastAPI's routes, an exception's ``errno``)
are not ours to declare.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: An object is ours when its expression names one of these (``registry``,
#: ``self._sandbox``, ``ws.recorder``, ``await self._reg()``...).
OURS = re.compile(
    r"(?<![A-Za-z0-9])_?(registry|reg|sandbox|box|service|backend|recorder|workspace|ws|configs|journal|pool"
    r"|runner|token|tool|have|loc|node_service)(?![A-Za-z0-9])"
)

_DISPATCH = (
    "dispatch by name, not probing: the name is one of a fixed table checked first (a Ray actor's "
    "methods are reached so: its handle has no other way)"
)

#: (file, the probed object's source): why it is not a probe.
ALLOWED: dict[tuple[str, str], str] = {
    ("worker/integrations/ray/client.py", "loc.service"): _DISPATCH + " (node_call, _invoke: the node's CHANNEL_OPS)",
    ("worker/integrations/ray/node.py", "ws"): _DISPATCH + " (workspace_call: one of PARTS)",
    ("worker/integrations/ray/node.py", "getattr(ws, part)"): _DISPATCH
    + " (workspace_call: a public method of the part, the cluster API's remote call)",
}


def _probes() -> list[tuple[str, int, str]]:
    """``(file, line, object's source)`` of every getattr/hasattr on an object of ours."""
    out = []
    for path in sorted((ROOT / "worker").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "hasattr")
                and node.args
            ):
                target = ast.unparse(node.args[0])
                if OURS.search(target):
                    out.append((rel, node.lineno, target))
    return out


def test_no_getattr_probing_of_our_objects() -> None:
    found = [(f, line, t) for f, line, t in _probes() if (f, t) not in ALLOWED]
    listed = "\n".join(f"  {f}:{line}: {t}" for f, line, t in found)
    assert not found, f"getattr/hasattr on our own objects (declare a Protocol, check it with isinstance):\n{listed}"


def test_every_allowed_probe_is_still_there() -> None:
    present = {(f, t) for f, _line, t in _probes()}
    assert set(ALLOWED) <= present, f"stale entries: {sorted(set(ALLOWED) - present)}"


def test_the_finder_finds_a_probe() -> None:
    tree = ast.parse("getattr(registry, 'configs', None); getattr(args, 'backend'); hasattr(self._sandbox, 'spawn')")
    calls = [ast.unparse(n.args[0]) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert [t for t in calls if OURS.search(t)] == ["registry", "self._sandbox"]
