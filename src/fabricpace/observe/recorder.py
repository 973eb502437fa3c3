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

import numpy as np

# Row layouts (local clock; aligned when written or summarized).
# step row: (step, t_start, t_end, compute, wait, comm, data, gc, paced, samples, gc_count)
# coll row: (step, seq, group, op, nbytes, t_enter, t_exit | None)
STEP_FIELDS = (
    "step", "t_start", "t_end", "compute", "wait", "comm", "data", "gc", "paced", "samples", "gc_count",
)
COLL_FIELDS = ("step", "seq", "group", "op", "bytes", "t_enter", "t_exit")

# Indices into a collective record.
_SEQ, _GROUP, _OP, _BYTES, _ENTER, _EXIT, _BLOCKING = range(7)


def step_metrics(
    t_start: int, t_end: int, colls: list[tuple[int, int, bool]], data: int, gc: int, paced: int
) -> tuple[int, int, int]:
    """(compute, wait, comm) of one step from its collectives' (enter, exit, blocking) stamps."""
    rec = (0, t_start, t_end, data, gc, 0, paced, 0, [[0, "", "", 0, e, x, b] for e, x, b in colls])
    row = finalize([rec])[0][0]
    return row[3], row[4], row[5]


def finalize(records: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Step rows and collective rows of ended steps, vectorized over the whole batch.

    A record is ``(step, t_start, t_end, data, gc, gc_count, paced, samples, colls)`` with resolved
    stamps. Runs at flush/window time, so the per-step hot path is only list appends.
    """
    if not records:
        return [], []
    head = np.array([r[:8] for r in records], dtype=np.int64).reshape(-1, 8)
    step, t_start, t_end, data, gc, gc_count, paced, samples = head.T
    coll_rows = [(r[0], c[0], c[1], c[2], c[3], c[4], c[5]) for r in records for c in r[8]]
    flat = [(k, c[_ENTER], c[_EXIT], c[_BLOCKING]) for k, r in enumerate(records) for c in r[8]
            if c[_EXIT] is not None]
    n = len(records)
    wait = np.zeros(n, dtype=np.int64)
    comm = np.zeros(n, dtype=np.int64)
    if flat:
        arr = np.array(flat, dtype=np.int64)
        k, enter, exit_, blocking = arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3].astype(bool)
        # Overlapped (DDP buckets): from the last arrival (own compute done) to the last completion.
        ov = ~blocking
        last_in = np.full(n, np.iinfo(np.int64).min)
        last_out = np.full(n, np.iinfo(np.int64).min)
        np.maximum.at(last_in, k[ov], enter[ov])
        np.maximum.at(last_out, k[ov], exit_[ov])
        has = np.bincount(k[ov], minlength=n) > 0
        wait[has] = np.maximum(0, last_out[has] - last_in[has])
        # Blocking collectives: their whole duration.
        wait += np.bincount(k[blocking], weights=(exit_ - enter)[blocking], minlength=n).astype(np.int64)
        # comm = union of in-flight intervals per step: sort by (step, enter); shift each step's times
        # by k * span so one running maximum never leaks across steps.
        rel_in = enter - t_start[k]
        rel_out = exit_ - t_start[k]
        span = int(max(rel_out.max(), rel_in.max(), 0)) - int(min(rel_in.min(), 0)) + 1
        base = k * span - int(min(rel_in.min(), 0))
        order = np.lexsort((rel_in, k))
        s_in, s_out, s_k = rel_in[order] + base[order], rel_out[order] + base[order], k[order]
        prev_max = np.maximum.accumulate(s_out)
        prev = np.concatenate(([np.iinfo(np.int64).min], prev_max[:-1]))
        covered = np.maximum(0, s_out - np.maximum(s_in, prev))
        comm = np.bincount(s_k, weights=covered, minlength=n).astype(np.int64)
    compute = np.maximum(0, (t_end - t_start) - wait - data - gc - paced)
    cols = (step, t_start, t_end, compute, wait, comm, data, gc, paced, samples, gc_count)
    step_rows = list(zip(*(c.tolist() for c in cols), strict=True))
    return step_rows, coll_rows


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
        self._ended: list[tuple[Any, ...]] = []  # ended steps with resolved stamps, not yet finalized
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

    def buckets(self, group: str, nbytes: list[int], enters: list[Any], end: Any) -> None:
        """The buckets of one DDP backward seen without a comm hook (``ddp_probe``), in bucket order.

        Only the end of the whole backward is known, not each bucket's completion. So that no
        interval claims communication that was not seen, the last bucket's row spans its arrival to
        ``end`` (the exposed communication) and every earlier bucket's row is an arrival marker
        (t_exit = t_enter): transfer and comm then count exposed communication only. A bucket whose
        arrival this rank missed (None) still consumes its sequence number, so (group, seq) names
        the same instance on every rank."""
        seq = self._seqs.get(group, 0)
        self._seqs[group] = seq + len(enters)
        append = self._colls.append
        last = len(enters) - 1
        for k, enter in enumerate(enters):
            if enter is not None:
                append([seq + k, group, "all_reduce", nbytes[k], enter, end if k == last else enter, False])

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
            self._ended.append(rec)

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
            for c in colls:
                c[_ENTER], c[_EXIT] = tl.resolve(c[_ENTER]), tl.resolve(c[_EXIT])
            self._pending.pop(0)
            self._ended.append((rec[0], t_start, t_end, *rec[3:]))

    def drain(self) -> None:
        """Finalize ended steps into rows (main thread; called at flush and window time)."""
        if not self._ended:
            return
        ended, self._ended = self._ended, []
        steps, colls = finalize(ended)
        self.step_rows.extend(steps)
        self.win_steps.extend(steps)
        self.coll_rows.extend(colls)
        self.win_colls.extend(colls)

    def phase(self, name: str, t_start: int, dur: int) -> None:
        self.op_rows.append((self.step, name, t_start, dur))

    # ---- hand-off (main thread) ----
    def take_chunk(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """Swap out the finalized rows for the writer."""
        self.drain()
        out = (self.step_rows, self.coll_rows, self.op_rows)
        self.step_rows, self.coll_rows, self.op_rows = [], [], []
        return out

    def take_window(self) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        self.drain()
        out = (self.win_steps, self.win_colls)
        self.win_steps, self.win_colls = [], []
        return out
