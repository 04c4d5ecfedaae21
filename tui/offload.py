"""Blocking calls off the event loop, each in a thread of its own.

Textual's thread workers share asyncio's default executor (min(32, cores + 4)
threads: 6 on a 2-core machine) and `asyncio.run` joins it at exit. A node that
accepts TCP but never answers holds each poll's thread for its whole connect
timeout, so six hung polls would queue every key's work behind them, and quitting
would wait for them. Here every call gets a daemon thread of its own, awaited by
an async worker: cancelling the worker (leaving a screen, quitting) returns at
once, and a thread still stuck on a dead node never delays anything.

A thread whose call returned waits IDLE_S for the next call before it ends, so a
dashboard polling every second reuses a few threads instead of starting (and
waiting for) one per poll; a call never waits for a busy thread: with none idle
it starts a new one.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Callable, TypeVar, cast

T = TypeVar("T")
Job = Callable[[], Callable[[], None]]
"""Runs a call and returns how to deliver its outcome (done once the thread is idle again)."""

IDLE_S = 30.0
"""How long a thread whose call returned waits for another call before it ends."""

_idle: list[queue.SimpleQueue[Job]] = []
"""Inboxes of the threads waiting for a call, the most recently idle last."""
_lock = threading.Lock()


async def in_thread(fn: Callable[[], T], name: str = "nodedeck call") -> T:
    """fn() run in a thread of its own (named `name` meanwhile); returns its result or raises its exception."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if done.done():  # the awaiting worker was cancelled meanwhile
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(cast(T, result))   # (no error: fn returned it)

    def run() -> Callable[[], None]:
        threading.current_thread().name = name
        try:
            result, error = fn(), None
        except BaseException as e:  # handed to the awaiting worker, which reports it
            result, error = None, e

        def deliver() -> None:
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:  # the loop closed while fn ran (the app quit): nobody waits for it
                pass

        return deliver

    _submit(run)
    return await done


def _submit(job: Job) -> None:
    """Hand job to an idle thread, or to a new one when none is idle."""
    with _lock:
        inbox = _idle.pop() if _idle else None
    if inbox is None:
        inbox = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(inbox,), name="nodedeck call", daemon=True).start()
    inbox.put(job)


def _serve(inbox: queue.SimpleQueue[Job]) -> None:
    """Run the jobs put in inbox, one at a time; end after IDLE_S without one."""
    while True:
        try:
            job = inbox.get(timeout=IDLE_S)
        except queue.Empty:
            with _lock:
                if inbox in _idle:  # still idle: nobody can hand it a job any more
                    _idle.remove(inbox)
                    return
            continue  # taken from _idle just now: its job is on the way
        deliver = job()
        del job
        threading.current_thread().name = "nodedeck idle"
        with _lock:
            _idle.append(inbox)  # idle before the caller hears back, so its next call can come here
        deliver()
        del deliver
