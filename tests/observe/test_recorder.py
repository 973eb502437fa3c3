"""The recorder's columnar paths: the fast path for probe rounds equals the per-collective definition,
and chunk parts built from columns are byte-identical to parts built from row tuples."""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fabricpace.observe.chunks import collectives_table, steps_table
from fabricpace.observe.recorder import Recorder, merge_parts
from fabricpace.observe.windows import local_vector


class _Ticks:
    """A host timeline whose clock is a counter advancing by random amounts (deterministic)."""

    deferred = False

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self._t = itertools.accumulate(int(x) for x in rng.integers(1, 5000, size=100_000))

    def mark(self) -> int:
        return next(self._t)


def _record(rec: Recorder, *, rounds: bool, steps: int, nb: int, seed: int, missing: bool = False) -> None:
    """The same stamps either as flat probe rounds or as per-collective bucket records."""
    rng = np.random.default_rng(seed)
    nbytes = [1000 * (k + 1) for k in range(nb)]
    buf = rec.round_buffer("ddp:world", nbytes) if rounds else None
    for s in range(steps):
        rec.begin(s)
        stamps = [rec.mark() for _ in range(nb)]
        order = rng.permutation(nb)  # buckets may arrive out of index order
        stamps = [stamps[i] for i in order]
        if missing and s % 7 == 3:
            stamps[1] = None
        end = rec.mark()
        if buf is not None:
            buf.extend(stamps)
            buf.append(end)
        else:
            rec.buckets("ddp:world", nbytes, stamps, end)
        rec.end(data=int(rng.integers(0, 50)), gc=0, gc_count=0, paced=0, samples=8)


def test_fast_rounds_path_equals_per_collective_records():
    for missing in (False, True):
        fast, slow = Recorder(_Ticks(1)), Recorder(_Ticks(1))
        _record(fast, rounds=True, steps=60, nb=4, seed=2, missing=missing)
        _record(slow, rounds=False, steps=60, nb=4, seed=2, missing=missing)
        fs, fc, _ = fast.take_chunk()
        ss, sc, _ = slow.take_chunk()
        assert np.array_equal(fs, ss)
        assert merge_parts(fc).rows() == merge_parts(sc).rows()
        assert (fs[:, 4] > 0).any() and (fs[:, 5] > 0).any()  # wait and comm were exercised


def test_window_vector_same_from_block_and_rows():
    from fabricpace.observe.windows import _F

    fast, slow = Recorder(_Ticks(5)), Recorder(_Ticks(5))
    _record(fast, rounds=True, steps=50, nb=3, seed=6)
    _record(slow, rounds=False, steps=50, nb=3, seed=6)
    s_f, c_f = fast.take_window()
    s_s, c_s = slow.take_window()
    a = local_vector(rank=1, window=0, steps=s_f, colls=c_f, base_ns=7, slots=16)
    b = local_vector(rank=1, window=0, steps=s_s, colls=merge_parts(c_s).rows(), base_ns=7, slots=16)
    keep = np.ones(a.size, dtype=bool)
    keep[_F["rss_bytes"]] = False  # read from /proc at each call
    assert np.array_equal(a[keep], b[keep])
    assert a[_F["collectives"]] == 150


def test_parts_are_byte_identical_to_row_built_parts(tmp_path):
    rec = Recorder(_Ticks(9))
    _record(rec, rounds=True, steps=30, nb=4, seed=3)
    steps, parts, _ = rec.take_chunk()
    rows = merge_parts(parts).rows()
    # The row-built reference: strings dictionary-encoded per part, exactly as before columns.
    ref = pa.Table.from_arrays(
        [pa.array([0] * len(rows), pa.int32()), pa.array([r[0] for r in rows], pa.int64()),
         pa.array([r[1] for r in rows], pa.int64()), pa.array([r[2] for r in rows]).dictionary_encode(),
         pa.array([r[3] for r in rows]).dictionary_encode(), pa.array([r[4] for r in rows], pa.int64()),
         pa.array([r[5] - 11 for r in rows], pa.int64()), pa.array([r[6] - 11 for r in rows], pa.int64())],
        names=["rank", "step", "seq", "group", "op", "bytes", "t_enter_ns", "t_exit_ns"])
    got = collectives_table(0, parts, 11)
    assert got.equals(ref)
    pq.write_table(got, tmp_path / "a.parquet", compression="zstd")
    pq.write_table(ref, tmp_path / "b.parquet", compression="zstd")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    # Steps from the array equal steps from row tuples.
    assert steps_table(0, steps, 11).equals(steps_table(0, [tuple(r) for r in steps.tolist()], 11))


class _Clock:
    """A host timeline read from a list the test sets (exact stamps)."""

    deferred = False

    def __init__(self) -> None:
        self.now = 0

    def mark(self) -> int:
        return self.now


def test_async_collective_wait_is_the_time_blocked_in_work_wait():
    """An async collective in flight 100 -> 500 while the host works until 400, then blocks in
    Work.wait() 400 -> 510: wait 110 (not the 400 from issue to completion), comm 400, compute the
    rest; the blocked interval is no collective row. A blocking and an overlapped row keep theirs."""
    clock = _Clock()
    rec = Recorder(clock)
    clock.now = 0
    rec.begin(0)
    clock.now = 100
    row = rec.enter("g", "all_reduce", 64, None)  # async (collective wrapper): no wait of its own
    clock.now = 500
    rec.exit(row)
    rec.blocked(400, 510)
    clock.now = 600
    sync = rec.enter("g", "barrier", 0, True)
    clock.now = 650
    rec.exit(sync)
    clock.now = 1000
    rec.end(data=0, gc=0, gc_count=0, paced=0, samples=1)
    steps, parts, _ = rec.take_chunk()
    compute, wait, comm = steps[0, 3:6].tolist()
    assert (wait, comm, compute) == (110 + 50, 400 + 50, 1000 - 160)
    assert [r[3] for r in merge_parts(parts).rows()] == ["all_reduce", "barrier"]
