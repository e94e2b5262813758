"""The event loop the control plane's servers run on: uvloop where it is installed.

The coordinator and the Lighthouse gate spend most of their time in the loop's own machinery
(readiness polling, callbacks, socket writes) rather than in fthsdp's code, so the loop's
implementation sets their capacity. uvloop (libuv, the `runtime` extra installs it) answers the
same reports with less CPU than the standard library's selector loop (docs/benchmarks.md,
"Control plane under load"). Where it is missing (a checkout without the extra) the standard loop
runs the same code: uvloop is a drop-in `asyncio` loop and nothing here depends on which one runs.
`FTHSDP_EVENT_LOOP=asyncio` forces the standard loop, to compare or to rule uvloop out.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from slurm.errors import InputError

T = TypeVar("T")

#: Environment variable that picks the loop: `uvloop` (the default when installed) or `asyncio`.
LOOP_ENV = "FTHSDP_EVENT_LOOP"
LOOPS = ("uvloop", "asyncio")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """The constructor of the loop to run: uvloop's unless it is missing or switched off.

    An unknown value of `FTHSDP_EVENT_LOOP` is an `InputError` that names it, never a silent
    fallback: a typo would otherwise measure the other loop.
    """
    wanted = os.environ.get(LOOP_ENV, "uvloop") or "uvloop"
    if wanted not in LOOPS:
        raise InputError(LOOP_ENV, wanted, f"one of {', '.join(LOOPS)}")
    if wanted == "uvloop":
        try:
            import uvloop
        except ImportError:
            return asyncio.new_event_loop
        return uvloop.new_event_loop
    return asyncio.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """`uvloop` or `asyncio`: which loop runs, for the control job's log."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop `loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the kind `loop_factory` picks, for a thread that runs its own."""
    return loop_factory()()


def chosen() -> str:
    """The name of the loop `run` would start here: `uvloop` or `asyncio`."""
    return "asyncio" if loop_factory() is asyncio.new_event_loop else "uvloop"


def freeze_startup_heap() -> int:
    """Put what is alive now out of the garbage collector's reach; returns how many objects that
    is. For a server process once its imports are done, before its loop starts.

    The modules, classes and functions of a server never become garbage, yet every full
    collection walks them all while the event loop waits: tens of milliseconds under load on a
    small machine, and at 1,000 reports a second that pause is most of the coordinator's p99
    (docs/benchmarks.md). Frozen, they are still freed by their reference counts; a full
    collection walks only what was made since.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
