"""The agent runs inside any image on python3 >= 3.8 and must stay stdlib-only: every module
of the package ``sandbox/agent/`` and the bundle's loader. And the bundle the host sends is
a working agent on a bare interpreter (``-I -S``: no site, no host path, no ``sandbox``)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sandbox import bundle, protocol

MODULES = sorted(bundle.SOURCE_DIR.glob("*.py"))
LOADER = bundle.build()[0].decode()


def _sources() -> list[tuple[str, str]]:
    return [(p.name, p.read_text()) for p in MODULES] + [("<loader>", LOADER)]


def test_the_package_is_what_gets_bundled() -> None:
    names = {p.stem for p in MODULES}
    assert {"__init__", "main"} <= names
    table = next(
        node.value
        for node in ast.parse(LOADER).body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "MODULES"
    )
    shipped = {m[0] for m in ast.literal_eval(table)}
    assert shipped == {bundle.PACKAGE} | {f"{bundle.PACKAGE}.{n}" for n in names - {"__init__", "__main__"}}


def _package_imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out |= {a.name for a in node.names} if node.module is None else {node.module}
    return out


def test_the_modules_import_each_other_without_cycles() -> None:
    graph = {p.stem: _package_imports(p) for p in MODULES}
    assert set().union(*graph.values()) <= set(graph), "a relative import of a module that is not there"
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join((*path, name))
        if name not in done:
            for dep in sorted(graph[name]):
                visit(dep, (*path, name))
            done.add(name)

    for name in sorted(graph):
        visit(name, ())


@pytest.mark.parametrize(("name", "src"), _sources(), ids=[n for n, _ in _sources()])
def test_parses_with_python_3_8_grammar(name: str, src: str) -> None:
    ast.parse(src, filename=name, feature_version=(3, 8))


@pytest.mark.parametrize(("name", "src"), _sources(), ids=[n for n, _ in _sources()])
def test_imports_only_the_standard_library_and_the_package(name: str, src: str) -> None:
    names = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # The package's own modules, always relative: inside the sandbox the
                # package is ``loom_agent``, on the host ``sandbox.agent``.
                assert node.level == 1 and name != "<loader>", (name, ast.dump(node))
                continue
            names.add((node.module or "").split(".")[0])
    if name == "<loader>":
        names.discard(bundle.PACKAGE)
    assert names <= set(sys.stdlib_module_names), names - set(sys.stdlib_module_names)


@pytest.mark.parametrize(("name", "src"), _sources(), ids=[n for n, _ in _sources()])
def test_uses_no_api_newer_than_3_8(name: str, src: str) -> None:
    newer = ["removeprefix", "removesuffix", "functools.cache(", "zoneinfo", "match ", "tomllib", "| None ="]
    code_lines = [line for line in src.splitlines() if not line.lstrip().startswith("#")]
    for token in newer:
        hits = [line for line in code_lines if token in line and "# type:" not in line]
        assert not hits, (token, hits[:3])


@pytest.mark.parametrize(("name", "src"), _sources(), ids=[n for n, _ in _sources()])
def test_annotations_are_not_evaluated(name: str, src: str) -> None:
    """No runtime annotations (list[str] would fail on 3.8): the agent uses type comments."""
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef):
            assert node.returns is None and all(a.annotation is None for a in node.args.args), node.name
        assert not isinstance(node, ast.AnnAssign), getattr(node, "lineno", "?")


def _boot(tmp_path: Path, config: dict[str, object]) -> subprocess.Popen[bytes]:
    """The bundle under a bare interpreter, as a container starts it (cwd: not the repo)."""
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", protocol.BOOTSTRAP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    assert proc.stdin is not None
    proc.stdin.write(protocol.boot_payload(config))
    proc.stdin.flush()
    return proc


def test_the_bundle_runs_on_a_bare_interpreter(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f.txt").write_text("hi")
    proc = _boot(tmp_path, {"root": str(ws), "activity_file": str(tmp_path / "act"), "nonce": "n0"})
    assert proc.stdin is not None and proc.stdout is not None
    hello = json.loads(proc.stdout.readline())
    assert hello["id"] == 0 and hello["ok"] and hello["k"] == "n0"
    assert hello["result"]["version"] == "1" and hello["result"]["pid"] == proc.pid
    proc.stdin.write(b'{"id":1,"op":"stat","path":"f.txt"}\n')
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline())
    assert answer["ok"] and answer["result"]["type"] == "file" and answer["result"]["size"] == 2
    proc.stdin.close()
    assert proc.wait(10) == 0
    assert proc.stderr is not None and proc.stderr.read() == b""


def test_a_traceback_from_the_bundle_names_the_module(tmp_path: Path) -> None:
    proc = _boot(tmp_path, {"root": str(tmp_path / "missing")})
    _out, err = proc.communicate(timeout=10)
    assert proc.returncode == 1
    text = err.decode()
    assert 'File "sandbox/agent/' in text and "FileNotFoundError" in text, text


def _hello_with(tmp_path: Path, loader: bytes, rest: bytes, probe: str) -> dict[str, object]:
    """Boot ``loader`` + ``rest`` (a bundle, maybe altered) under a bare interpreter with a
    loader that also reports ``probe`` (an expression in the loader's namespace) on stderr."""
    loader = loader.replace(b"\nload()\n", b"\nload()\nsys.stderr.write(repr(" + probe.encode() + b") + '\\n')\n")
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    config = {"root": str(ws), "activity_file": str(tmp_path / "act"), "nonce": "n0"}
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", protocol.BOOTSTRAP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
    )
    out, err = proc.communicate(b"%d\n" % len(loader) + loader + rest + protocol.encode(config), timeout=10)
    hello = json.loads(out.splitlines()[0])
    assert hello["ok"] and hello["k"] == "n0", (out, err)
    return {"probe": err.decode().splitlines()[0], "code": proc.returncode}


def test_the_code_compiled_by_the_worker_is_what_runs_when_the_magic_matches(tmp_path: Path) -> None:
    loader, rest = bundle.build()
    got = _hello_with(tmp_path, loader, rest, "sorted(Loader.codes)")
    # every module's code came with the bundle, ready before the first import
    shipped = {p.stem for p in MODULES} - {"__init__", "__main__"}
    assert got["code"] == 0
    assert got["probe"] == repr(sorted([bundle.PACKAGE, *(f"{bundle.PACKAGE}.{n}" for n in shipped)]))


@pytest.mark.parametrize("how", ["other magic", "damaged code", "no code"])
def test_the_sources_are_compiled_when_the_shipped_code_cannot_be_used(tmp_path: Path, how: str) -> None:
    """Another interpreter (another magic number), code that does not load, or none: the
    agent compiles its sources itself and works the same."""
    loader, rest = bundle.build(compiled=how != "no code")
    if how == "other magic":
        magic = repr(__import__("importlib.util").util.MAGIC_NUMBER).encode()
        loader = loader.replace(b"MAGIC = " + magic, b"MAGIC = b'nope'")
    elif how == "damaged code":
        _, sources = bundle.build(compiled=False)
        rest = sources + b"\xff" * (len(rest) - len(sources))
    got = _hello_with(tmp_path, loader, rest, "len(Loader.codes)")
    assert got == {"probe": "0", "code": 0}


def test_the_compiled_code_is_kept_for_these_sources_and_this_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kept in the package's __pycache__ and used by the next build (no compile); a changed
    source is a miss whose code replaces the old file; a directory that cannot be written
    still gets a bundle, compiled."""
    import builtins
    import shutil

    src = tmp_path / "agent"
    shutil.copytree(bundle.SOURCE_DIR, src, ignore=shutil.ignore_patterns("__pycache__"))
    first = bundle.build(src)
    kept = sorted((src / "__pycache__").glob("loom-bundle.*.marshal"))
    assert len(kept) == 1 and kept[0].read_bytes() == first[1][-len(kept[0].read_bytes()) :]

    real_compile = builtins.compile
    compiled: list[str] = []

    def counting(source: object, filename: str, *args: object, **kw: object) -> object:
        compiled.append(filename)
        return real_compile(source, filename, *args, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "compile", counting)
    assert bundle.build(src) == first and compiled == []  # from the cache

    (src / "tidy.py").write_bytes((src / "tidy.py").read_bytes() + b"\n# changed\n")
    changed = bundle.build(src)
    assert compiled and changed != first
    now = sorted((src / "__pycache__").glob("loom-bundle.*.marshal"))
    assert len(now) == 1 and now != kept

    compiled.clear()
    shutil.rmtree(src / "__pycache__")
    (src / "__pycache__").write_text("not a directory")  # nothing can be kept
    assert bundle.build(src) == changed and compiled
