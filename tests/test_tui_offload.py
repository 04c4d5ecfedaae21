"""Blocking calls off the event loop: each in a thread of its own, idle threads reused."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tui.offload import in_thread


def test_calls_one_after_another_reuse_an_idle_thread():
    async def run():
        first = await in_thread(threading.current_thread, "first")
        second = await in_thread(threading.current_thread, "second")
        return first, second

    first, second = asyncio.run(run())
    assert first is second and first is not threading.current_thread()


def test_a_call_that_hangs_never_delays_the_next_one():
    release = threading.Event()

    async def run():
        hung = asyncio.ensure_future(in_thread(lambda: release.wait(30), "hung"))
        await asyncio.sleep(0.05)
        quick = await asyncio.wait_for(in_thread(threading.get_ident, "quick"), 5)
        assert not hung.done()
        release.set()
        assert await asyncio.wait_for(hung, 5) is True
        return quick

    assert asyncio.run(run()) != threading.get_ident()


def test_the_call_names_its_thread_and_its_exception_reaches_the_caller():
    def boom():
        raise ValueError(threading.current_thread().name)

    with pytest.raises(ValueError, match="poll gpus"):
        asyncio.run(in_thread(boom, "poll gpus"))
