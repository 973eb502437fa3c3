"""The report's per-chunk reduction (``_chunk_stats``) against a plain loop over instances and rank-steps:
the same instances (last arriver: latest arrival, ties to the lowest rank, and that row's step) and the
same skew-wait unions, whatever order the rows come in (stored order takes the one-pass union, other
orders its sort fallback)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import polars as pl
import pytest

from fabricpace.report.data import _chunk_stats


def _collectives(seed: int) -> pl.DataFrame:
    """6 ranks × 4 steps × 5 overlapping buckets in two groups, with tied last arrivals, a rank whose
    step number is one ahead for some instances, and an instance only one rank saw."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(4):
        for k in range(5):
            group = "dp" if k % 2 == 0 else "tp"
            seq = step * 5 + k
            base = step * 1_000_000 + k * 20_000
            enters = base + rng.integers(0, 60_000, 6)
            if k == 1:  # two ranks tie for the last arrival
                enters[[2, 4]] = enters.max() + 1
            for rank in range(6):
                if k == 4 and rank > 0 and step == 3:
                    continue  # seen by rank 0 only
                own_step = step + 1 if (rank == 4 and k == 1) else step
                t = int(enters[rank])
                rows.append((group, seq, rank, own_step, t, t + int(rng.integers(70_000, 90_000))))
    return pl.DataFrame(
        rows, schema=["group", "seq", "rank", "step", "t_enter_ns", "t_exit_ns"], orient="row"
    ).with_columns(pl.col("group").cast(pl.Categorical), pl.col("rank").cast(pl.Int32))


def _by_hand(c: pl.DataFrame) -> tuple[dict[tuple[str, int], tuple[int, ...]], dict[tuple[int, int], int]]:
    inst: dict[tuple[str, int], list[tuple[int, int, int, int]]] = defaultdict(list)
    for g, seq, rank, step, t, x in c.iter_rows():
        inst[(g, seq)].append((rank, step, t, x))
    instances: dict[tuple[str, int], tuple[int, ...]] = {}
    spans: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for key, rs in inst.items():
        last = max(t for _r, _s, t, _x in rs)
        rank, step = min((r, s) for r, s, t, _x in rs if t == last)
        skew = last - min(t for _r, _s, t, _x in rs)
        transfer = max(min(x for *_, x in rs) - last, 0)
        instances[key] = (step, len(rs), skew, transfer, rank)
        if len(rs) >= 2:
            for r, s, t, _x in rs:
                spans[(r, s)].append((t, last))
    waits = {}
    for cell, iv in spans.items():
        total, end = 0, None
        for a, b in sorted(iv):
            total += b - a if end is None else max(b - max(a, end), 0)
            end = b if end is None else max(end, b)
        waits[cell] = total
    return instances, waits


@pytest.mark.parametrize("order", ["stored", "rank_first", "shuffled"])
def test_chunk_stats_match_a_loop(order: str) -> None:
    for seed in range(3):
        c = _collectives(seed)
        if order == "stored":
            c = c.sort(["step", "rank", "seq"])
        elif order == "rank_first":
            c = c.sort(["rank", "step", "seq"])
        else:
            c = c.sample(fraction=1.0, shuffle=True, seed=seed)
        inst, waits = _chunk_stats(c)
        exp_inst, exp_waits = _by_hand(c)
        got_inst = {
            (r["group"], r["seq"]): (r["step"], r["n"], r["skew_ns"], r["transfer_ns"], r["last_rank"])
            for r in inst.iter_rows(named=True)
        }
        assert got_inst == exp_inst
        assert dict(zip(zip(waits["rank"], waits["step"], strict=True), waits["skew_wait_ns"], strict=True)) \
            == exp_waits
        assert inst.schema == {
            "group": pl.String, "seq": pl.Int64, "step": pl.Int64, "n": pl.UInt32,
            "skew_ns": pl.Int64, "transfer_ns": pl.Int64, "last_rank": pl.Int32,
        }
        # The tie at bucket 1 goes to the lower rank (2), with its own step.
        tied = inst.filter(pl.col("seq") % 5 == 1)
        assert set(tied["last_rank"].to_list()) == {2}


def test_null_arrival_keeps_the_whole_frame_sort() -> None:
    # A null t_enter sorts first in the descending sort the last arriver used to come from; that answer
    # is kept for such (malformed) rows rather than silently changed.
    c = _collectives(0).sort(["step", "rank", "seq"])
    c = c.with_columns(
        pl.when((pl.col("seq") == 3) & (pl.col("rank") == 5)).then(None).otherwise(pl.col("t_enter_ns"))
        .alias("t_enter_ns")
    )
    inst, _waits = _chunk_stats(c)
    ordered = c.sort(["t_enter_ns", "rank"], descending=[True, False])
    ref = ordered.group_by("group", "seq").agg(
        pl.col("step").first(), pl.col("rank").first().alias("last_rank")
    )
    got = inst.select("group", "seq", "step", "last_rank").sort("group", "seq")
    assert got.equals(ref.with_columns(pl.col("group").cast(pl.String)).sort("group", "seq"))
    assert inst.filter(pl.col("seq") == 3)["last_rank"].to_list() == [5]
