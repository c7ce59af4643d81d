"""envd's process service, the parts that need no sandbox: how an end is said (Go's
``os.ProcessState`` words), E2B's working directories and users, the pid table, and a
stream's KeepAlive events, deadline and end (``worker.integrations.e2b.process_*``)."""

from __future__ import annotations

import asyncio
import base64
from typing import Any, cast

import pytest
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import Headers, RequestContext
from e2b.envd.process import process_pb as pb
from protobuf import Oneof

from sandbox.base import ProcessInfo
from worker.harness import SandboxHandle
from worker.harness.results import ExecOutput
from worker.integrations.e2b import process_events as ev
from worker.integrations.e2b.process import _keepalive, _username
from worker.integrations.e2b.process_runners import ExecRunner
from worker.integrations.e2b.process_start import _cwd
from worker.integrations.e2b.process_table import END, SYNTHETIC_PIDS, Proc, SandboxProcs, events


def _info(**kw: Any) -> ProcessInfo:
    return ProcessInfo(id="proc-1", command="x", pid=7, started=0.0, running=False, **kw)


def test_ends_are_said_in_envds_words() -> None:
    assert ev.from_info(_info(exit_code=0, outcome="exit"), 60) == ev.Ended(0, True, "exit status 0", None)
    assert ev.from_info(_info(exit_code=3, outcome="exit"), 60) == ev.Ended(3, True, "exit status 3", "exit status 3")
    killed = ev.from_info(_info(exit_code=137, outcome="signal", signal=9), 60)
    assert killed == ev.Ended(-1, False, "signal: killed", "signal: killed")
    assert ev.from_info(_info(exit_code=143, outcome="signal", signal=15), 60).status == "signal: terminated"
    timed = ev.from_info(_info(exit_code=137, outcome="timeout", signal=9), 2.5)
    assert timed.timed_out and timed.status == "signal: killed" and "time limit of 2.5 s" in (timed.error or "")
    oom = ev.from_info(_info(exit_code=137, outcome="oom"), 60)
    assert oom.exit_code == -1 and "memory" in (oom.error or "") and not oom.timed_out
    assert ev.signalled(99).status == "signal: signal 99"
    # a command of another user (the harness's exec)
    ran = ExecOutput(126, b"", b"unable to find user x\n", "exit", 0.0, launch_error="user")
    assert ev.from_exec(ran, 60) == ev.Ended(126, True, "exit status 126", "unable to find user x")
    assert ev.from_exec(ExecOutput(None, b"", b"", "output_limit", 0.0), 60).status == "signal: killed"
    # on the wire, proto3 JSON: defaults left out, camelCase
    assert ev.end_event(ev.exited(0)).to_json() == '{"end":{"exited":true,"status":"exit status 0"}}'
    assert ev.data_event("stderr", b"x").to_json() == '{"data":{"stderr":"eA=="}}'
    assert ev.data_event("pty", b"x").event == Oneof("data", pb.ProcessEvent.DataEvent(output=Oneof("pty", b"x")))


def test_working_directories_as_envd_resolves_them() -> None:
    def cfg(cwd: str | None) -> pb.ProcessConfig:
        return pb.ProcessConfig(cmd="x") if cwd is None else pb.ProcessConfig(cmd="x", cwd=cwd)

    assert _cwd(cfg(None), "/home/user") == "/home/user"
    assert _cwd(cfg(""), "/home/user") == "/home/user"
    assert _cwd(cfg("src/../lib"), "/home/user") == "/home/user/lib"
    assert _cwd(cfg("~/a"), "/home/user") == "/home/user/a"
    assert _cwd(cfg("/tmp/x/"), "/home/user") == "/tmp/x"
    with pytest.raises(ConnectError) as e:
        _cwd(cfg("~root/x"), "/home/user")
    assert e.value.code is Code.INVALID_ARGUMENT


def _ctx(**headers: str) -> RequestContext[Any, Any]:
    method = pb.ListRequest  # (any: only the headers are read)
    h = Headers()
    for k, v in headers.items():
        h.add(k, v)
    return RequestContext(method=cast(Any, method), http_method="POST", request_headers=h)


def test_the_user_and_the_keepalive_come_from_headers() -> None:
    basic = "Basic " + base64.b64encode(b"root:").decode()
    assert _username(_ctx(authorization=basic)) == "root"
    assert _username(_ctx()) is None
    assert _username(_ctx(authorization="Bearer tok")) is None
    with pytest.raises(ConnectError) as e:
        _username(_ctx(authorization="Basic %%%"))
    assert e.value.code is Code.UNAUTHENTICATED
    assert _keepalive(_ctx(**{"keepalive-ping-interval": "50"})) == 50.0
    assert _keepalive(_ctx(**{"keepalive-ping-interval": "soon"})) == 90.0


def _proc(tag: str | None = None) -> Proc:
    runner = ExecRunner(cast(SandboxHandle, None), ["true"], cwd="/", env={}, user="root", limit=5.0)
    return Proc(0, pb.ProcessConfig(cmd="true"), tag, False, runner)


async def test_pids_and_selectors() -> None:
    procs = SandboxProcs("sbx")
    assert procs.new_pid(None) == SYNTHETIC_PIDS  # loom has none: made up
    assert procs.new_pid(1 << 33) == SYNTHETIC_PIDS + 1  # not a uint32
    tagged = _proc("server")
    tagged.pid = 41
    procs.by_pid[41] = tagged
    assert procs.new_pid(41) != 41  # held by a running process
    assert procs.find(pb.ProcessSelector(selector=Oneof("pid", 41))) is tagged
    assert procs.find(pb.ProcessSelector(selector=Oneof("tag", "server"))) is tagged
    with pytest.raises(ConnectError) as e:
        procs.find(pb.ProcessSelector(selector=Oneof("pid", 5)))
    assert (e.value.code, e.value.message) == (Code.NOT_FOUND, "process with pid 5 not found")
    with pytest.raises(ConnectError) as e:
        procs.find(pb.ProcessSelector(selector=Oneof("tag", "db")))
    assert e.value.message == "process with tag db not found"
    tagged.ended = ev.exited(0)
    assert procs.new_pid(41) == 41  # an ended one's pid is free again
    assert procs.running() == []
    with pytest.raises(ConnectError):
        procs.find(pb.ProcessSelector(selector=Oneof("pid", 41)))
    assert procs.find(pb.ProcessSelector(selector=Oneof("pid", 41)), running=False) is tagged


async def test_a_stream_sends_keepalives_ends_at_its_deadline_or_with_the_end() -> None:
    proc = _proc()
    q = proc.subscribe()
    loop = asyncio.get_running_loop()
    got = []
    with pytest.raises(ConnectError) as e:
        async for event in events(proc, q, deadline=loop.time() + 0.35, keepalive=0.1, timeout_is_deadline=False):
            got.append(event.event.field if event.event else None)
    assert e.value.code is Code.DEADLINE_EXCEEDED and "goes on" in e.value.message
    assert got and set(got) == {"keepalive"}
    assert q not in proc.subscribers  # the ended stream left

    q = proc.subscribe()
    await q.put(ev.data_event("stdout", b"hi"))
    proc.ended = ev.exited(2)
    await q.put(END)
    out = [e async for e in events(proc, q, deadline=None, keepalive=10, timeout_is_deadline=True)]
    assert [e.event.field for e in out if e.event] == ["data", "end"]
    assert proc.subscribe().get_nowait() is END  # a late subscriber gets the end at once
