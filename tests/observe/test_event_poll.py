"""Recorder.poll on the CUDA path: stamps on different streams, and an exit stamp that never comes.

No GPU runs on this machine, so these tests drive the recorder with a stand-in event source whose
events complete only when the test says so (a CUDA event completes when its stream reaches it; with
two streams, a later-recorded event can complete first). That is the only thing faked here: the
Recorder, EventTimeline and the columns are the real ones. benchmarks/gpu_check.py runs the same
path against real CUDA events when a GPU machine is lent.
"""

from __future__ import annotations

from fabricpace.observe.clocks import CpuClock, EventTimeline
from fabricpace.observe.recorder import _MAX_PENDING, Recorder


class ManualEvent:
    """An event whose device time is set when it is recorded and which completes on ``done()``."""

    def __init__(self, src: ManualSource) -> None:
        self.src = src
        self.t_ns: int | None = None
        self.complete = False

    def record(self) -> None:
        self.src.t += 1_000_000  # device time advances 1 ms per stamp
        self.t_ns = self.src.t
        self.src.events.append(self)

    def query(self) -> bool:
        return self.complete

    def elapsed_time(self, end: ManualEvent) -> float:
        assert self.t_ns is not None and end.t_ns is not None, "elapsed_time on an unrecorded event"
        assert self.complete and end.complete, "elapsed_time before both events completed"
        return (end.t_ns - self.t_ns) / 1e6

    def done(self) -> None:
        self.complete = True


class ManualSource:
    def __init__(self) -> None:
        self.t = 0
        self.events: list[ManualEvent] = []

    def new_event(self) -> ManualEvent:
        return ManualEvent(self)

    def synchronize(self) -> None:
        for e in self.events:
            e.done()


def _recorder() -> tuple[Recorder, ManualSource]:
    src = ManualSource()
    return Recorder(EventTimeline(CpuClock(), src)), src


def test_step_waits_for_its_start_stamp_on_another_stream():
    rec, src = _recorder()
    rec.begin(0)
    start = rec._start
    c = rec.enter("ddp:world", "all_reduce", 64, False)
    rec.exit(c)
    rec.end(data=0, gc=0, gc_count=0, paced=0, samples=1)
    # Everything completed except the start stamp (recorded on a stream that is still busy).
    for e in src.events:
        if e is not start:
            e.done()
    rec.poll()
    assert rec._raw == [] and len(rec._pending) == 1  # not resolved with a None start
    start.done()
    rec.poll()
    rec.drain()
    (row,) = rec.step_rows
    (coll,) = rec.coll_rows
    assert row[1] < coll[5] <= coll[6] < row[2]  # start < enter <= exit < end, in host ns


def test_enter_stamp_on_another_stream_is_waited_for():
    rec, src = _recorder()
    rec.begin(0)
    c = rec.enter("ddp:world", "all_reduce", 64, False)
    enter = c[4]
    rec.exit(c)
    rec.end(data=0, gc=0, gc_count=0, paced=0, samples=1)
    for e in src.events:
        if e is not enter:
            e.done()
    rec.poll()
    assert len(rec._pending) == 1
    enter.done()
    rec.poll()
    rec.drain()
    assert len(rec.coll_rows) == 1 and rec.coll_rows[0][5] is not None


def test_exit_stamp_that_never_comes_does_not_hold_the_run():
    rec, src = _recorder()
    rec.begin(0)
    lost = rec.enter("ddp:world", "all_reduce", 64, False)  # its completion callback never runs
    rec.end(data=0, gc=0, gc_count=0, paced=0, samples=1)
    for step in range(1, _MAX_PENDING + 5):
        rec.begin(step)
        c = rec.enter("ddp:world", "all_reduce", 64, False)
        rec.exit(c)
        rec.end(data=0, gc=0, gc_count=0, paced=0, samples=1)
        for e in src.events:
            e.done()
    # Bounded: the step with the lost exit was written (null exit) once _MAX_PENDING steps waited.
    assert len(rec._pending) <= _MAX_PENDING
    rec.drain()
    rows = rec.coll_rows
    assert rows[0][6] is None and all(r[6] is not None for r in rows[1:])
    steps = [r[0] for r in rec.step_rows]
    assert steps == list(range(len(steps))) and len(steps) >= 5
    # A late exit stamp written into the old record cannot reach the columns any more.
    rec.exit(lost)
    lost[5].done()
    rec.poll(final=True)
    rec.drain()
    assert all(isinstance(r[6], int) or r[6] is None for r in rec.coll_rows)


def test_final_poll_writes_a_missing_exit_as_null():
    rec, src = _recorder()
    rec.begin(0)
    rec.enter("ddp:world", "all_reduce", 64, False)
    rec.end(data=0, gc=0, gc_count=0, paced=0, samples=1)
    src.synchronize()
    rec.poll()
    assert len(rec._pending) == 1  # could still come
    rec.poll(final=True)
    rec.drain()
    assert [r[0] for r in rec.step_rows] == [0]
    assert rec.coll_rows[0][6] is None


def test_timeline_stamps_through_a_source_that_records_itself():
    """A source with ``stamp()`` (CudaEventSource bound to a device records on that device's stream)
    is used for every mark, the calibration's included."""
    src = ManualSource()
    calls = []

    def stamp():
        ev = src.new_event()
        ev.record()
        calls.append(ev)
        return ev

    src.stamp = stamp  # type: ignore[attr-defined]
    tl = EventTimeline(CpuClock(), src)
    assert len(calls) == 1  # the calibration's base event
    rec = Recorder(tl)
    rec.begin(0)
    rec.end(data=0, gc=0, gc_count=0, paced=0, samples=1)
    assert len(calls) == 3
    src.synchronize()
    rec.poll()
    rec.drain()
    (row,) = rec.step_rows
    assert row[2] - row[1] == 1_000_000  # the manual device advances 1 ms per stamp
