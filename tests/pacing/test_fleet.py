"""pacing.fleet: reading every rank's leaf from one window's summaries."""

from __future__ import annotations

import numpy as np

from fabricpace.pacing.fleet import leaves_from_summaries
from fabricpace.run.window import WINDOW_FIELDS, WindowRows, WindowSummary

RANK, LEAF = WINDOW_FIELDS.index("rank"), WINDOW_FIELDS.index("leaf")


def rows(leaf_ids: list[float], order: list[int] | None = None) -> list[WindowSummary]:
    m = np.zeros((len(leaf_ids), len(WINDOW_FIELDS)))
    m[:, RANK] = np.arange(len(leaf_ids))
    m[:, LEAF] = leaf_ids
    out = WindowRows.from_matrix(m)
    return out if order is None else [out[i] for i in order]


def test_leaves_are_numbered_by_first_appearance_in_rank_order():
    ids = [9e8, 9e8, 3.5, 3.5, 7.0, 9e8]
    assert leaves_from_summaries(rows(ids), 6) == (0, 0, 1, 1, 2, 0)
    assert leaves_from_summaries(rows(ids, order=[5, 3, 1, 0, 2, 4]), 6) == (0, 0, 1, 1, 2, 0)


def test_no_leaves_unless_every_rank_reports_one_and_there_are_two():
    assert leaves_from_summaries(rows([1.0, -1.0, 2.0]), 3) is None  # rank 1 does not know its leaf
    assert leaves_from_summaries(rows([4.0, 4.0, 4.0]), 3) is None  # one leaf: nothing to place
    assert leaves_from_summaries(rows([1.0, 2.0]), 3) is None  # a rank missing
