"""The event loop the store and the proxy run on (``RAFTGATE_EVENT_LOOP``).

uvloop (libuv's loop, in C) unless asked otherwise: both programs spend most of their time in
the loop's own machinery around gRPC's callbacks, and measured against asyncio's loop in one
rotation on the idle machine it gave 3-13 % more requests per second on most rows (watch events
up to a third more; one-node linearizable Range within the noise) and a lower one-client latency
(docs/performance.md, round 4). ``RAFTGATE_EVENT_LOOP=asyncio`` runs on the standard library's
loop instead, to compare the two or to rule the loop out; unset, a platform without uvloop runs on
asyncio's. Read before a program opens anything, so a wrong value is a start-up error.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "RAFTGATE_EVENT_LOOP"
CHOICES = ("uvloop", "asyncio")

log = logging.getLogger(__name__)


def chosen(environ: Mapping[str, str] | None = None) -> str:
    """The loop to run on: what ``RAFTGATE_EVENT_LOOP`` names, else uvloop where it is installed.
    ValueError for another name, for uvloop named where it is not installed, and for a uvloop that
    is installed but cannot be loaded (another platform's wheel, a missing library): loaded here,
    at start-up, so that is a clear error and not a traceback later."""
    text = (os.environ if environ is None else environ).get(ENV, "").strip()
    name = text.lower()
    if name and name not in CHOICES:
        raise ValueError(f"{ENV}: {text!r} is not one of {', '.join(CHOICES)}")
    if name == "asyncio":
        return name
    try:
        import uvloop  # noqa: F401 - loaded once here; _factory finds it in sys.modules
    except (ImportError, OSError) as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "uvloop":  # not installed
            if name:
                raise ValueError(f"{ENV}: uvloop is not installed (pip install uvloop, or {ENV}=asyncio)") from None
            return "asyncio"
        raise ValueError(f"{ENV}: uvloop cannot be loaded ({exc}); {ENV}=asyncio runs on Python's own loop") from None
    return "uvloop"


def _factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if name == "asyncio":
        return None
    import uvloop  # only when used: on asyncio's loop it is never loaded

    return uvloop.new_event_loop


#: The step of uvloop's ``loop.time()``: libuv's clock counts whole milliseconds.
UVLOOP_CLOCK_TICK = 0.001


def is_uvloop(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` is uvloop's: the one place that tells, for what differs on it (its clock,
    ``clock_tick``; its signal handlers, raftgate/stop_signals.py)."""
    return type(loop).__module__.partition(".")[0] == "uvloop"


def clock_tick(loop: asyncio.AbstractEventLoop) -> float:
    """The step of ``loop.time()``: uvloop's reads libuv's millisecond clock; asyncio's reads
    ``time.monotonic`` (its ``_clock_resolution``). Another loop is taken to count milliseconds:
    a tick too long only makes a wait end later, one too short makes it end early."""
    if is_uvloop(loop):
        return UVLOOP_CLOCK_TICK
    return float(getattr(loop, "_clock_resolution", UVLOOP_CLOCK_TICK))


def run(main: Coroutine[Any, Any, T], name: str | None = None) -> T:
    """``asyncio.run(main)`` on the loop ``name`` (``chosen()`` when None): the same signal
    handling and clean-up, another loop."""
    name = name or chosen()
    with asyncio.Runner(loop_factory=_factory(name)) as runner:
        log.info("event loop: %s", name)
        return runner.run(main)
