"""Window summaries: the per-rank vector and the cross-rank reading of the gathered matrix."""

from __future__ import annotations

import numpy as np

from fabricpace.observe.recorder import step_metrics
from fabricpace.observe.windows import NF, cross_rank, group_id, local_vector
from fabricpace.run.window import WINDOW_FIELDS, WindowSummary

MS = 1_000_000


def _rank_rows(rank: int, late_ms: float, steps: int = 4, buckets: int = 3):
    """Synthetic finalized rows: every bucket of every step; `late_ms` delays this rank's arrivals."""
    srows, crows = [], []
    for s in range(steps):
        t0 = s * 100 * MS
        seq0 = s * buckets
        for b in range(buckets):
            enter = t0 + (10 + b) * MS + int(late_ms * MS)
            exit_ = t0 + (10 + b) * MS + 30 * MS + 2 * MS  # everyone completes after the latest (30 ms)
            crows.append((s, seq0 + b, "ddp:world", "all_reduce", 1000, enter, exit_))
        srows.append((s, t0, t0 + 50 * MS, 5 * MS, 20 * MS, 25 * MS, 1 * MS, 0, 0, 8, 0))
    return srows, crows


def test_cross_rank_names_last_arriver_and_transfer():
    world, slots = 4, 16
    lateness = [0.0, 5.0, 10.0, 30.0]
    vecs = []
    for r in range(world):
        srows, crows = _rank_rows(r, lateness[r])
        vecs.append(local_vector(rank=r, window=0, steps=srows, colls=crows, base_ns=0, slots=slots))
    out = cross_rank(np.stack(vecs), slots)
    assert [s.rank for s in out] == [0, 1, 2, 3]
    assert [s.last_arrivals for s in out] == [0.0, 0.0, 0.0, 12.0]
    assert all(s.arrivals_compared == 12 for s in out)
    # transfer per instance = min exit - last arrival = 2 ms; 3 per step.
    assert np.allclose([s.transfer_mean_ns for s in out], 3 * 2 * MS)
    # skew per step = 3 buckets x (30 - own lateness) ms
    assert np.allclose([s.skew_mean_ns for s in out], [3 * (30 - x) * MS for x in lateness])
    assert out[0].step_median_ns == 50 * MS and out[0].samples_mean == 8


def test_arrival_block_is_fixed_size_and_scaled_when_traffic_exceeds_it():
    world, slots = 2, 4
    vecs = []
    for r in range(world):
        srows, crows = _rank_rows(r, 7.0 * r, steps=4, buckets=3)  # 12 collectives > 4 slots
        vecs.append(local_vector(rank=r, window=1, steps=srows, colls=crows, base_ns=0, slots=slots))
    assert all(v.size == NF + 4 * slots for v in vecs)
    out = cross_rank(np.stack(vecs), slots)
    assert out[1].arrivals_compared == 4
    assert out[1].last_arrivals == 12.0  # 4 of 4 compared, scaled to the 12 in the window


def test_empty_contribution_keeps_gather_shape():
    v = local_vector(rank=2, window=3, steps=[], colls=[], base_ns=0, slots=8)
    s = cross_rank(v[None, :], 8)[0]
    assert s.rank == 2 and s.steps == 0 and s.collectives == 0


def test_group_id_is_stable():
    assert group_id("ddp:world") == group_id("ddp:world") != group_id("world")


def test_window_summary_reads_vectors_without_added_fields():
    vec = np.arange(len(WINDOW_FIELDS), dtype=float)
    # sliced by name, so a field appended later does not move what "before X" means
    s = WindowSummary.from_array(vec[: WINDOW_FIELDS.index("arrivals_compared")])
    assert s.arrivals_compared == 0.0 and s.skew_mean_ns == 0.0 and s.leaf == -1.0
    assert WindowSummary.from_array(vec[: WINDOW_FIELDS.index("leaf")]).leaf == -1.0  # from before `leaf`
    old = WindowSummary.from_array(vec[: WINDOW_FIELDS.index("tail_compute_median_ns")])  # before the tail
    assert old.leaf == float(WINDOW_FIELDS.index("leaf")) and old.tail_compute_median_ns == 0.0
    tail = WindowSummary.from_array(vec[: WINDOW_FIELDS.index("compute_p10_ns")])  # before the percentiles
    assert tail.tail_samples_mean == float(WINDOW_FIELDS.index("tail_samples_mean"))
    assert tail.compute_p10_ns == tail.compute_p40_ns == 0.0
    assert np.array_equal(WindowSummary.from_array(vec).to_array(), vec)


def test_step_metrics_overlapped_and_blocking():
    # overlapped buckets: last arrival 40, last exit 70 -> wait 30; comm = union [10,50]+[40,70] = 60
    compute, wait, comm = step_metrics(0, 100, [(10, 50, False), (40, 70, False)], data=5, gc=2, paced=3)
    assert (wait, comm) == (30, 60)
    assert compute == 100 - 30 - 5 - 2 - 3
    # a blocking collective adds its whole duration to wait
    _, wait, comm = step_metrics(0, 100, [(80, 90, True)], data=0, gc=0, paced=0)
    assert (wait, comm) == (10, 10)
    assert step_metrics(0, 10, [], data=20, gc=0, paced=0) == (0, 0, 0)


def test_batch_finalize_matches_per_step_definition():
    from fabricpace.observe.recorder import finalize

    rng = np.random.default_rng(3)
    records, expected = [], []
    for s in range(40):
        t0 = s * 10_000
        colls, ivs = [], []
        for _ in range(int(rng.integers(0, 5))):
            e = t0 + int(rng.integers(-500, 8000))
            x = e + int(rng.integers(0, 3000))
            b = bool(rng.integers(0, 2))
            colls.append([0, "g", "op", 1, e, x, b])
            ivs.append((e, x, b))
        records.append((s, t0, t0 + 9000, 10, 20, 0, 30, 4, colls))
        # reference: straightforward per-step definition
        ov = [(e, x) for e, x, b in ivs if not b]
        wait = max(0, max(x for _, x in ov) - max(e for e, _ in ov)) if ov else 0
        wait += sum(x - e for e, x, b in ivs if b)
        pts = sorted((e, x) for e, x, _ in ivs)
        comm, cur = 0, None
        for e, x in pts:
            if cur is None or e > cur[1]:
                comm += 0 if cur is None else cur[1] - cur[0]
                cur = [e, x]
            else:
                cur[1] = max(cur[1], x)
        comm += 0 if cur is None else cur[1] - cur[0]
        expected.append((wait, comm, max(0, 9000 - wait - 10 - 20 - 30)))
    rows, _ = finalize(records)
    assert [(r[4], r[5], r[3]) for r in rows] == expected


def test_cross_rank_aligned_slots_path_equals_general_matching():
    # Same instances in the same slots on every rank (the lock-step case, read column-wise) vs the
    # same instances shuffled on one rank (matched by key): identical summaries, ties included.
    rng = np.random.default_rng(0)
    world, slots = 4, 32
    m = np.zeros((world, NF + 4 * slots))
    for r in range(world):
        b = m[r, NF:].reshape(4, slots)
        b[0, :20] = group_id("ddp:world")
        b[1, :20] = np.arange(20) + 7
        b[1, 20:] = -1
        b[2, :20] = rng.integers(0, 50, 20)  # coarse values: ties between ranks happen
        b[3, :20] = 2000 + rng.integers(0, 100, 20)
    shuffled = m.copy()
    blk = shuffled[1, NF:].reshape(4, slots)
    blk[:, :20] = blk[:, :20][:, ::-1]
    for a, b in zip(cross_rank(m, slots), cross_rank(shuffled, slots), strict=True):
        assert np.array_equal(a.to_array(), b.to_array())


def test_window_fields_from_python_rows_equal_the_array_path():
    from fabricpace.observe.windows import _F, _stats_array, _stats_rows

    rng = np.random.default_rng(4)
    for n in (1, 2, 49, 50):
        t0 = np.cumsum(rng.integers(10**6, 3 * 10**7, n)) + 10**13  # perf_counter-sized stamps
        # (step, t_start, t_end, compute, wait, comm, data, gc, paced, samples, gc_count)
        rows = [(s, int(a), int(a) + int(rng.integers(10**6, 3 * 10**7)),
                 *map(int, rng.integers(0, 10**6, 4)), 0, 0, int(rng.integers(1, 64)),
                 int(rng.integers(0, 3)))
                for s, a in enumerate(t0)]
        py = _stats_rows(rows)
        arr = _stats_array(np.asarray(rows, dtype=np.float64))
        assert np.allclose(py, arr, rtol=1e-12, atol=0)
        assert len(py) == NF and py[0] == 0.0  # rank/window are filled in by local_vector
        comp = np.array([r[3] for r in rows], dtype=np.float64)
        for name, q in (("compute_p10_ns", 0.1), ("compute_p40_ns", 0.4)):
            assert py[_F[name]] == np.quantile(comp, q, method="lower")
