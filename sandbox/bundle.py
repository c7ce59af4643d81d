"""The agent package (``sandbox/agent/``) as the one piece the host sends into a sandbox.

The bootstrap (:data:`sandbox.protocol.BOOTSTRAP`, a ``python3 -c`` program) reads one
length-prefixed program from stdin and runs it. That program is :data:`LOADER`: it reads
the package's module sources, which follow it on the same stdin, from the same buffered
object (so no byte is lost between the two, and the config line after them is the
agent's), installs a meta-path finder that serves them as the package ``loom_agent``,
and runs ``loom_agent.main``. Each module is compiled under its file name here
(``sandbox/agent/paths.py``), and the finder gives ``linecache`` the source, so a
traceback from inside a sandbox names the module and shows its lines.

Why the sources follow the loader as raw bytes instead of sitting in it as string
literals: a 100 KB literal costs the bootstrap's compile about 0.6 ms more, on the path
every cold start and every new connection awaits (the agent's hello). Why not a zip:
``zipimport`` needs a file, and a sandbox may have no writable directory.

Why compiled code follows the sources: compiling the package's ~270 KB of sources took
~30 ms of the agent's ~55 ms boot in a runc sandbox on this project's VM, on every cold
start and every new connection (and 100 sandboxes starting at once share two cores for
it). The host compiles them once per worker process and sends the code objects
(``marshal``) after the sources; the loader uses them only when the sandbox's interpreter
has the same bytecode magic number as the worker's, and compiles the sources itself
otherwise (any other Python, or a blob it cannot load). The sources still travel: they are
what a traceback shows.

Why the compiled code is kept in ``__pycache__``: every process that opens a sandbox (each
CLI command of a user who runs without the local worker, each test) compiled it again,
~80 ms of CPU. It is kept as Python keeps a module's ``.pyc``: in the package's
``__pycache__`` (when that directory is writable), named by the interpreter's cache tag
and the sha256 of its magic number and every source, so a changed source or another
Python is a miss (the newest file per cache tag is kept); written to a temporary name and
renamed, so a reader sees a whole file or none.

Nothing else is needed: the import system itself resolves ``from . import paths`` inside
the package, and ``importlib.machinery.ModuleSpec`` is taken from ``sys.__spec__`` (the
import of ``importlib`` would cost every start ~0.3 ms).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import marshal
import os
import sys
from pathlib import Path

#: The module name of the package inside the sandbox (any name works: the package's
#: modules import each other relatively).
PACKAGE = "loom_agent"
#: The package's directory on the host, and how its files are named in tracebacks.
SOURCE_DIR = Path(__file__).with_name("agent")
_SHOWN_AS = "sandbox/agent/"
#: Modules of the package that the agent never imports (``python3 -m sandbox.agent``).
_NOT_SHIPPED = frozenset({"__main__"})

#: Python >= 3.8, stdlib only, like the agent. ``%(modules)r`` becomes a tuple of
#: (module name, file name for tracebacks, is a package, source size in bytes), in the
#: order the sources follow.
LOADER = '''\
# loom-worker sandbox agent: the package sandbox/agent/, bundled by sandbox/bundle.py.
import sys

# importlib.machinery.ModuleSpec, without importing importlib (~0.3 ms of every start).
ModuleSpec = type(getattr(sys, "__spec__", None))
if ModuleSpec.__name__ != "ModuleSpec":
    from importlib.machinery import ModuleSpec

MODULES = %(modules)r
#: The bytecode magic number of the interpreter that compiled the code after the sources,
#: and that code's size in bytes (marshal of {module name: code object}).
MAGIC = %(magic)r
CODE_SIZE = %(code_size)d


class Loader(object):
    """Finds and loads the agent's modules from the sources that followed this program."""

    sources = {}  # type: dict
    codes = {}  # type: dict

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        entry = cls.sources.get(name)
        if entry is None:
            return None
        return ModuleSpec(name, cls, origin=entry[0], is_package=entry[1])

    @staticmethod
    def create_module(spec):
        return None

    @classmethod
    def exec_module(cls, module):
        filename, _package, source = cls.sources[module.__name__]
        code = cls.codes.pop(module.__name__, None)
        if code is None:
            code = compile(source, filename, "exec", dont_inherit=True)
        exec(code, module.__dict__)

    @classmethod
    def get_source(cls, name):
        return cls.sources[name][2].decode("utf-8")


def load():
    total = sum(m[3] for m in MODULES)
    # (the object the bootstrap read this program from)
    data = sys.stdin.buffer.read(total + CODE_SIZE)
    if len(data) != total + CODE_SIZE:
        raise EOFError("the agent's sources were cut short (%%d of %%d bytes)" %% (len(data), total + CODE_SIZE))
    pos = 0
    for name, filename, package, size in MODULES:
        Loader.sources[name] = (filename, package, data[pos : pos + size])
        pos += size
    # The import system's own module, loaded (frozen) in every CPython >= 3.5: its magic
    # number says whether code compiled by the worker runs here unchanged.
    bootstrap = sys.modules.get("_frozen_importlib_external")
    if CODE_SIZE and getattr(bootstrap, "MAGIC_NUMBER", None) == MAGIC:
        try:
            import marshal

            codes = marshal.loads(data[total:])
            if isinstance(codes, dict):
                Loader.codes = codes
        except Exception:
            pass  # compiled here from the sources instead
    sys.meta_path.insert(0, Loader)


load()
import %(package)s.main

%(package)s.main.run()
'''


def build(source_dir: Path = SOURCE_DIR, *, compiled: bool = True) -> tuple[bytes, bytes]:
    """The loader program and what it reads after itself (the sources, then, with
    ``compiled``, their code compiled by this interpreter), built from ``source_dir``.

    Raises OSError when a module cannot be read, SyntaxError when one does not compile.
    """
    modules = []
    sources = []
    for path in sorted(source_dir.glob("*.py")):
        if path.stem in _NOT_SHIPPED:
            continue
        src = path.read_bytes()
        package = path.stem == "__init__"
        name = PACKAGE if package else f"{PACKAGE}.{path.stem}"
        modules.append((name, _SHOWN_AS + path.name, package, len(src)))
        sources.append(src)
    code = _compiled(source_dir, modules, sources) if compiled else b""
    loader = LOADER % {
        "modules": tuple(modules),
        "package": PACKAGE,
        "magic": importlib.util.MAGIC_NUMBER if compiled else b"",
        "code_size": len(code),
    }
    return loader.encode("utf-8"), b"".join(sources) + code


def _compiled(source_dir: Path, modules: list[tuple[str, str, bool, int]], sources: list[bytes]) -> bytes:
    """The modules' code objects, marshalled: from the cache in ``__pycache__`` when it has
    them for these sources and this interpreter, else compiled (and kept there if it can)."""
    key = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    for (name, shown, _package, size), src in zip(modules, sources, strict=True):
        key.update(f"{name}\0{shown}\0{size}\0".encode())
        key.update(src)
    tag = f"loom-bundle.{sys.implementation.cache_tag}."
    cache = source_dir / "__pycache__" / f"{tag}{key.hexdigest()[:32]}.marshal"
    with contextlib.suppress(OSError):
        return cache.read_bytes()
    codes = {}
    for (name, shown, _package, _size), src in zip(modules, sources, strict=True):
        # As the loader compiles: no __future__ flags of ours, asserts kept (the agent's
        # interpreter runs without -O).
        codes[name] = compile(src, shown, "exec", dont_inherit=True, optimize=0)
    code = marshal.dumps(codes)
    tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(exist_ok=True)
        tmp.write_bytes(code)
        os.replace(tmp, cache)
        for old in cache.parent.glob(f"{tag}*.marshal"):  # earlier sources' code
            if old != cache:
                old.unlink(missing_ok=True)
    except OSError:  # a read-only installation: compiled every time, as before
        with contextlib.suppress(OSError):
            tmp.unlink()
    return code
