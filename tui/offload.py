"""Blocking calls off the event loop, in threads of their own.

Textual's thread workers share asyncio's default executor (min(32, cores + 4)
threads: 6 on a 2-core machine) and `asyncio.run` joins it at exit. A node that
accepts TCP but never answers holds each poll's thread for its whole connect
timeout, so six hung polls would queue every key's work behind them, and quitting
would wait for them. Here every call gets a daemon thread of its own, awaited by
an async worker: cancelling the worker (leaving a screen, quitting) returns at
once, and a thread still stuck on a dead node never delays anything.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable, TypeVar

T = TypeVar("T")


async def in_thread(fn: Callable[[], T], name: str = "nodedeck call") -> T:
    """fn() run in a new daemon thread; returns its result or raises its exception."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():  # the awaiting worker was cancelled meanwhile
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # handed to the awaiting worker, which reports it
            result, error = None, e
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed while fn ran (the app quit): nobody waits for it
            pass

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done
