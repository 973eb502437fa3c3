"""Window summaries: the fixed-size per-rank statistics every rank shares every W steps.

The observer all-gathers one float64 vector of ``len(WINDOW_FIELDS)`` per rank (one small collective
per window, never per step); the simulator builds the same vectors from its arrays. The pacing
controller reads only these, so every rank — and the simulator's twin — takes the same decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import cast, overload

import numpy as np

_INT_FIELDS = ("rank", "window", "first_step", "steps")  # gathered as float64, read back as int


@dataclass(frozen=True, kw_only=True)
class WindowSummary:
    """Statistics of one rank over one window of steps (durations in nanoseconds, as float)."""

    rank: int
    window: int  # window index (0, 1, ...)
    first_step: int
    steps: int  # steps in the window
    step_mean_ns: float
    step_median_ns: float
    step_std_ns: float
    compute_median_ns: float  # own useful work per step
    compute_per_sample_ns: float  # compute median / samples median (rebalance reads this)
    wait_mean_ns: float  # blocked on collectives (skew + transfer), per step
    comm_mean_ns: float  # collectives in flight, per step
    transfer_mean_ns: float  # per step: min exit - last arrival, summed over collectives
    last_arrivals: float  # collectives in the window where this rank arrived last
    collectives: float  # collectives in the window
    data_mean_ns: float
    gc_mean_ns: float
    gc_count: float  # collections seen in the window
    paced_mean_ns: float
    samples_mean: float
    rss_bytes: float  # resident memory at window end (gc actuator bounds it)
    # Added by the observer (defaults keep older constructors working):
    arrivals_compared: float = 0.0  # collectives of this rank matched across ranks (≤ arrival slots)
    skew_mean_ns: float = 0.0  # per step: time waiting for the last peer to arrive (wait minus transfer)
    # Id of the leaf switch above this rank's node (a stable hash of its name, -1 = unknown): ranks with
    # equal ids share a leaf, which is all the placement policy needs to know.
    leaf: float = -1.0
    # Added for transient stragglers: the median compute per step and the mean samples per step over
    # the window's last ``tail_steps(steps)`` steps. A straggler that recovered inside the window is
    # slow in the window's median but no longer in its tail; the controller then waits for a second
    # window before moving samples. 0 = not measured (a sender without these fields): ignored.
    tail_compute_median_ns: float = 0.0
    tail_samples_mean: float = 0.0
    # Added for stragglers that come and go: the 10th to 40th percentiles of compute per step (the
    # lower order statistic, ``np.quantile(..., method="lower")``). With the median they place the
    # window's fast steps: a rank slow in 8 of every 13 steps has a median at its slow level and a 30th
    # percentile at the fleet's, so the controller can tell how often a slow group is slow (its duty)
    # before it moves samples that cost when the group is not. 0 = not measured.
    compute_p10_ns: float = 0.0
    compute_p20_ns: float = 0.0
    compute_p30_ns: float = 0.0
    compute_p40_ns: float = 0.0

    def to_array(self) -> np.ndarray:
        # The instance dict holds the fields in declaration order (the dataclass __init__ sets them
        # so); dataclasses.astuple deep-copies every field and made the controller's update ~50x
        # slower (190 ms a window at 2,048 ranks, nearly all of it here).
        return np.fromiter(vars(self).values(), dtype=np.float64, count=len(WINDOW_FIELDS))

    @classmethod
    def from_array(cls, values: np.ndarray) -> WindowSummary:
        # Vectors built before the defaulted trailing fields were added stay readable (defaults apply).
        names = WINDOW_FIELDS[: len(values)] if len(values) >= _REQUIRED else WINDOW_FIELDS
        kwargs: dict[str, float | int] = {n: float(v) for n, v in zip(names, values, strict=True)}
        for n in _INT_FIELDS:
            kwargs[n] = int(kwargs[n])
        return cls(**kwargs)  # type: ignore[arg-type]


def tail_steps(steps: int) -> int:
    """How many of a window's last steps make its tail: a fifth of the window (the most recent part,
    which predicts the next window best), at least 5 steps (a median of fewer is mostly jitter), never
    more than the window."""
    return max(0, min(int(steps), max(5, -(-int(steps) // 5))))


WINDOW_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(WindowSummary))
_REQUIRED = sum(1 for f in fields(WindowSummary) if f.default is MISSING)


class WindowRows(Sequence[WindowSummary]):
    """One window's summaries, one per row of the gathered (ranks × ``WINDOW_FIELDS``) float64 matrix,
    in its order; read-only, and each summary is built the first time it is read.

    Every rank turns the gathered matrix into summaries each window, in the training thread. At 16,384
    ranks building one Python object per rank was most of the window's cost (~140 ms,
    ``benchmarks/window_scale.py``), while the pacing controller, the window log and the status line
    read the matrix (``summary_matrix``) and never touch the objects: they are built only for a reader
    that asks for them (``rows[i]``, iteration, ``list(rows)``)."""

    __slots__ = ("_built", "_matrix", "_whole")

    def __init__(self, matrix: np.ndarray) -> None:
        head = np.array(matrix, dtype=np.float64)  # (an own copy: the matrix must not change under us)
        if head.ndim != 2 or head.shape[1] != len(WINDOW_FIELDS):
            raise ValueError(f"a window matrix is (ranks × {len(WINDOW_FIELDS)}), got {head.shape}")
        head.setflags(write=False)
        self._matrix = head
        self._built: list[WindowSummary | None] = [None] * head.shape[0]
        self._whole = False  # every summary built

    @classmethod
    def from_matrix(cls, head: np.ndarray) -> WindowRows:
        """The summaries of the rows of ``head`` (ranks × len(WINDOW_FIELDS))."""
        return cls(head)

    @classmethod
    def of(cls, summaries: Iterable[WindowSummary]) -> WindowRows:
        """``summaries`` as WindowRows: itself when it is one (they are read-only), else a copy."""
        return summaries if isinstance(summaries, WindowRows) else cls(summary_matrix(list(summaries)))

    @property
    def matrix(self) -> np.ndarray:
        """The rows' matrix (read-only)."""
        return self._matrix

    def __len__(self) -> int:
        return len(self._built)

    @overload
    def __getitem__(self, i: int) -> WindowSummary: ...
    @overload
    def __getitem__(self, i: slice) -> list[WindowSummary]: ...
    def __getitem__(self, i: int | slice) -> WindowSummary | list[WindowSummary]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        built = self._built[i]  # (IndexError and negative indices as a list's)
        if built is None:
            built = self._built[i] = _summary(self._matrix[i].tolist())
        return built

    def __iter__(self) -> Iterator[WindowSummary]:
        if not self._whole:  # one pass over the whole matrix is cheaper than row by row
            rows, built = self._matrix.tolist(), self._built
            self._built = [_summary(r) if b is None else b for b, r in zip(built, rows, strict=True)]
            self._whole = True
        return iter(cast("list[WindowSummary]", self._built))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, WindowRows):
            return bool(np.array_equal(self._matrix, other._matrix))
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"WindowRows({len(self)} ranks)"


def _summary(row: list[float]) -> WindowSummary:
    """A summary from one matrix row without the frozen dataclass ``__init__`` (the rows are the
    observer's own numbers; ~2x faster per object)."""
    kw: dict[str, float | int] = dict(zip(WINDOW_FIELDS, row, strict=True))
    for name in _INT_FIELDS:
        kw[name] = int(kw[name])
    obj = object.__new__(WindowSummary)
    obj.__dict__.update(kw)  # field order = declaration order, as to_array expects
    return obj


def summary_matrix(summaries: Iterable[WindowSummary]) -> np.ndarray:
    """(ranks × fields) float64 in ``WINDOW_FIELDS`` order, in the order given."""
    if isinstance(summaries, WindowRows):
        return summaries.matrix
    rows = [s.to_array() for s in summaries]
    return np.stack(rows) if rows else np.zeros((0, len(WINDOW_FIELDS)))
