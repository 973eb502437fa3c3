"""``interval_union``: the one-pass sweep (rows already grouped, starts ascending), its sort fallback and
the general polars form all give the union a plain per-group loop gives — nested, overlapping, touching
and zero-length intervals, rows in any order."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from fabricpace.diagnose.arrivals import _sweep, _union_polars, interval_union

BY = ["rank", "step"]


def _by_hand(df: pl.DataFrame) -> dict[tuple[int, int], tuple[int, int, int, float]]:
    """(union length, first start, last end, max late) per group, merging sorted intervals in a loop."""
    out = {}
    for (rank, step), g in df.group_by(BY):
        intervals = sorted(zip(g["a"].to_list(), g["b"].to_list(), strict=True))
        total = 0
        cur_a, cur_b = intervals[0]
        for a, b in intervals[1:]:
            if a > cur_b:  # a gap: close the merged interval so far
                total += cur_b - cur_a
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        total += cur_b - cur_a
        out[(int(rank), int(step))] = (total, min(g["a"]), max(g["b"]), max(g["late_ns"]))  # type: ignore[call-overload]
    return out


def _as_dict(res: pl.DataFrame) -> dict[tuple[int, int], tuple[int, int, int, float]]:
    return {
        (r["rank"], r["step"]): (r["wait_ns"], r["first_ns"], r["last_ns"], r["late_ns"])
        for r in res.iter_rows(named=True)
    }


def _frame(rng: np.random.Generator, n: int) -> pl.DataFrame:
    a = rng.integers(-1_000, 5_000, n)
    # Mostly short and overlapping, some long (nesting others), some zero-length.
    length = np.where(rng.random(n) < 0.1, rng.integers(0, 3_000, n), rng.integers(0, 300, n))
    length[rng.random(n) < 0.1] = 0
    return pl.DataFrame({
        "rank": pl.Series(rng.integers(0, 4, n), dtype=pl.Int32),
        "step": rng.integers(0, 5, n),
        "a": a,
        "b": a + length,
        "late_ns": rng.normal(size=n),
    })


@pytest.mark.parametrize("order", ["shuffled", "rank_step", "step_rank", "grouped_a_unsorted"])
def test_union_matches_a_loop_in_any_row_order(order: str) -> None:
    rng = np.random.default_rng(7)
    for _ in range(60):
        df = _frame(rng, int(rng.integers(1, 300)))
        if order == "rank_step":
            df = df.sort(["rank", "step", "a"])
        elif order == "step_rank":
            df = df.sort(["step", "rank", "a"])
        elif order == "grouped_a_unsorted":  # groups contiguous, but starts not ascending inside them
            df = df.sort(["rank", "step", "a"], descending=[False, False, True])
        sweepable = _sweep(df, BY, ["late_ns"]) is not None
        # The sweep takes pre-sorted rows itself and refuses the rest (they get sorted first).
        if order in ("rank_step", "step_rank"):
            assert sweepable
        elif order == "grouped_a_unsorted" and df.group_by(BY).len()["len"].max() > 1:  # type: ignore[operator]
            assert not sweepable
        expected = _by_hand(df)
        assert _as_dict(interval_union(df, BY, maxes=["late_ns"])) == expected
        assert _as_dict(_union_polars(df.lazy(), BY, ["late_ns"]).collect()) == expected


def test_nested_overlapping_touching_by_hand() -> None:
    df = pl.DataFrame({
        "rank": pl.Series([0, 0, 0, 0, 1, 1, 1, 2], dtype=pl.Int32),
        "step": [0, 0, 0, 0, 0, 0, 0, 0],
        "a": [0, 2, 3, 20, 0, 5, 10, 7],
        "b": [10, 5, 12, 20, 5, 10, 11, 7],  # rank 0: [0,12] ∪ {20}; rank 1: touching; rank 2: a point
        "late_ns": [1.0] * 8,
    })
    res = interval_union(df, BY, maxes=["late_ns"]).sort("rank")
    assert res["wait_ns"].to_list() == [12, 11, 0]
    assert res["first_ns"].to_list() == [0, 0, 7]
    assert res["last_ns"].to_list() == [20, 11, 7]


def test_same_schema_as_the_general_form_and_lazy_input() -> None:
    df = _frame(np.random.default_rng(1), 50).sort(BY)
    fast = interval_union(df.lazy(), BY, maxes=["late_ns"])
    general = _union_polars(df.lazy(), BY, ["late_ns"]).collect()
    assert fast.schema == general.schema
    assert fast.sort(BY).equals(general.sort(BY))


def test_frames_the_sweep_cannot_take_go_the_general_way() -> None:
    # A null end, and starts so far apart that the sweep's shifted values would not fit in int64.
    with_null = pl.DataFrame({
        "rank": pl.Series([0, 0, 1], dtype=pl.Int32), "step": [0, 0, 0],
        "a": [0, 5, 1], "b": [10, None, 4],
    })
    general = _union_polars(with_null.lazy(), BY, []).collect()
    assert interval_union(with_null, BY).sort(BY).equals(general.sort(BY))
    huge = pl.DataFrame({
        "rank": pl.Series([0, 0, 1, 1], dtype=pl.Int32), "step": [0, 0, 0, 0],
        "a": [0, 1 << 59, -(1 << 60), 0], "b": [1 << 60, (1 << 60) + 5, 0, 3],
    })
    assert _sweep(huge, BY, []) is None
    res = interval_union(huge, BY).sort("rank")
    assert res["wait_ns"].to_list() == [(1 << 60) + 5, (1 << 60) + 3]
    assert interval_union(huge.head(0), BY).height == 0
