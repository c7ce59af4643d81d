"""The core's side of the Ray integration: ``serve --ray`` and ``cluster ...`` are offered
without importing Ray, the integration is found by its entry point, and a missing extra
is a usage error that says what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from worker.cli import build_parser, main
from worker.plugins import IntegrationUnavailable, integration

ROOT = Path(__file__).resolve().parents[2]


def test_the_commands_offer_ray_without_importing_it() -> None:
    code = (
        "import sys; from worker.cli import build_parser; p = build_parser(); "
        "a = p.parse_args(['serve', '--ray', 'auto']); "
        "b = p.parse_args(['cluster', 'status', '--ray', 'h:6379', '--json']); "
        "print(a.ray, a.ray_namespace, b.action, b.ray, b.json, "
        "'ray' in sys.modules, 'worker.integrations' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["auto", "loom", "status", "h:6379", "True", "False", "False"]


def test_cluster_needs_an_address_and_an_action(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["cluster", "status"])
    assert e.value.code == 2 and "--ray" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["cluster"])
    assert e.value.code == 2
    assert build_parser().parse_args(["serve"]).ray is None  # serve stays local without it


def test_the_integration_is_found_by_its_entry_point() -> None:
    module = integration("ray")
    assert module.__name__ == "worker.integrations.ray.cli"
    assert callable(module.cluster_command) and callable(module.front_door)
    with pytest.raises(IntegrationUnavailable, match="pip install 'loom-worker\\[nope\\]'"):
        integration("nope")


def test_without_ray_installed_the_commands_say_what_to_install() -> None:
    # `ray` made unimportable (None in sys.modules), in a process of its own.
    code = (
        "import sys; sys.modules['ray'] = None; from worker.cli import main; "
        "sys.exit(main(['cluster', 'status', '--ray', 'auto']))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=str(ROOT))
    assert out.returncode == 2, out.stderr
    assert "needs 'ray': pip install 'loom-worker[ray]'" in out.stderr
