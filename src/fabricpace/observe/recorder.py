"""The hot path: per-rank step and collective records, finalized into columns off the critical path.

What runs per step is one ``list.extend`` of plain ints (no per-step object kept alive, so nothing
the garbage collector has to track) and two clock reads: no collective, no I/O, no numpy. Rows are
finalized into numpy columns once per flush or window (``drain``), vectorized over the whole batch.

Three kinds of records:

* steps — a flat int list, 8 values per ended step (``_RAW``);
* DDP bucket *rounds* from the hook-free probe (``round_buffer``) — a flat list per group, one round
  per synchronized backward: the bucket arrival stamps in bucket order, then the end of the backward.
  A round belongs to the step whose end is the first at or after the round's end;
* any other collective (comm hook, collective wrapper, ``obs.collective``) — a small list
  ``[seq, group, op, nbytes, enter, exit, blocking]`` whose exit stamp is written by whichever thread
  sees completion (the DDP future callback on gloo's thread), which is safe because the record
  object outlives any buffer swap. ``blocking``: True (blocking: its duration is wait), False
  (overlapped, as DDP buckets) or None (an async collective whose wait is measured apart, below);
* time blocked in an async collective's ``Work.wait()`` (collective wrapper) — the same list with
  group None (``blocked``): it adds to the step's wait and is no collective row.

Per step (DESIGN.md): ``wait`` is the time the step was blocked on collectives — for overlapped
(asynchronous) collectives such as DDP buckets, from the last bucket's arrival (backward compute is
done then) to the last completion; for blocking ones, their whole duration; for async collectives
of the collective wrapper, the time blocked in their ``Work.wait()``. ``comm`` is the union of
the intervals collectives were in flight. ``compute`` is the rest of the step minus data, GC and
pacing time, i.e. this rank's own work.

On CPU stamps are host nanoseconds and a step is final when it ends. On CUDA stamps are events;
steps are resolved in order once their events completed (``poll``), a few steps later (the probe
then uses per-collective records, not rounds). There the step span is device time, so a ``data``
phase is measured in device time too: the observer stamps both ends of it on the stream
(``data_marks``) and ``data`` is the device time that passed between the two stamps, clipped to
the step — the GPU stalled on the host for that long (or ran what the phase enqueued). While the
GPU works through kernels queued earlier, both stamps complete back to back and the phase costs
the step nothing, which is the truth; a host duration would be subtracted from compute although
the GPU never waited. ``gc`` and ``paced`` stay host durations (docs/observer.md, "GPU path").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# Finalized step columns (int64 array, one row per step).
STEP_FIELDS = (
    "step", "t_start", "t_end", "compute", "wait", "comm", "data", "gc", "paced", "samples", "gc_count",
)
COLL_FIELDS = ("step", "seq", "group", "op", "bytes", "t_enter", "t_exit")
# Raw step record in the flat list: step, t_start, t_end, data, gc, gc_count, paced, samples.
_RAW = 8
_EMPTY_STEPS = np.zeros((0, len(STEP_FIELDS)), dtype=np.int64)

# Indices into a collective record.
_SEQ, _GROUP, _OP, _BYTES, _ENTER, _EXIT, _BLOCKING = range(7)
# How a row counts in the step's wait (``_metrics``): overlapped (DDP buckets: last arrival -> last
# completion), blocking (its whole duration), async (no wait of its own: its Work.wait() is a
# _WAITED interval), waited (a blocked interval: wait only, no collective in flight of its own).
_OVERLAPPED, _BLOCKS, _ASYNC, _WAITED = 0, 1, 2, 3


def _kind(c: list[Any]) -> int:
    b = c[_BLOCKING]
    if c[_GROUP] is None:
        return _WAITED
    return _ASYNC if b is None else (_BLOCKS if b else _OVERLAPPED)
# CUDA path: ended steps that may wait behind a collective whose exit was never stamped (see poll).
_MAX_PENDING = 64


@dataclass
class Colls:
    """Finalized collective rows as columns; ``group`` and ``op`` are codes into ``names``."""

    step: np.ndarray
    seq: np.ndarray
    group: np.ndarray  # int32 codes
    op: np.ndarray  # int32 codes
    nbytes: np.ndarray
    enter: np.ndarray
    exit: np.ndarray
    done: np.ndarray  # bool: exit known (False = never completed, written as null)
    names: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.step.size)

    @classmethod
    def empty(cls, names: tuple[str, ...] = ()) -> Colls:
        z = np.zeros(0, dtype=np.int64)
        c = np.zeros(0, dtype=np.int32)
        return cls(z, z, c, c, z, z, z, np.zeros(0, dtype=bool), names)

    @classmethod
    def from_rows(cls, rows: list[tuple[Any, ...]]) -> Colls:
        """From row tuples ``(step, seq, group, op, bytes, t_enter, t_exit | None)`` (tests, tools)."""
        if not rows:
            return cls.empty()
        names: list[str] = []
        code: dict[str, int] = {}

        def enc(name: str) -> int:
            if name not in code:
                code[name] = len(names)
                names.append(name)
            return code[name]

        cols = list(zip(*rows, strict=True))
        done = np.array([v is not None for v in cols[6]], dtype=bool)
        return cls(
            np.asarray(cols[0], dtype=np.int64), np.asarray(cols[1], dtype=np.int64),
            np.array([enc(g) for g in cols[2]], dtype=np.int32),
            np.array([enc(o) for o in cols[3]], dtype=np.int32),
            np.asarray(cols[4], dtype=np.int64), np.asarray(cols[5], dtype=np.int64),
            np.array([0 if v is None else v for v in cols[6]], dtype=np.int64), done, tuple(names),
        )

    def rows(self) -> list[tuple[Any, ...]]:
        """Row tuples (step, seq, group, op, bytes, t_enter, t_exit | None) — for tests and debugging."""
        names = self.names
        return [(int(s), int(q), names[g], names[o], int(b), int(e), int(x) if d else None)
                for s, q, g, o, b, e, x, d in zip(self.step, self.seq, self.group, self.op, self.nbytes,
                                                   self.enter, self.exit, self.done, strict=True)]

    def completed(self) -> int:
        return int(self.done.sum())

    def tail(self, slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(group codes, seq, enter, exit) of the last ``slots`` completed rows."""
        idx = np.flatnonzero(self.done)[-slots:]
        return self.group[idx], self.seq[idx], self.enter[idx], self.exit[idx]

    def colls(self) -> Colls:
        return self

    @staticmethod
    def concat(parts: list[Colls]) -> Colls:
        if len(parts) == 1:
            return parts[0]
        names = max((p.names for p in parts), key=len, default=())  # names only grow: the last has all
        if not parts:
            return Colls.empty(names)
        def cat(field: str) -> Any:
            return np.concatenate([getattr(p, field) for p in parts])

        return Colls(cat("step"), cat("seq"), cat("group"), cat("op"), cat("nbytes"), cat("enter"),
                     cat("exit"), cat("done"), names)


@dataclass
class RoundsBlock:
    """Bucket rounds of steps that each had exactly one synchronized backward and nothing else —
    the hook-free probe's steady state — kept as an (n × buckets) block of arrival stamps plus the
    end of each backward. Rows are expanded (``colls``) only when a chunk is written, on the writer
    thread; the window summary reads just its tail."""

    step: np.ndarray  # (n,)
    seq0: int  # seq of the first bucket of the first round; consecutive after that
    enter: np.ndarray  # (n, nb) arrival stamps
    end: np.ndarray  # (n,) end of each backward
    nbytes: tuple[int, ...]
    group: int  # code into names
    op: int
    names: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.enter.size)

    def completed(self) -> int:
        return int(self.enter.size)

    def _exit(self) -> np.ndarray:
        exit_ = self.enter.copy()
        exit_[:, -1] = self.end  # markers except the last bucket, which spans to the end of backward
        return exit_

    def tail(self, slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        nb = self.enter.shape[1]
        rounds = -(-slots // nb)
        enter = self.enter[-rounds:]
        exit_ = enter.copy()
        exit_[:, -1] = self.end[-rounds:]
        size = self.enter.size
        first = size - enter.size
        seq = self.seq0 + np.arange(first, size, dtype=np.int64)
        enter_f, exit_f = enter.ravel()[-slots:], exit_.ravel()[-slots:]
        return np.full(enter_f.size, self.group, dtype=np.int32), seq[-slots:], enter_f, exit_f

    def colls(self) -> Colls:
        n, nb = self.enter.shape
        size = n * nb
        return Colls(np.repeat(self.step, nb), self.seq0 + np.arange(size, dtype=np.int64),
                     np.full(size, self.group, dtype=np.int32), np.full(size, self.op, dtype=np.int32),
                     np.tile(np.asarray(self.nbytes, dtype=np.int64), n), self.enter.ravel().copy(),
                     self._exit().ravel(), np.ones(size, dtype=bool), self.names)


Part = Colls | RoundsBlock

def _metrics(t_start: np.ndarray, t_end: np.ndarray, other: np.ndarray, k: np.ndarray, enter: np.ndarray,
             exit_: np.ndarray, blocking: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute, wait, comm) per step from completed collectives (k = step row of each);
    ``blocking``: bool (True blocking, False overlapped) or the int row kinds (``_OVERLAPPED``...)."""
    n = t_start.size
    kind = blocking.astype(np.int8) if blocking.dtype == bool else blocking
    wait = np.zeros(n, dtype=np.int64)
    comm = np.zeros(n, dtype=np.int64)
    if k.size:
        # A collective that completed before its step began is not part of that step. One issued
        # between steps (a logging all_reduce after the step, a validation pass, a checkpoint barrier,
        # with wrap_collectives) is recorded with the next step's number, but that step never waited
        # for it: counted, it made wait exceed the step itself and compute 0.
        inside = exit_ > t_start[k]
        if not inside.all():
            k, enter, exit_, kind = k[inside], enter[inside], exit_[inside], kind[inside]
    if k.size:
        # Overlapped (DDP buckets): from the last arrival (own compute done) to the last completion.
        ov = kind == _OVERLAPPED
        blocking = (kind == _BLOCKS) | (kind == _WAITED)
        last_in = np.full(n, np.iinfo(np.int64).min)
        last_out = np.full(n, np.iinfo(np.int64).min)
        np.maximum.at(last_in, k[ov], enter[ov])
        np.maximum.at(last_out, k[ov], exit_[ov])
        has = np.bincount(k[ov], minlength=n) > 0
        wait[has] = np.maximum(0, last_out[has] - last_in[has])
        # Blocking collectives: their whole duration.
        if blocking.any():
            wait += np.bincount(k[blocking], weights=(exit_ - enter)[blocking], minlength=n).astype(np.int64)
        flight = kind != _WAITED  # a blocked interval is wait, not a collective in flight
        if not flight.all():
            k, enter, exit_ = k[flight], enter[flight], exit_[flight]
    if k.size:
        # comm = union of in-flight intervals per step: sort by (step, enter); shift each step's times
        # by k * span so one running maximum never leaks across steps.
        rel_in = enter - t_start[k]
        rel_out = exit_ - t_start[k]
        lo = int(min(rel_in.min(), 0))
        span = int(max(rel_out.max(), rel_in.max(), 0)) - lo + 1
        base = k * span - lo
        order = np.lexsort((rel_in, k))
        s_in, s_out, s_k = rel_in[order] + base[order], rel_out[order] + base[order], k[order]
        prev_max = np.maximum.accumulate(s_out)
        prev = np.concatenate(([np.iinfo(np.int64).min], prev_max[:-1]))
        covered = np.maximum(0, s_out - np.maximum(s_in, prev))
        comm = np.bincount(s_k, weights=covered, minlength=n).astype(np.int64)
    compute = np.maximum(0, (t_end - t_start) - wait - other)
    return compute, wait, comm


def finalize_raw(raw: np.ndarray, k: np.ndarray, enter: np.ndarray, exit_: np.ndarray,
                 blocking: np.ndarray) -> np.ndarray:
    """Step rows (n × 11, ``STEP_FIELDS``) from raw step records (n × 8) and the completed
    collectives of those steps (k = row index of the step each belongs to)."""
    step, t_start, t_end, data, gc, gc_count, paced, samples = raw.T
    compute, wait, comm = _metrics(t_start, t_end, data + gc + paced, k, enter, exit_, blocking)
    return np.stack([step, t_start, t_end, compute, wait, comm, data, gc, paced, samples, gc_count], axis=1)


def finalize(records: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Step rows and collective rows (tuples) of ended steps given as records
    ``(step, t_start, t_end, data, gc, gc_count, paced, samples, colls)`` — the per-step definition
    in one call (tests and ``step_metrics``; the recorder itself uses the columnar path)."""
    if not records:
        return [], []
    raw = np.array([r[:8] for r in records], dtype=np.int64).reshape(-1, 8)
    coll_rows = [(r[0], c[0], c[1], c[2], c[3], c[4], c[5]) for r in records for c in r[8]
                 if c[_GROUP] is not None]
    flat = [(k, c[_ENTER], c[_EXIT], _kind(c)) for k, r in enumerate(records) for c in r[8]
            if c[_EXIT] is not None]
    arr = np.array(flat, dtype=np.int64).reshape(-1, 4)
    rows = finalize_raw(raw, arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3].astype(np.int8))
    return [tuple(r) for r in rows.tolist()], coll_rows


def step_metrics(
    t_start: int, t_end: int, colls: list[tuple[int, int, bool]], data: int, gc: int, paced: int
) -> tuple[int, int, int]:
    """(compute, wait, comm) of one step from its collectives' (enter, exit, blocking) stamps."""
    rec = (0, t_start, t_end, data, gc, 0, paced, 0, [[0, "", "", 0, e, x, b] for e, x, b in colls])
    row = finalize([rec])[0][0]
    return row[3], row[4], row[5]


def _covered(spans: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Nanoseconds of [lo, hi] covered by the union of ``spans`` (a step's data phases: nested or
    overlapping phases count once; a phase that began before the step counts from its start)."""
    total, reach = 0, lo
    for a, b in sorted(spans):
        a, b = max(a, reach), min(b, hi)
        if b > a:
            total += b - a
            reach = b
    return total


class _Rounds:
    """Flat bucket rounds of one DDP group: ``nb`` arrival stamps then the backward's end, per round."""

    __slots__ = ("buf", "group", "nbytes")

    def __init__(self, group: str, nbytes: list[int]) -> None:
        self.group = group
        self.nbytes = list(nbytes)
        self.buf: list[Any] = []


class Recorder:
    """Records of one rank. Main-thread methods: begin/end/poll/drain/take; any thread: enter/exit."""

    def __init__(self, timeline: Any) -> None:
        self.timeline = timeline
        self.mark = timeline.mark
        self.deferred = bool(timeline.deferred)
        self.step = -1
        self._start: Any = None
        self._seqs: dict[str, int] = {}
        self._names: list[str] = []
        self._codes: dict[str, int] = {}
        self._colls: list[list[Any]] = []  # collective records of the running step (or between steps)
        self._gen: list[tuple[int, list[list[Any]]]] = []  # (step, records) of ended steps, resolved
        self._pending: list[tuple[Any, ...]] = []  # ended steps waiting for their device events (CUDA)
        self._raw: list[int] = []  # ended, resolved steps: _RAW ints each
        self._rounds: list[_Rounds] = []
        # CUDA path: (enter, exit) stamps of the running step's data phases (spans.Span).
        self.data_marks: list[tuple[Any, Any]] = []
        if self.deferred:
            self.begin = self._begin_events  # type: ignore[method-assign]
        self.op_rows: list[tuple[Any, ...]] = []  # (step, op, t_start, dur)
        # Finalized batches waiting for the writer (chunks) and the window summary.
        self._chunk: list[tuple[np.ndarray, Part]] = []
        # Window side: the fast drain's Python rows (list of 11-tuples, summarized without numpy) or
        # the general path's array.
        self._win: list[tuple[Any, Part]] = []

    # ---- collectives (any thread) ----
    def enter(self, group: str, op: str, nbytes: int, blocking: bool | None) -> list[Any]:
        seq = self._seqs.get(group, 0)
        self._seqs[group] = seq + 1
        rec = [seq, group, op, nbytes, self.mark(), None, blocking]
        self._colls.append(rec)
        return rec

    def exit(self, rec: list[Any]) -> None:
        rec[_EXIT] = self.mark()

    def blocked(self, t_in: Any, t_out: Any) -> None:
        """This rank was blocked from ``t_in`` to ``t_out`` in an async collective's ``Work.wait()``:
        wait of the running step (no collective row)."""
        self._colls.append([-1, None, None, 0, t_in, t_out, True])

    def buckets(self, group: str, nbytes: list[int], enters: list[Any], end: Any) -> None:
        """The buckets of one DDP backward seen without a comm hook (``ddp_probe``), in bucket order,
        as per-collective records (learning steps and the CUDA path; steady CPU state uses rounds).

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

    def round_buffer(self, group: str, nbytes: list[int]) -> list[Any]:
        """A flat list the probe appends whole backwards to (same rows as ``buckets``): per round the
        ``len(nbytes)`` arrival stamps (None = missed) and then the end of the backward. Only for
        host-clock stamps (not deferred)."""
        r = _Rounds(group, nbytes)
        self._rounds.append(r)
        return r.buf

    # ---- steps (main thread) ----
    def begin(self, step: int) -> None:
        self.step = step
        self._start = self.mark()

    def _begin_events(self, step: int) -> None:
        """``begin`` on the event timeline: a data phase that ended between steps is not this step's
        (on the host clock the observer resets its data time here too)."""
        self.step = step
        if self.data_marks:
            self.data_marks = []
        self._start = self.mark()

    def discard(self) -> None:
        """Drop the running step (it raised): no step row, and its collectives leave no rows either
        (their sequence numbers stay consumed, so (group, seq) keeps naming one instance everywhere)."""
        self._colls = []
        self.data_marks = []

    def end(self, data: int, gc: int, gc_count: int, paced: int, samples: int) -> None:
        """``data``: host nanoseconds of data phases measured on the host (all of them on CPU); on
        the event timeline the device time of ``data_marks`` is added when the step is resolved."""
        if self._colls:
            colls, self._colls = self._colls, []
        else:
            colls = []
        if self.deferred:
            if self.data_marks:
                marks: list[tuple[Any, Any]] | None
                marks, self.data_marks = self.data_marks, []
            else:
                marks = None
            self._pending.append((self.step, self._start, self.mark(), data, gc, gc_count, paced, samples,
                                  colls, marks))
            self.poll()
            return
        self._raw.extend((self.step, self._start, self.mark(), data, gc, gc_count, paced, samples))
        if colls:
            self._gen.append((self.step, colls))

    def poll(self, final: bool = False) -> None:
        """Resolve ended steps whose device events completed, in step order (CUDA path).

        Every stamp of the head step must have completed, the start included: stamps can sit on
        different streams (a comm hook's completion is recorded on the future's stream, a step may
        begin under ``torch.cuda.stream(...)``), so one completed event says nothing about another,
        and an unresolved stamp would reach the int64 columns as None. A collective whose exit was
        never stamped (its completion callback failed or never ran) would hold this and every later
        step forever; once ``_MAX_PENDING`` steps wait behind it, it is written as never completed
        (null exit), as on the host clock. Resolved rows are new lists, so a late exit stamp written
        into the old record cannot reach the columns. ``final`` (at close, after a synchronize): a
        missing exit stamp will not come any more, so it is written as null at once. Data-phase
        stamps are waited for like the others; one still incomplete when the step is stale is left
        out of its data time (the rest of the step is written)."""
        tl = self.timeline
        pending = self._pending
        while pending:
            rec = pending[0]
            colls = rec[8]
            if not (rec[1].query() and rec[2].query()):
                return
            stale = final or len(pending) > _MAX_PENDING
            for c in colls:
                enter, exit_ = c[_ENTER], c[_EXIT]
                if exit_ is None:
                    if not stale:
                        return
                elif not exit_.query():
                    return
                if enter is not exit_ and not enter.query():
                    return
            marks = rec[9]
            if marks is not None:
                done = [m for m in marks if m[0].query() and m[1].query()]
                if len(done) < len(marks) and not stale:
                    return
                marks = done
            t_start = tl.resolve_anchor(rec[1])
            t_end = tl.resolve(rec[2])
            data = rec[3]
            if marks:
                data += _covered([(tl.resolve(a), tl.resolve(b)) for a, b in marks], t_start, t_end)
            rows = []
            for c in colls:
                enter, exit_ = c[_ENTER], c[_EXIT]
                t_in = tl.resolve(enter)
                t_out = t_in if exit_ is enter else (None if exit_ is None else tl.resolve(exit_))
                rows.append([c[_SEQ], c[_GROUP], c[_OP], c[_BYTES], t_in, t_out, c[_BLOCKING]])
            pending.pop(0)
            self._raw.extend((rec[0], t_start, t_end, data, *rec[4:8]))
            if rows:
                self._gen.append((rec[0], rows))

    def _code(self, name: str) -> int:
        code = self._codes.get(name)
        if code is None:
            code = self._codes[name] = len(self._names)
            self._names.append(name)
        return code

    def _drain_simple(self, raw: list[int]) -> bool:
        """The common cases — no collective at all, or exactly one probe round per step and nothing
        else — computed in one Python pass over the flat lists plus two array conversions. At a window
        boundary numpy's code is cold after the training step (several µs per call here), so a short
        loop over ~50 steps is cheaper than a dozen vectorized calls. False = use the general path."""
        if self._gen:
            return False
        n = len(raw) // _RAW
        busy = [r for r in self._rounds if r.buf]
        rows: list[tuple[int, ...]] = []
        append = rows.append
        if not busy:
            for b in range(0, n * _RAW, _RAW):
                step, t0, t1, data, gc, gcc, paced, samples = raw[b:b + _RAW]
                compute = t1 - t0 - data - gc - paced
                append((step, t0, t1, compute if compute > 0 else 0, 0, 0, data, gc, paced, samples, gcc))
            self._add(np.array(rows, dtype=np.int64).reshape(-1, len(STEP_FIELDS)),
                      Colls.empty(tuple(self._names)), rows)
            return True
        r = busy[0]
        nb = len(r.nbytes)
        width = nb + 1
        buf = r.buf
        if len(busy) > 1 or len(buf) != n * width or None in buf:
            return False
        for i in range(n):
            step, t0, t1, data, gc, gcc, paced, samples = raw[i * _RAW:(i + 1) * _RAW]
            q = i * width
            end = buf[q + nb]
            if end < t0 or end > t1:  # a round outside its step: the general path sorts it out
                return False
            last_in = max(buf[q:q + nb])
            # DESIGN.md wait/comm for arrival markers plus one row spanning the last bucket's
            # arrival to the end of the backward (the per-collective definition; tested equal).
            wait = end - last_in if end > last_in else 0
            comm = end - buf[q + nb - 1]
            compute = t1 - t0 - wait - data - gc - paced
            append((step, t0, t1, compute if compute > 0 else 0, wait, comm if comm > 0 else 0, data, gc,
                    paced, samples, gcc))
        steps = np.array(rows, dtype=np.int64).reshape(-1, len(STEP_FIELDS))
        arr = np.array(buf, dtype=np.int64).reshape(n, width)
        buf.clear()
        seq0 = self._seqs.get(r.group, 0)
        self._seqs[r.group] = seq0 + n * nb
        self._add(steps, RoundsBlock(steps[:, 0].copy(), seq0, arr[:, :nb], arr[:, nb], tuple(r.nbytes),
                                     self._code(r.group), self._code("all_reduce"), tuple(self._names)), rows)
        return True

    def _add(self, steps: np.ndarray, part: Part, rows: list[tuple[int, ...]] | None = None) -> None:
        self._chunk.append((steps, part))
        self._win.append((steps if rows is None else rows, part))

    def drain(self) -> None:
        """Finalize ended steps into columns (main thread; at flush and window time)."""
        if not self._raw:
            return
        raw_list, self._raw = self._raw, []
        if self._drain_simple(raw_list):
            return
        raw = np.array(raw_list, dtype=np.int64).reshape(-1, _RAW)
        gen, self._gen = self._gen, []
        # Generic records -> columns.
        pos = {s: i for i, s in enumerate(raw[:, 0].tolist())} if gen else {}
        recs = [(pos.get(s, 0), c) for s, cs in gen for c in cs]
        # Blocked intervals (Recorder.blocked) count in their step's wait and are no collective rows.
        waited = [(k, c) for k, c in recs if c[_GROUP] is None and c[_EXIT] is not None]
        if waited or any(c[_GROUP] is None for _, c in recs):
            recs = [(k, c) for k, c in recs if c[_GROUP] is not None]
        parts_k, parts_seq, parts_g, parts_op, parts_b, parts_in, parts_out, parts_ok, parts_blk = (
            [] for _ in range(9))
        if recs:
            code = self._code
            parts_k.append(np.array([k for k, _ in recs], dtype=np.int64))
            parts_seq.append(np.array([c[_SEQ] for _, c in recs], dtype=np.int64))
            parts_g.append(np.array([code(c[_GROUP]) for _, c in recs], dtype=np.int32))
            parts_op.append(np.array([code(c[_OP]) for _, c in recs], dtype=np.int32))
            parts_b.append(np.array([c[_BYTES] for _, c in recs], dtype=np.int64))
            parts_in.append(np.array([c[_ENTER] for _, c in recs], dtype=np.int64))
            parts_ok.append(np.array([c[_EXIT] is not None for _, c in recs], dtype=bool))
            parts_out.append(np.array([0 if c[_EXIT] is None else c[_EXIT] for _, c in recs], dtype=np.int64))
            parts_blk.append(np.array([_kind(c) for _, c in recs], dtype=np.int8))
        # Probe rounds of the drained steps -> columns (vectorized; markers except the last bucket).
        t_end = raw[:, 2]
        for r in self._rounds:
            nb = len(r.nbytes)
            width = nb + 1
            m = len(r.buf) // width
            if m == 0:
                continue
            ends = np.array(r.buf[width - 1: m * width: width], dtype=np.int64)
            m = int(np.searchsorted(ends, t_end[-1], side="right"))  # rounds of steps that ended
            if m == 0:
                continue
            flat = r.buf[: m * width]
            del r.buf[: m * width]
            if None in flat:
                ok = np.array([v is not None for v in flat], dtype=bool).reshape(m, width)[:, :nb]
                arr = np.array([0 if v is None else v for v in flat], dtype=np.int64).reshape(m, width)
            else:
                arr = np.array(flat, dtype=np.int64).reshape(m, width)
                ok = np.ones((m, nb), dtype=bool)
            k_round = np.minimum(np.searchsorted(t_end, arr[:, nb], side="left"), raw.shape[0] - 1)
            enter = arr[:, :nb]
            exit_ = enter.copy()
            exit_[:, nb - 1] = arr[:, nb]
            seq0 = self._seqs.get(r.group, 0)
            self._seqs[r.group] = seq0 + m * nb
            seq = (seq0 + np.arange(m * nb, dtype=np.int64)).reshape(m, nb)
            sel = ok.ravel()
            parts_k.append(np.repeat(k_round, nb)[sel])
            parts_seq.append(seq.ravel()[sel])
            parts_g.append(np.full(int(sel.sum()), self._code(r.group), dtype=np.int32))
            parts_op.append(np.full(int(sel.sum()), self._code("all_reduce"), dtype=np.int32))
            parts_b.append(np.tile(np.asarray(r.nbytes, dtype=np.int64), m)[sel])
            parts_in.append(enter.ravel()[sel])
            parts_out.append(exit_.ravel()[sel])
            parts_ok.append(np.ones(int(sel.sum()), dtype=bool))
            parts_blk.append(np.full(int(sel.sum()), _OVERLAPPED, dtype=np.int8))
        names = tuple(self._names)
        w_k = np.array([k for k, _ in waited], dtype=np.int64)
        w_in = np.array([c[_ENTER] for _, c in waited], dtype=np.int64)
        w_out = np.array([c[_EXIT] for _, c in waited], dtype=np.int64)
        w_kind = np.full(len(waited), _WAITED, dtype=np.int8)
        if parts_k:
            cat = np.concatenate
            k, seq_a, grp, op = cat(parts_k), cat(parts_seq), cat(parts_g), cat(parts_op)
            nbytes, enter_a, exit_a, ok_a, blk = (cat(parts_b), cat(parts_in), cat(parts_out), cat(parts_ok),
                                                  cat(parts_blk))
            cols: list[Any] = [k, seq_a, grp, op, nbytes, enter_a, exit_a, ok_a, blk]
            if len(parts_k) > 1:  # rows in time order within a step, as they happened
                order = np.lexsort((enter_a, k))
                k, seq_a, grp, op, nbytes, enter_a, exit_a, ok_a, blk = (a[order] for a in cols)
            steps = finalize_raw(raw, cat((k[ok_a], w_k)), cat((enter_a[ok_a], w_in)),
                                 cat((exit_a[ok_a], w_out)), cat((blk[ok_a], w_kind)))
            colls = Colls(raw[k, 0], seq_a, grp, op, nbytes, enter_a, exit_a, ok_a, names)
        else:
            steps = finalize_raw(raw, w_k, w_in, w_out, w_kind)
            colls = Colls.empty(names)
        self._add(steps, colls)

    def phase(self, name: str, t_start: int, dur: int) -> None:
        self.op_rows.append((self.step, name, t_start, dur))

    # ---- hand-off (main thread) ----
    @staticmethod
    def _join(parts: list[tuple[np.ndarray, Part]]) -> tuple[np.ndarray, list[Part]]:
        if not parts:
            return _EMPTY_STEPS, []
        steps = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts])
        return steps, [p[1] for p in parts]

    def take_chunk(self) -> tuple[np.ndarray, list[Part], list[tuple[Any, ...]]]:
        """Finalized steps, collective parts and op rows since the last chunk, for the writer."""
        self.drain()
        steps, colls = self._join(self._chunk)
        ops, self._chunk, self.op_rows = self.op_rows, [], []
        return steps, colls, ops

    def take_window(self) -> tuple[Any, list[Part]]:
        """The window's step rows — a list of 11-tuples when every part came from the fast drain
        (``windows.local_vector`` then needs no numpy for its statistics), else an (n × 11) array —
        and its collective parts."""
        self.drain()
        win, self._win = self._win, []
        parts = [p for _, p in win]
        if all(isinstance(st, list) for st, _ in win):
            return [r for st, _ in win for r in st], parts
        width = len(STEP_FIELDS)
        arrays = [st if isinstance(st, np.ndarray) else np.array(st, dtype=np.int64).reshape(-1, width)
                  for st, _ in win]
        return (np.concatenate(arrays) if len(arrays) > 1 else arrays[0]), parts

    # ---- views for tests ----
    @property
    def step_rows(self) -> list[tuple[Any, ...]]:
        """Finalized step rows not yet taken by a chunk (tuples; tests and debugging)."""
        return [tuple(r) for p in self._chunk for r in p[0].tolist()]

    @property
    def coll_rows(self) -> list[tuple[Any, ...]]:
        return [r for p in self._chunk for r in p[1].colls().rows()]


def merge_parts(parts: Any) -> Colls:
    """One ``Colls`` from collective parts (a list of Colls / RoundsBlock, one of them, or row tuples)."""
    if isinstance(parts, (Colls, RoundsBlock)):
        return parts.colls()
    items = list(parts)
    if not items:
        return Colls.empty()
    if not isinstance(items[0], (Colls, RoundsBlock)):
        return Colls.from_rows(items)
    return Colls.concat([p.colls() for p in items])


def tail_parts(parts: list[Part], slots: int) -> tuple[int, tuple[np.ndarray, ...] | None, tuple[str, ...]]:
    """(completed rows, (codes, seq, enter, exit) of the last ``slots`` of them, names) over parts."""
    total = sum(p.completed() for p in parts)
    names = max((p.names for p in parts), key=len, default=())
    tails: list[tuple[np.ndarray, ...]] = []
    need = slots
    for p in reversed(parts):
        if need <= 0:
            break
        t = p.tail(need)
        if t[0].size:
            tails.append(t)
            need -= t[0].size
    if not tails:
        return total, None, names
    if len(tails) == 1:
        return total, tails[0], names
    tails.reverse()
    return total, tuple(np.concatenate([t[i] for t in tails]) for i in range(4)), names
