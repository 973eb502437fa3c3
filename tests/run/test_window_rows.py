"""run.window.WindowRows: a window's summaries read lazily from their matrix, and what reads it."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fabricpace.pacing.fleet import fleet_view
from fabricpace.run.window import WINDOW_FIELDS, WindowRows, WindowSummary, summary_matrix


def matrix(world: int = 6, window: int = 2, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    m = rng.uniform(1.0, 100.0, size=(world, len(WINDOW_FIELDS))).round(3)
    for name, value in (("rank", np.arange(world)), ("window", window), ("first_step", 100), ("steps", 50)):
        m[:, WINDOW_FIELDS.index(name)] = value
    return m


def test_rows_are_the_summaries_of_the_matrix_rows():
    m = matrix()
    rows = WindowRows.from_matrix(m)
    assert rows == [WindowSummary.from_array(v) for v in m]  # same fields, same types
    assert isinstance(rows[0].rank, int) and dataclasses.is_dataclass(rows[0])
    assert np.array_equal(summary_matrix(rows), np.stack([s.to_array() for s in rows]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        rows[0].rank = 3  # type: ignore[misc]


def test_rows_are_read_only_and_built_only_when_read():
    m = matrix()
    rows = WindowRows.from_matrix(m)
    m[0, 0] = 99.0  # the caller's array may change afterwards: the rows keep their own copy
    assert rows.matrix.flags.writeable is False and rows[0].rank == 0
    assert sum(b is not None for b in rows._built) == 1  # only what was read
    assert rows[-1] is rows[len(rows) - 1] and rows[1:3] == [rows[1], rows[2]]
    assert list(rows) == [WindowSummary.from_array(v) for v in matrix()]
    with pytest.raises(IndexError):
        rows[len(rows)]
    with pytest.raises((AttributeError, TypeError)):
        rows.append(rows[0])  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        rows[0] = rows[1]  # type: ignore[index]


def test_rows_of_plain_summaries_and_of_no_ranks():
    plain = list(WindowRows.from_matrix(matrix(world=3)))
    rows = WindowRows.of(plain)
    assert rows == plain and WindowRows.of(rows) is rows
    assert np.array_equal(rows.matrix, summary_matrix(plain))
    empty = WindowRows(np.zeros((0, len(WINDOW_FIELDS))))
    assert len(empty) == 0 and list(empty) == [] and summary_matrix(empty).shape == (0, len(WINDOW_FIELDS))
    with pytest.raises(ValueError, match="ranks"):
        WindowRows(np.zeros((3, 4)))


def test_the_fleet_view_is_the_same_from_the_matrix_and_from_objects_in_any_order():
    m = matrix(world=8)
    rows = WindowRows.from_matrix(m)
    shuffled = [rows[i] for i in np.random.default_rng(1).permutation(8)]
    a, b = fleet_view(rows, 8), fleet_view(shuffled, 8)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, y, equal_nan=True), f.name
        else:
            assert x == y or (math.isnan(x) and math.isnan(y)), f.name


def test_the_fleet_view_refuses_a_rank_twice_or_two_windows():
    m = matrix(world=4)
    twice = m.copy()
    twice[3, WINDOW_FIELDS.index("rank")] = 2
    with pytest.raises(ValueError, match="each rank exactly once"):
        fleet_view(WindowRows.from_matrix(twice), 4)
    mixed = m.copy()
    mixed[1, WINDOW_FIELDS.index("window")] = 3
    with pytest.raises(ValueError, match="mix windows"):
        fleet_view(WindowRows.from_matrix(mixed), 4)
