"""Real-rank actuators: lockstep garbage collection and DDP bucket-launch gating.

Both act only on *when* things happen, never on *what* is computed, so parameters stay bitwise equal
to an unpaced run. Both are safe to drive from any thread the observer uses (the comm hook runs on
the autograd thread; gloo completes futures on its own threads).
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from typing import Any


class GcLockstep:
    """Automatic collection off; a young-generation collection at every step divisible by ``interval``
    and a full one at every step divisible by ``full_interval`` (when set).

    Collecting the young generations at step boundaries, when the step's temporaries are dead, frees
    them before they are promoted; automatic collections fire mid-step (every 700 allocations), promote
    the step's live temporaries and so trigger slow full collections of the whole heap at random steps
    (the approach torchtitan takes with ``gc.collect(1)`` every N steps).

    Every rank applies the same interval from the same step (decided from the same summaries), and the
    collection step is ``step % interval == 0`` on the shared step counter, so all ranks pause in the
    same step and the pause is no longer amplified by the synchronous all-reduce.
    """

    def __init__(self) -> None:
        self.interval: int | None = None
        self.full_interval: int | None = None
        self._was_enabled = gc.isenabled()
        self.collections = 0
        self.full_collections = 0

    def apply(self, interval: int | None, full_interval: int | None = None) -> None:
        if interval is None:
            if self.interval is not None and self._was_enabled:
                gc.enable()
            self.interval = self.full_interval = None
            return
        if self.interval is None:
            self._was_enabled = gc.isenabled()
        gc.disable()
        self.interval = max(1, int(interval))
        self.full_interval = max(1, int(full_interval)) if full_interval else None

    def on_step_start(self, step: int) -> None:
        if self.interval is None:
            return
        if self.full_interval is not None and step % self.full_interval == 0:
            gc.collect()
            self.full_collections += 1
        elif step % self.interval == 0:
            gc.collect(1)
            self.collections += 1

    def close(self) -> None:
        self.apply(None)


class CommGate:
    """At most ``window`` buckets in flight and ``spacing_ns`` between launches, within a delay budget.

    ``before`` blocks the launching thread only while the budget for this step lasts; when the budget
    is spent the bucket goes out at once, so a step can never be slowed by more than the cap (default
    1% of the median step time) and a missing completion can never hang training.

    A bucket is in flight from ``before`` until ``after``, or — when ``after`` is given a completion
    probe — until the probe's ``query()`` says the transfer finished. NCCL needs the probe: its work
    future completes, and runs the comm hook's callback, as soon as the all-reduce is *enqueued* on
    the GPU (PyTorch's CUDA future), so counting callbacks would count launches and the window would
    never hold. The observer passes the CUDA event it records on the callback's stream, which the GPU
    reaches only after the all-reduce.
    """

    # How often a launch held by a full window polls the oldest bucket's probe (CUDA events cannot
    # wake a waiting thread): fine against a bucket transfer of a few hundred µs or more.
    PROBE_POLL_S = 50e-6

    def __init__(self) -> None:
        self.window: int | None = None
        self.spacing_ns = 0
        self.budget_ns = 0
        self._cv = threading.Condition()
        self._in_flight = 0
        self._used_ns = 0
        self._last_launch_ns = 0
        self.max_in_flight_seen = 0
        self.waits = 0
        self._pending: deque[Any] = deque()  # completion probes of buckets released by a probe

    def apply(self, window: int | None, spacing_ns: int, budget_ns: int) -> None:
        with self._cv:
            self.window = window
            self.spacing_ns = int(spacing_ns)
            self.budget_ns = max(0, int(budget_ns))
            self._cv.notify_all()

    def before(self, bucket_index: int) -> None:
        if self.window is None and not self.spacing_ns:
            # Not gating (the usual case): no lock, no clock. ``apply`` runs between steps (from
            # ``on_window``), when no bucket is in flight, so the counters need no tracking here.
            return
        t0 = time.perf_counter_ns()
        with self._cv:
            if self.window is not None:
                while self._reap() >= self.window:
                    left = self.budget_ns - self._used_ns - (time.perf_counter_ns() - t0)
                    if left <= 0:
                        break
                    self.waits += 1
                    self._cv.wait(min(left / 1e9, self.PROBE_POLL_S) if self._pending else left / 1e9)
            gap = self._last_launch_ns + self.spacing_ns - time.perf_counter_ns() if self.spacing_ns else 0
            left = self.budget_ns - self._used_ns - (time.perf_counter_ns() - t0)
        if gap > 0 and left > 0:
            time.sleep(min(gap, left) / 1e9)
        now = time.perf_counter_ns()
        with self._cv:
            self._in_flight += 1
            self.max_in_flight_seen = max(self.max_in_flight_seen, self._in_flight)
            self._last_launch_ns = now
            self._used_ns += now - t0 if (self.window is not None or self.spacing_ns) else 0

    def _reap(self) -> int:
        """Buckets still in flight, after releasing those whose probe says they finished (in launch
        order: a group's collectives complete in order). Called with the lock held."""
        while self._pending:
            try:
                done = bool(self._pending[0].query())
            except Exception:  # a probe that cannot answer must not hold launches: count it done
                done = True
            if not done:
                break
            self._pending.popleft()
            self._in_flight = max(0, self._in_flight - 1)
        return self._in_flight

    def after(self, bucket_index: int, done: Any = None) -> None:
        """The bucket's completion callback ran; ``done``: a probe (``query() -> bool``) for when the
        transfer really finished, when the callback runs before that (NCCL)."""
        if self.window is None and not self.spacing_ns:
            return
        with self._cv:
            if done is not None:
                self._pending.append(done)
                return
            self._in_flight = max(0, self._in_flight - 1)
            self._cv.notify()

    def end_step(self) -> int:
        """Delay injected during the step that just ended (ns); resets per-step counters."""
        with self._cv:
            used, self._used_ns = self._used_ns, 0
            # Every bucket of a step has completed before the optimizer step (on the GPU: the
            # optimizer's kernels are ordered after DDP's wait on the all-reduces); a missed completion
            # callback must not leak into the next step's window.
            self._in_flight = 0
            self._pending.clear()
            return used
