"""The node's call channel (worker.integrations.ray.channel) on loopback, without a cluster:
calls and their errors (as raised, attributes kept), several in flight answered out of
order, a client without the key served nothing, a connection that ends during a call, and
the watch that breaks a channel whose node Ray reports dead."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from worker.integrations.ray import channel as ch
from worker.workspace_settings import SettingsError


class Node:
    """A stand-in node service: what the channel calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.release = asyncio.Event()
        self.called = asyncio.Event()

    async def handle(self, op: str, args: tuple[Any, ...]) -> Any:
        self.calls.append((op, args))
        self.called.set()
        if op == "echo":
            await asyncio.sleep(args[1])
            return args[0]
        if op == "refuse":
            raise SettingsError("memory", "not a size")
        if op == "hang":
            await self.release.wait()
        return None


async def serve(node: Node) -> tuple[ch.ChannelServer, tuple[str, int]]:
    server = ch.ChannelServer(node.handle, frozenset({"echo", "refuse", "hang"}))
    return server, await server.start("127.0.0.1")


async def test_calls_answer_in_any_order_and_errors_arrive_as_raised() -> None:
    node = Node()
    server, (host, port) = await serve(node)
    client = await ch.Channel.open(host, port, server.key, timeout=5)
    try:
        slow = asyncio.create_task(client.call("echo", "slow", 0.3))
        assert await client.call("echo", b"fast" * 1000, 0) == b"fast" * 1000
        assert not slow.done()  # the fast answer overtook the slow one on the one connection
        assert await slow == "slow"
        with pytest.raises(SettingsError) as e:
            await client.call("refuse")
        assert (e.value.field, e.value.message) == ("memory", "not a size")
        with pytest.raises(ValueError, match="'nope' is not offered on the channel"):
            await client.call("nope")
        assert [op for op, _ in node.calls] == ["echo", "echo", "refuse"]
    finally:
        client.close()
        await server.close()


async def test_a_client_without_the_key_is_served_nothing() -> None:
    node = Node()
    server, (host, port) = await serve(node)
    client = await ch.Channel.open(host, port, b"not the key" * 3, timeout=5)
    try:
        with pytest.raises(ConnectionError):
            for _ in range(100):  # (the server hangs up as soon as it checked the answer)
                await client.call("echo", "x", 0)
                await asyncio.sleep(0.01)
        assert node.calls == []
    finally:
        client.close()
        await server.close()


async def test_a_connection_that_ends_during_a_call_breaks_it() -> None:
    node = Node()
    server, (host, port) = await serve(node)
    client = await ch.Channel.open(host, port, server.key, timeout=5)
    waiting = asyncio.create_task(client.call("hang"))
    await node.called.wait()
    client._writer.transport.abort()  # the connection is cut (as by a node whose process died)
    with pytest.raises(ch.ChannelBroken):
        await waiting
    assert not client.usable
    with pytest.raises(ch.ChannelClosed):  # the next call is not sent at all
        await client.call("echo", "x", 0)
    node.release.set()
    await server.close()


async def test_the_watch_breaks_a_channel_whose_node_ray_reports_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ch, "WATCH_SECONDS", 0.05)
    node = Node()
    server, (host, port) = await serve(node)
    asked = 0

    async def alive() -> bool:
        nonlocal asked
        asked += 1
        return asked < 3

    client = await ch.Channel.open(host, port, server.key, timeout=5, watch=alive)
    assert await client.call("echo", "quick", 0) == "quick"
    with pytest.raises(ch.ChannelBroken, match="Ray reports the node dead"):
        await client.call("hang")
    assert asked == 3
    node.release.set()
    await server.close()
