"""The seccomp profile's content (sandbox/docker/seccomp.py) and the checks that it is in
effect, without an engine (tests/docker/test_seccomp.py probes it from inside)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox.docker import seccomp
from sandbox.docker.checks import check_seccomp_mode, runsc_applies_seccomp
from sandbox.errors import RuntimeUnavailableError
from sandbox.spec import SandboxSpec


def _rules(name: str) -> list[dict[str, Any]]:
    return [r for r in seccomp.build()["syscalls"] if name in r["names"]]


def test_nothing_denied_is_allowed_by_any_rule() -> None:
    allowed = {n for r in seccomp.build()["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]}
    denied = {n for _why, names in seccomp.DENIED.values() for n in names}
    assert denied and not denied & allowed
    for name in ("mount", "umount2", "unshare", "setns", "bpf", "perf_event_open", "keyctl", "add_key",
                 "request_key", "userfaultfd", "init_module", "finit_module", "delete_module", "kexec_load",
                 "kexec_file_load", "reboot", "chroot", "pivot_root", "swapon", "acct", "io_uring_setup",
                 "io_uring_enter", "io_uring_register", "fsopen", "open_tree", "move_mount"):  # fmt: skip
        assert name not in allowed, name
    assert seccomp.build()["defaultAction"] == "SCMP_ACT_ERRNO"


def test_ptrace_may_trace_children_but_never_attach() -> None:
    requests = {r["args"][0]["value"] for r in _rules("ptrace")}
    assert all(r["action"] == "SCMP_ACT_ALLOW" and len(r["args"]) == 1 for r in _rules("ptrace"))
    assert 0 in requests  # PTRACE_TRACEME
    assert {7, 17, 24, 0x4200}.issubset(requests)  # CONT, DETACH, SYSCALL, SETOPTIONS on a tracee
    assert 16 not in requests and 0x4206 not in requests  # PTRACE_ATTACH, PTRACE_SEIZE


def test_sockets_of_four_families_only() -> None:
    assert {r["args"][0]["value"] for r in _rules("socket")} == {1, 2, 10, 16}
    assert [r["args"] for r in _rules("socketpair")] == [[{"index": 0, "value": 1, "op": "SCMP_CMP_EQ"}]]


def test_clone_without_namespaces_and_clone3_falls_back() -> None:
    (clone,) = _rules("clone")
    assert clone["args"] == [{"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]
    (clone3,) = _rules("clone3")
    assert (clone3["action"], clone3["errnoRet"]) == ("SCMP_ACT_ERRNO", 38)  # ENOSYS


def test_only_64_bit_tables() -> None:
    assert seccomp.build()["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"]
    allowed = {n for r in seccomp.build()["syscalls"] for n in r["names"]}
    assert not {"socketcall", "ipc", "chown32", "_llseek", "mmap2"} & allowed


@pytest.mark.parametrize("runtime", ["runc", "runsc"])
def test_the_profile_text_is_stable_and_is_what_the_engine_gets(tmp_path: Path, runtime: str) -> None:
    text = seccomp.profile_json(runtime)
    assert json.loads(text) == seccomp.build(runtime)
    assert seccomp.digest(runtime) == hashlib.sha256(text.encode()).hexdigest()[:12]
    from sandbox.docker import DockerBackend

    cfg = DockerBackend(SandboxSpec(runtime=runtime)).container_config(tmp_path)
    assert cfg["security_opt"] == ["no-new-privileges", "seccomp=" + text]
    assert cfg["labels"]["dev.loom.seccomp"] == seccomp.digest(runtime)
    assert seccomp.in_security_opt(cfg["security_opt"], runtime)
    assert not seccomp.in_security_opt(["no-new-privileges", "seccomp=unconfined"], runtime)
    assert not seccomp.in_security_opt(None, runtime)


def test_the_runtimes_profiles_differ_only_in_clone3_and_openat2() -> None:
    """gVisor answers a refusal with EPERM whatever errnoRet says, so runc's ENOSYS for
    clone3 (glibc then falls back to clone, whose flags are checked) would stop every
    thread there: under runsc clone3 is allowed, and so is openat2 (whose ENOSYS makes a
    program fall back to openat, whose mode is checked); nothing else differs."""
    runc, runsc = seccomp.build("runc"), seccomp.build("runsc")
    assert clone3(runc) == [{"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]
    assert clone3(runsc) == [{"names": ["clone3"], "action": "SCMP_ACT_ALLOW"}]
    assert [r for r in runc["syscalls"] if r["names"] == ["openat2"]] == [
        {"names": ["openat2"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}
    ]
    drop = lambda p: {**p, "syscalls": [r for r in p["syscalls"] if r["names"] not in (["clone3"], ["openat2"])]}  # noqa: E731
    assert drop(runc) == drop(runsc)
    assert seccomp.digest("runc") != seccomp.digest("runsc")


def clone3(profile: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in profile["syscalls"] if "clone3" in r["names"]]


def test_the_module_prints_the_profile() -> None:
    out = subprocess.run([sys.executable, "-m", "sandbox.docker.seccomp"], capture_output=True, check=True)
    assert json.loads(out.stdout) == seccomp.build()


@pytest.mark.parametrize(
    ("runtime", "oci", "mode", "ok"),
    [
        ("runc", False, 2, True),
        ("runc", False, 0, False),
        ("runc", False, None, False),
        ("runsc", False, 0, True),  # gVisor without --oci-seccomp: its own kernel decides
        ("runsc", True, 2, True),
        ("runsc", True, 0, False),
    ],
)
def test_the_agents_seccomp_mode_is_checked(runtime: str, oci: bool, mode: int | None, ok: bool) -> None:
    hello = {"seccomp": mode}
    if ok:
        check_seccomp_mode(hello, runtime=runtime, runsc_oci_seccomp=oci)
    else:
        with pytest.raises(RuntimeUnavailableError, match="seccomp profile is not in effect"):
            check_seccomp_mode(hello, runtime=runtime, runsc_oci_seccomp=oci)


def test_runsc_registration_is_read() -> None:
    assert runsc_applies_seccomp({"path": "/x", "runtimeArgs": ["--platform=ptrace", "--oci-seccomp"]})
    assert runsc_applies_seccomp({"runtimeArgs": ["--oci-seccomp=true"]})
    assert not runsc_applies_seccomp({"runtimeArgs": ["--oci-seccomp=false", "--network=none"]})
    assert not runsc_applies_seccomp({"path": "/x"})
    assert not runsc_applies_seccomp(None)
