"""Clock sources and timelines: how the observer stamps an instant on CPU and on GPU.

* ``CpuClock`` — ``time.perf_counter_ns`` (CLOCK_MONOTONIC on Linux), optionally shifted for tests:
  ``FABRICPACE_CLOCK_SHIFT_NS=37000000`` shifts this process's clock by +37 ms, and
  ``FABRICPACE_CLOCK_SHIFT_NS=2:37000000`` shifts only rank 2 (comma-separate several ``rank:ns``).
  This is how clock alignment is tested: a known offset is injected and must be recovered.
* ``CpuTimeline`` — a stamp is the clock reading itself (gloo / CPU training).
* ``EventTimeline`` — a stamp is a CUDA event recorded on the current stream; it is resolved to host
  nanoseconds a few steps later, only once ``event.query()`` says it completed, so the hot path never
  calls ``torch.cuda.synchronize``. The host<->device mapping is calibrated once at start (the only
  synchronize) and then chained through per-step anchor events, so ``elapsed_time`` (float32
  milliseconds) is always taken over one step and keeps sub-microsecond resolution.
* ``FakeEventSource`` — a device with one in-order queue (one stream) that runs at least a fixed lag
  behind the host, for unit tests of the event path on machines without a GPU. ``enqueue_work(ns)``
  stands for kernels the host launched: the device is busy with them and events recorded after them
  complete only once they ran, so a test can model a GPU that is busy (or idle) while the host does
  something else — what the observer's device-time data phases are about.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

SHIFT_ENV = "FABRICPACE_CLOCK_SHIFT_NS"


def clock_shift_ns(rank: int, env: str | None = None) -> int:
    """The test shift for ``rank`` from FABRICPACE_CLOCK_SHIFT_NS (0 when unset or for other ranks)."""
    raw = (os.environ.get(SHIFT_ENV, "") if env is None else env).strip()
    if not raw:
        return 0
    if ":" not in raw:
        return int(raw)
    for item in raw.split(","):
        who, _, value = item.partition(":")
        if who.strip() and int(who) == rank:
            return int(value)
    return 0


class CpuClock:
    """perf_counter_ns plus a fixed test shift. ``now`` is a bound callable (no per-call branching)."""

    def __init__(self, shift_ns: int = 0) -> None:
        self.shift_ns = int(shift_ns)
        if self.shift_ns == 0:
            self.now: Callable[[], int] = time.perf_counter_ns
        else:
            pc = time.perf_counter_ns
            shift = self.shift_ns
            self.now = lambda: pc() + shift


class CpuTimeline:
    """Stamps are host nanoseconds, known immediately."""

    deferred = False

    def __init__(self, clock: CpuClock) -> None:
        self.clock = clock
        self.mark: Callable[[], Any] = clock.now

    def resolve(self, stamp: Any) -> int | None:
        return stamp  # type: ignore[no-any-return]

    def resolve_anchor(self, stamp: Any) -> int | None:
        return stamp  # type: ignore[no-any-return]


class Event(Protocol):
    def record(self) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end: Any) -> float: ...


class EventSource(Protocol):
    def new_event(self) -> Event: ...
    def synchronize(self) -> None: ...


class CudaEventSource:
    """Real CUDA events with timing enabled (imported lazily; only built when CUDA is in use).

    ``device``: record on that device's current stream (``stamp``) instead of the current device's.
    Without it, a process whose model sits on ``cuda:k`` but never called ``torch.cuda.set_device(k)``
    stamps its steps on ``cuda:0``'s idle stream (and creates a context there), while the autograd
    thread's bucket stamps land on ``cuda:k``: ``elapsed_time`` across devices then raises and the
    observer stops recording after the first step.
    """

    def __init__(self, device: Any = None) -> None:
        import torch

        self._torch = torch
        self.device = None if device is None else torch.device(device)
        if self.device is not None:
            event, current, dev = torch.cuda.Event, torch.cuda.current_stream, self.device

            def stamp() -> Any:
                ev = event(enable_timing=True)
                ev.record(current(dev))
                return ev

            self.stamp = stamp

    def new_event(self) -> Event:
        return self._torch.cuda.Event(enable_timing=True)  # type: ignore[no-any-return]

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self.device)


class EventTimeline:
    """Stamps are device events, resolved later against a chain of per-step anchors.

    ``resolve_anchor`` must be called in step order with each step's start stamp: an anchor's host
    time is the previous anchor's plus the (short) elapsed device time between them.
    """

    deferred = True

    def __init__(self, clock: CpuClock, source: EventSource) -> None:
        self.clock = clock
        self.source = source
        stamp = getattr(source, "stamp", None)  # a source that records on a chosen stream itself
        if stamp is not None:
            self.mark = stamp  # type: ignore[method-assign]
        base = self.mark()
        source.synchronize()  # the only synchronize: calibrates device time against the host clock
        self._anchor: Any = base
        self._anchor_ns = clock.now()

    def mark(self) -> Any:
        ev = self.source.new_event()
        ev.record()
        return ev

    def resolve_anchor(self, ev: Any) -> int | None:
        """Resolve the next anchor (a step's start event) and make it the reference."""
        if not ev.query():
            return None
        t = self._anchor_ns + round(float(self._anchor.elapsed_time(ev)) * 1e6)
        self._anchor, self._anchor_ns = ev, t
        return t

    def resolve(self, ev: Any) -> int | None:
        """Host nanoseconds of an event recorded after the current anchor (None until it completed)."""
        if ev is None or not ev.query():
            return None
        return self._anchor_ns + round(float(self._anchor.elapsed_time(ev)) * 1e6)


class FakeEvent:
    """An event on the fake device: it completes once the host clock passes its device time."""

    def __init__(self, source: FakeEventSource) -> None:
        self._source = source
        self.t_ns: int | None = None

    def record(self) -> None:
        self.t_ns = self._source._enqueue(0)
        self._source.records += 1

    def query(self) -> bool:
        self._source.queries += 1
        return self.t_ns is not None and self._source.host_now() >= self.t_ns

    def elapsed_time(self, end: FakeEvent) -> float:
        import numpy as np

        if self.t_ns is None or end.t_ns is None:
            raise RuntimeError("elapsed_time on an event that was never recorded")
        # CUDA returns float32 milliseconds; keep that precision so the anchor chain is exercised.
        return float(np.float32((end.t_ns - self.t_ns) / 1e6))


class FakeEventSource:
    """A GPU stand-in with one in-order queue: what the host enqueues at host time ``h`` starts at
    ``max(h + lag_ns, when the work queued before it finished)``. An event takes no device time, so
    its device time is that start; ``enqueue_work(ns)`` queues ``ns`` of kernels. Without
    ``enqueue_work`` the device simply runs ``lag_ns`` behind the host."""

    def __init__(self, host_now: Callable[[], int], lag_ns: int = 2_000_000) -> None:
        self.host_now = host_now
        self.lag_ns = int(lag_ns)
        self.sync_calls = 0
        self.records = 0
        self.queries = 0
        self.busy_until_ns = 0  # device time at which everything enqueued so far has run
        self._lock = threading.Lock()  # events may be recorded from several threads (autograd's)

    def _enqueue(self, work_ns: int) -> int:
        """Queue ``work_ns`` of device work now; returns the device time it starts at."""
        with self._lock:
            start = max(self.host_now() + self.lag_ns, self.busy_until_ns)
            self.busy_until_ns = start + work_ns
        return start

    def enqueue_work(self, ns: int) -> int:
        """Kernels launched by the host (asynchronous, as on CUDA): the device is busy ``ns`` with them
        after what was queued before. Returns the device time they finish at."""
        return self._enqueue(int(ns)) + int(ns)

    def new_event(self) -> FakeEvent:
        return FakeEvent(self)

    def synchronize(self) -> None:
        self.sync_calls += 1
        # Everything enqueued so far has run once the lag (and any queued work) has passed. Return
        # right then, as a real synchronize does (it spins): a plain sleep overshoots by up to ~100 µs
        # on a loaded host, and the calibration then maps every stamp that much too late.
        deadline = max(self.host_now() + self.lag_ns, self.busy_until_ns)
        left = deadline - self.host_now()
        if left > 200_000:
            time.sleep((left - 150_000) / 1e9)
        while self.host_now() < deadline:
            pass
