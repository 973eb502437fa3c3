"""Clock sources: the test shift, and the CUDA event path against a fake device (no GPU here)."""

from __future__ import annotations

import itertools
import time

import pytest

from fabricpace.observe.clocks import CpuClock, EventTimeline, FakeEventSource, clock_shift_ns
from fabricpace.observe.recorder import Recorder


@pytest.mark.parametrize(
    ("env", "rank", "expected"),
    [("", 0, 0), ("37000000", 5, 37_000_000), ("2:37000000", 2, 37_000_000), ("2:37000000", 1, 0),
     ("1:5,3:-7", 3, -7)],
)
def test_clock_shift_parsing(env, rank, expected):
    assert clock_shift_ns(rank, env) == expected


def test_shifted_clock_runs_ahead_by_the_shift():
    plain, shifted = CpuClock(0), CpuClock(37_000_000)
    a = plain.now()
    b = shifted.now()
    c = plain.now()
    assert a + 37_000_000 <= b <= c + 37_000_000


def test_event_path_resolves_late_without_synchronize_on_the_hot_path():
    clock = CpuClock()
    lag = 3_000_000
    src = FakeEventSource(clock.now, lag_ns=lag)
    tl = EventTimeline(clock, src)
    assert src.sync_calls == 1  # calibration at start only
    rec = Recorder(tl)
    for step in range(6):
        rec.begin(step)
        c = rec.enter("ddp:world", "all_reduce", 1024, False)
        time.sleep(0.0005)
        rec.exit(c)
        rec.end(data=0, gc=0, gc_count=0, paced=0, samples=4)
    # The device runs `lag` behind: the last steps are still pending right after they ended.
    rec.drain()
    assert len(rec.step_rows) < 6
    assert src.sync_calls == 1
    time.sleep(lag / 1e9 * 2)
    rec.poll()
    rec.drain()
    assert [r[0] for r in rec.step_rows] == list(range(6))
    assert src.sync_calls == 1
    # Resolved stamps equal the fake device times (float32 elapsed_time keeps µs resolution per step).
    events = [c[5] for c in rec.coll_rows]
    assert all(e is not None for e in events)
    for row, crow in zip(rec.step_rows, rec.coll_rows, strict=True):
        t_start, t_end = row[1], row[2]
        assert t_start <= crow[5] <= crow[6] <= t_end
    starts = [r[1] for r in rec.step_rows]
    assert all(b > a for a, b in itertools.pairwise(starts))


def test_event_times_match_device_clock_within_a_microsecond():
    clock = CpuClock()
    src = FakeEventSource(clock.now, lag_ns=1_000_000)
    tl = EventTimeline(clock, src)
    ev_anchor = tl.mark()
    ev = tl.mark()
    assert tl.resolve_anchor(ev_anchor) is None  # not executed on the device yet: not resolvable
    time.sleep(0.003)
    t_anchor = tl.resolve_anchor(ev_anchor)
    t_ev = tl.resolve(ev)
    assert t_anchor is not None and t_ev is not None
    assert ev_anchor.t_ns is not None and ev.t_ns is not None
    # Host-time deltas equal the fake device's true deltas (float32 ms over one step: < 1 µs error).
    assert abs((t_ev - t_anchor) - (ev.t_ns - ev_anchor.t_ns)) <= 1_000
