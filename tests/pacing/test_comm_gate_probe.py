"""The comm gate on NCCL: the bucket's completion callback runs when the all-reduce is *enqueued*, so
the gate releases on the completion probe (the CUDA event the observer records on the callback's
stream) instead of on the callback. No CUDA here: ``_Probe`` stands in for ``torch.cuda.Event`` (only
``query()`` is used), answering True once its time has come, as an event does once the GPU reaches it.
benchmarks/gpu_check.py checks the real thing on a GPU."""

from __future__ import annotations

import threading
import time

from fabricpace.observe._guard import Guard
from fabricpace.observe.pacer import SafePacer
from fabricpace.pacing.actuators import CommGate


class _Probe:
    def __init__(self, ready_in_s: float) -> None:
        self.at = time.perf_counter() + ready_in_s

    def query(self) -> bool:
        return time.perf_counter() >= self.at


def test_a_probe_holds_the_window_until_the_transfer_finished():
    gate = CommGate()
    gate.apply(1, 0, 2_000_000_000)  # window 1, budget far larger than the waits here
    gate.before(0)
    gate.after(0, _Probe(0.08))  # the callback ran at enqueue; the GPU finishes 80 ms later
    t0 = time.perf_counter()
    gate.before(1)
    held = time.perf_counter() - t0
    assert 0.07 <= held < 1.0  # held until the probe said done, not released by the callback
    gate.after(1, _Probe(0.0))  # already finished by the time the next launch looks
    t0 = time.perf_counter()
    gate.before(2)
    assert time.perf_counter() - t0 < 0.05
    assert gate.max_in_flight_seen == 1


def test_probes_release_in_launch_order_and_never_past_the_budget():
    gate = CommGate()
    gate.apply(2, 0, 30_000_000)  # window 2, 30 ms budget per step
    gate.before(0)
    gate.before(1)
    gate.after(0, _Probe(10.0))  # never finishes within the test
    gate.after(1, _Probe(0.0))  # finished, but behind bucket 0 in its group's order
    t0 = time.perf_counter()
    gate.before(2)
    waited = time.perf_counter() - t0
    assert 0.025 <= waited < 1.0  # the budget, not the probe, ended the wait
    assert gate.end_step() >= 25_000_000
    # a probe that cannot answer counts as finished (it must never hold training)

    class Broken:
        def query(self) -> bool:
            raise RuntimeError("device lost")

    gate.apply(1, 0, 2_000_000_000)
    gate.before(0)
    gate.after(0, Broken())
    t0 = time.perf_counter()
    gate.before(1)
    assert time.perf_counter() - t0 < 0.5


def test_without_a_probe_the_callback_releases_as_before():
    gate = CommGate()
    gate.apply(1, 0, 2_000_000_000)
    gate.before(0)
    threading.Timer(0.03, gate.after, args=(0,)).start()
    t0 = time.perf_counter()
    gate.before(1)
    assert 0.02 <= time.perf_counter() - t0 < 1.0


def test_user_pacers_keep_the_one_argument_after_bucket():
    calls: list[tuple[object, ...]] = []

    class UserPacer:  # the Pacer protocol as users write it: after_bucket(index)
        def after_bucket(self, index: int) -> None:
            calls.append((index,))

    class ProbePacer:
        accepts_completion_probe = True

        def after_bucket(self, index: int, done: object = None) -> None:
            calls.append((index, done))

    probe = _Probe(0.0)
    SafePacer(UserPacer(), Guard(rank=0), 0, 2).after_bucket(3, probe)
    SafePacer(ProbePacer(), Guard(rank=0), 0, 2).after_bucket(4, probe)
    SafePacer(ProbePacer(), Guard(rank=0), 0, 2).after_bucket(5)
    assert calls == [(3,), (4, probe), (5, None)]
