"""The import graph of ``worker`` and ``sandbox``, built from the source (``ast``), keeps
three rules of the design:

- no import cycles (one set of known ones, below, while another branch removes them);
- ``sandbox`` never imports ``worker``;
- only ``sandbox.docker`` (a module today, becoming a package) imports the Docker SDK.

Every import counts: at module level, inside functions (imported when called: still a
dependency, and a cycle through one is a cycle of the design), and under
``if TYPE_CHECKING:`` (none is excluded: an annotation is a dependency too, and none forms
a cycle today). Modules imported by name from a table with ``importlib.import_module`` (the
CLI's command modules, the lazy exports of ``worker`` and ``worker.catalog``) count as
imports of the module that holds the table. Importing ``a.b.c`` from outside ``a.b``
also runs ``a/__init__`` and ``a/b/__init__``, so it depends on those too;
``from . import x`` of a submodule ``x`` depends on ``x`` only.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("worker", "sandbox")


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    #: Internal modules imported, each with the first line that imports it.
    imports: dict[str, int] = field(default_factory=dict)
    #: Top-level names of the external packages imported (``docker``, ``pydantic``...).
    external: dict[str, int] = field(default_factory=dict)


def _modules() -> dict[str, Module]:
    out: dict[str, Module] = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            out[".".join(parts)] = Module(".".join(parts), path, is_package)
    return out


def _imported_names(mod: Module, modules: dict[str, Module]) -> Iterator[tuple[str, int]]:
    """``(dotted name, line)`` of everything ``mod`` imports (resolved: relative imports
    made absolute, ``from X import sub`` as ``X.sub`` when ``sub`` is a module)."""
    tree = ast.parse(mod.path.read_text(), str(mod.path))
    package = mod.name if mod.is_package else mod.name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in modules else target), node.lineno
    # Module names in a table that importlib.import_module is given.
    if any(isinstance(n, ast.Attribute) and n.attr == "import_module" for n in ast.walk(tree)):
        for stmt in tree.body:
            value = stmt.value if isinstance(stmt, ast.Assign | ast.AnnAssign) else None
            if isinstance(value, ast.Dict):
                items: list[ast.expr | None] = list(value.values)
            elif isinstance(value, ast.Tuple | ast.List | ast.Set):
                items = list(value.elts)
            else:
                continue
            for item in items:
                if isinstance(item, ast.Constant) and isinstance(item.value, str):
                    name = item.value
                    if name.startswith("."):  # relative to the module (import_module(x, __name__))
                        name = mod.name + name if mod.is_package else package + name
                    if name in modules:
                        yield name, item.lineno


@cache
def graph() -> dict[str, Module]:
    modules = _modules()
    for mod in modules.values():
        for name, line in _imported_names(mod, modules):
            top = name.split(".")[0]
            if top not in PACKAGES:
                mod.external.setdefault(top, line)
                continue
            if name not in modules:
                continue  # (an attribute of a package, resolved to the package below)
            targets = [name]
            parts = name.split(".")
            for i in range(1, len(parts)):
                ancestor = ".".join(parts[:i])
                if not (mod.name == ancestor or mod.name.startswith(ancestor + ".")):
                    targets.append(ancestor)  # its __init__ runs first
            for target in targets:
                if target != mod.name:
                    mod.imports.setdefault(target, line)
    return modules


def _edges() -> dict[str, set[str]]:
    return {name: set(mod.imports) for name, mod in graph().items()}


def _components(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    counter = itertools.count()

    def visit(v: str) -> None:
        index[v] = low[v] = next(counter)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def cycles(edges: dict[str, set[str]] | None = None) -> set[tuple[str, ...]]:
    """Every elementary cycle of ``edges`` (default: the import graph), as a tuple
    starting at its smallest module name."""
    edges = _edges() if edges is None else edges
    out: set[tuple[str, ...]] = set()
    for component in _components(edges):
        for start in sorted(component):
            # Cycles through ``start`` over modules after it only: each cycle once.
            allowed = {m for m in component if m >= start}

            def walk(path: list[str], allowed: set[str] = allowed, start: str = start) -> None:
                for nxt in sorted(edges[path[-1]] & allowed):
                    if nxt == start:
                        out.add(tuple(path))
                    elif nxt not in path:
                        walk([*path, nxt])

            walk([start])
    return out


def _describe(cycle: tuple[str, ...]) -> str:
    mods = graph()
    hops = zip(cycle, (*cycle[1:], cycle[0]), strict=True)
    return " -> ".join(f"{a} ({mods[a].path.relative_to(ROOT)}:{mods[a].imports[b]})" for a, b in hops) + (
        f" -> {cycle[0]}"
    )


# -- the rules ---------------------------------------------------------------------------


def test_the_graph_is_built_from_the_real_imports() -> None:
    # A few edges known to exist, of each kind the builder must see (the check that it can
    # fail: a builder that found nothing would pass every rule below).
    mods = graph()
    assert "worker.registry.table" in mods["worker.registry.core"].imports  # module level, relative
    assert "sandbox.docker" in mods["worker.registry.default"].imports  # inside a function
    assert "worker.tools.catalog_tools" in mods["worker.registry.core"].imports  # under TYPE_CHECKING
    assert "worker.cli.sandboxes" in mods["worker.cli"].imports  # an importlib table
    assert "worker.registry" in mods["worker"].imports  # a lazy export (relative name)
    assert "worker.registry" in mods["worker.cli.service"].imports  # a package's __init__ runs first
    assert "sandbox" not in mods["sandbox.connection"].imports  # `from . import protocol`: the submodule
    assert "docker" in mods["sandbox.docker.engine"].external  # the package: one module holds the SDK client


def test_no_import_cycles() -> None:
    found = cycles()
    assert not found, "import cycles:\n" + "\n".join(_describe(c) for c in sorted(found))


def test_sandbox_never_imports_worker() -> None:
    bad = [
        f"{mod.path.relative_to(ROOT)}:{line} imports {target}"
        for mod in graph().values()
        if mod.name.split(".")[0] == "sandbox"
        for target, line in mod.imports.items()
        if target.split(".")[0] == "worker"
    ]
    assert not bad, "\n".join(bad)


def _may_import_docker(module: str) -> bool:
    # sandbox/docker.py today, sandbox/docker/** once it is a package.
    return module == "sandbox.docker" or module.startswith("sandbox.docker.")


def test_only_sandbox_docker_imports_the_docker_sdk() -> None:
    bad = [
        f"{mod.path.relative_to(ROOT)}:{mod.external['docker']}"
        for mod in graph().values()
        if "docker" in mod.external and not _may_import_docker(mod.name)
    ]
    assert not bad, "the Docker SDK imported outside sandbox.docker:\n" + "\n".join(bad)


def _is_integration(module: str) -> bool:
    return module == "worker.integrations" or module.startswith("worker.integrations.")


def test_no_core_module_imports_an_integration() -> None:
    # The optional extras (worker.integrations.*: the Ray cluster, the inspect_ai
    # provider) are found by entry point (worker.plugins; inspect's own group), never
    # imported by the core: the core must work without them and their projects (``ray``,
    # ``inspect_ai``) installed. They may import the core.
    mods = graph()
    assert "worker.service" in mods["worker.integrations.ray.workspaces"].imports  # the check can see them
    assert "worker.harness" in mods["worker.integrations.inspect.provider"].imports
    bad = [
        f"{mod.path.relative_to(ROOT)}:{line} imports {target}"
        for mod in mods.values()
        if not _is_integration(mod.name)
        for target, line in mod.imports.items()
        if _is_integration(target)
    ]
    assert not bad, "the core imports an integration:\n" + "\n".join(bad)
    only_integrations = [
        f"{mod.path.relative_to(ROOT)}:{mod.external[project]} imports {project}"
        for mod in mods.values()
        for project in ("ray", "inspect_ai")
        if project in mod.external and not _is_integration(mod.name)
    ]
    assert not only_integrations, "imported outside worker.integrations:\n" + "\n".join(only_integrations)


def test_the_cycle_finder_finds_every_cycle_once() -> None:
    edges = {"a": {"b"}, "b": {"c", "a"}, "c": {"a", "d"}, "d": {"a"}, "e": {"a"}}
    assert [sorted(c) for c in _components(edges)] == [["a", "b", "c", "d"]]
    assert cycles(edges) == {("a", "b"), ("a", "b", "c"), ("a", "b", "c", "d")}
    assert cycles({"a": {"b"}, "b": set()}) == set()
