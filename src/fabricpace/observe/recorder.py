"""The hot path: per-rank step and collective records, finalized into rows off the critical path.

What runs per step is a handful of list appends and clock reads: no collective, no I/O, no numpy.
A collective record is a small list ``[seq, group, op, nbytes, enter, exit, blocking]``; its exit
stamp is written by whichever thread sees completion (the DDP future callback on gloo's thread),
which is safe because the record object outlives any buffer swap.

Per step (DESIGN.md): ``wait`` is the time the step was blocked on collectives — for overlapped
(asynchronous) collectives such as DDP buckets, from the last bucket's arrival (backward compute is
done then) to the last completion; for blocking ones, their whole duration. ``comm`` is the union of
the intervals collectives were in flight. ``compute`` is the rest of the step minus data, GC and
pacing time, i.e. this rank's own work.

On CPU stamps are host nanoseconds and a step is finalized when it ends. On CUDA stamps are events;
steps are finalized in order once their events completed (``poll``), a few steps later.
"""

from __future__ import annotations

from typing import Any

# Row layouts (local clock; aligned when written or summarized).
# step row: (step, t_start, t_end, compute, wait, comm, data, gc, paced, samples, gc_count)
# coll row: (step, seq, group, op, nbytes, t_enter, t_exit | None)
STEP_FIELDS = (
    "step", "t_start", "t_end", "compute", "wait", "comm", "data", "gc", "paced", "samples", "gc_count",
)
COLL_FIELDS = ("step", "seq", "group", "op", "bytes", "t_enter", "t_exit")

# Indices into a collective record.
_SEQ, _GROUP, _OP, _BYTES, _ENTER, _EXIT, _BLOCKING = range(7)


def _union_ns(intervals: list[tuple[int, int]]) -> int:
    """Total length of the union of [start, end] intervals."""
    if not intervals:
        return 0
    intervals.sort()
    total = 0
    cur_s, cur_e = intervals[0]
    for s, e in intervals[1:]:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return total + cur_e - cur_s


def step_metrics(
    t_start: int, t_end: int, colls: list[tuple[int, int, bool]], data: int, gc: int, paced: int
) -> tuple[int, int, int]:
    """(compute, wait, comm) of one step from its collectives' (enter, exit, blocking) stamps."""
    overlapped = [(e, x) for e, x, b in colls if not b]
    wait = max(0, max(x for _, x in overlapped) - max(e for e, _ in overlapped)) if overlapped else 0
    wait += sum(x - e for e, x, b in colls if b)
    comm = _union_ns([(e, x) for e, x, _ in colls])
    compute = max(0, (t_end - t_start) - wait - data - gc - paced)
    return compute, wait, comm


class Recorder:
    """Records of one rank. Main-thread methods: begin/end/poll/take; any thread: enter/exit."""

    def __init__(self, timeline: Any) -> None:
        self.timeline = timeline
        self.mark = timeline.mark
        self.step = -1
        self._seqs: dict[str, int] = {}
        self._colls: list[list[Any]] = []  # collectives of the running step (or between steps)
        self._pending: list[tuple[Any, ...]] = []  # ended steps waiting for their stamps (CUDA)
        self._start: Any = None
        # Finalized rows, handed to the writer (chunks) and the window summary.
        self.step_rows: list[tuple[Any, ...]] = []
        self.coll_rows: list[tuple[Any, ...]] = []
        self.op_rows: list[tuple[Any, ...]] = []  # (step, op, t_start, dur)
        self.win_steps: list[tuple[Any, ...]] = []
        self.win_colls: list[tuple[Any, ...]] = []

    # ---- collectives (any thread) ----
    def enter(self, group: str, op: str, nbytes: int, blocking: bool) -> list[Any]:
        seq = self._seqs.get(group, 0)
        self._seqs[group] = seq + 1
        rec = [seq, group, op, nbytes, self.mark(), None, blocking]
        self._colls.append(rec)
        return rec

    def exit(self, rec: list[Any]) -> None:
        rec[_EXIT] = self.mark()

    # ---- steps (main thread) ----
    def begin(self, step: int) -> None:
        self.step = step
        self._start = self.mark()

    def end(self, data: int, gc: int, gc_count: int, paced: int, samples: int) -> None:
        colls, self._colls = self._colls, []
        rec = (self.step, self._start, self.mark(), data, gc, gc_count, paced, samples, colls)
        if self.timeline.deferred:
            self._pending.append(rec)
            self.poll()
        else:
            self._finalize(rec, rec[1], rec[2], [(c[_ENTER], c[_EXIT]) for c in colls])

    def poll(self) -> None:
        """Finalize ended steps whose device events completed, in step order (CUDA path)."""
        tl = self.timeline
        while self._pending:
            rec = self._pending[0]
            colls = rec[8]
            if not (rec[2].query() and all(c[_EXIT] is not None and c[_EXIT].query() for c in colls)):
                return
            t_start = tl.resolve_anchor(rec[1])
            t_end = tl.resolve(rec[2])
            stamps = [(tl.resolve(c[_ENTER]), tl.resolve(c[_EXIT])) for c in colls]
            self._pending.pop(0)
            self._finalize(rec, t_start, t_end, stamps)

    def _finalize(
        self, rec: tuple[Any, ...], t_start: int, t_end: int, stamps: list[tuple[Any, Any]]
    ) -> None:
        step, _, _, data, gc, gc_count, paced, samples, colls = rec
        done = [(e, x, c[_BLOCKING]) for (e, x), c in zip(stamps, colls, strict=True) if x is not None]
        compute, wait, comm = step_metrics(t_start, t_end, done, data, gc, paced)
        row = (step, t_start, t_end, compute, wait, comm, data, gc, paced, samples, gc_count)
        self.step_rows.append(row)
        self.win_steps.append(row)
        for (e, x), c in zip(stamps, colls, strict=True):
            crow = (step, c[_SEQ], c[_GROUP], c[_OP], c[_BYTES], e, x)
            self.coll_rows.append(crow)
            self.win_colls.append(crow)

    def phase(self, name: str, t_start: int, dur: int) -> None:
        self.op_rows.append((self.step, name, t_start, dur))

    # ---- hand-off (main thread) ----
    def take_chunk(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Swap out the finalized rows for the writer (O(1): list swaps)."""
        out = (self.step_rows, self.coll_rows, self.op_rows)
        self.step_rows, self.coll_rows, self.op_rows = [], [], []
        return out

    def take_window(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        out = (self.win_steps, self.win_colls)
        self.win_steps, self.win_colls = [], []
        return out
