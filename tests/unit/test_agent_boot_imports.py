"""What the agent's boot imports: every sandbox's start pays for each module of the standard
library its package loads (``python3 -X importtime`` in the sandbox: ~25 ms of a ~65 ms
start), and 100 cold starts share two cores with the engine (docs/benchmarks.md, issue 44).
Modules only a rare operation needs are imported where it runs; this keeps them out."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "sandbox" / "agent"
#: Standard modules the agent's boot must not import (each costs 0.3-3 ms in the sandbox):
#: shutil (with bz2 and lzma) and fnmatch are for a move across file systems and the
#: search's Python fallback, queue was the tidying thread's, json (its package and the six
#: patterns it compiles) is replaced by ``jsonline`` (the C accelerator json itself uses),
#: base64 by binascii, the rest nothing of ours needs. (``re`` itself comes with subprocess,
#: through locale.)
NOT_AT_BOOT = [
    "shutil",
    "bz2",
    "lzma",
    "fnmatch",
    "queue",
    "heapq",
    "tempfile",
    "random",
    "hashlib",
    "json",
    "base64",
]


def test_the_agents_boot_imports_no_module_only_a_rare_op_needs(tmp_path: Path) -> None:
    # The package alone under another name, as the bundle loads it (no host package around it).
    shutil.copytree(AGENT, tmp_path / "agentprobe", ignore=shutil.ignore_patterns("__pycache__"))
    probe = (
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport agentprobe.main\n"
        # (as the boot does: its config line read, its hello sent)
        "agentprobe.jsonline.dumps(agentprobe.jsonline.loads(b'{\"a\": [1.5]}'))\n"
        f"loaded = {{m: m in sys.modules for m in {[*NOT_AT_BOOT, 'subprocess', '_json']!r}}}\n"
        "import json\nprint(json.dumps(loaded))"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded.pop("subprocess") and loaded.pop("_json")  # the probe sees what the boot imported
    assert not any(loaded.values()), [m for m, v in loaded.items() if v]
