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

Nothing else is needed: the import system itself resolves ``from . import paths`` inside
the package, and ``importlib.machinery.ModuleSpec`` is taken from ``sys.__spec__`` (the
import of ``importlib`` would cost every start ~0.3 ms).
"""

from __future__ import annotations

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


class Loader(object):
    """Finds and loads the agent's modules from the sources that followed this program."""

    sources = {}  # type: dict

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
        exec(compile(source, filename, "exec", dont_inherit=True), module.__dict__)

    @classmethod
    def get_source(cls, name):
        return cls.sources[name][2].decode("utf-8")


def load():
    total = sum(m[3] for m in MODULES)
    data = sys.stdin.buffer.read(total)  # the object the bootstrap read this program from
    if len(data) != total:
        raise EOFError("the agent's sources were cut short (%%d of %%d bytes)" %% (len(data), total))
    pos = 0
    for name, filename, package, size in MODULES:
        Loader.sources[name] = (filename, package, data[pos : pos + size])
        pos += size
    sys.meta_path.insert(0, Loader)


load()
import %(package)s.main

%(package)s.main.run()
'''


def build(source_dir: Path = SOURCE_DIR) -> tuple[bytes, bytes]:
    """The loader program and the sources it reads after itself, built from ``source_dir``.

    Raises OSError when a module cannot be read.
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
    loader = LOADER % {"modules": tuple(modules), "package": PACKAGE}
    return loader.encode("utf-8"), b"".join(sources)
