"""Fixtures for report tests: a tiny hand-computed run, a run whose buckets overlap the backward, a flat
healthy run, and a reader of the figures a report embeds."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fabricpace.run import Manifest, RunWriter

MS = 1_000_000


def write_tiny_run(out: Path) -> Path:
    """3 ranks × 4 steps. Step s lasts 100 + 10·s ms on every rank; one all-reduce per step where
    rank 0 arrives at +50 ms, rank 1 at +52 ms, rank 2 (last) at +60 ms and all leave at +70 ms.

    Hand-computed, over steps 1–3 (the diagnosis's warm-up of min(20, 4 // 10) = 0, at least 1, step
    is left out): median step 120 ms, p95 129 ms, CV 8.165 / 120 = 0.068, 3 instances, arrival spread
    10 ms per instance, time lost to late peers per rank-step (10 + 8 + 0) / 3 = 6 ms (every rank's
    collectives are blocking: comm_ns = wait_ns, so all of [t_enter, last arrival] is blocked) = 5.0% of
    the mean step, last arriver rank 2 in 3/3 instances.
    """
    w = RunWriter(out, Manifest(source="test", world_size=3, nodes=1, gpus_per_node=3))
    starts = [0, 100, 210, 330]
    durs = [100, 110, 120, 130]
    for r in range(3):
        w.write(
            "steps",
            {
                "rank": [r] * 4,
                "step": [0, 1, 2, 3],
                "t_start_ns": [s * MS for s in starts],
                "t_end_ns": [(s + d) * MS for s, d in zip(starts, durs, strict=True)],
                "compute_ns": [(50 + 2 * r + (8 if r == 2 else 0)) * MS] * 4,
                "wait_ns": [(20 - [0, 2, 10][r]) * MS] * 4,
                "comm_ns": [(20 - [0, 2, 10][r]) * MS] * 4,
                "data_ns": [0] * 4,
                "gc_ns": [0] * 4,
                "paced_ns": [0] * 4,
                "samples": [32] * 4,
            },
            rank=r,
        )
        enter = [50, 52, 60][r]
        w.write(
            "collectives",
            {
                "rank": [r] * 4,
                "step": [0, 1, 2, 3],
                "seq": [0, 1, 2, 3],
                "group": ["dp"] * 4,
                "op": ["all_reduce"] * 4,
                "bytes": [1 << 20] * 4,
                "t_enter_ns": [(s + enter) * MS for s in starts],
                "t_exit_ns": [(s + 70) * MS for s in starts],
            },
            rank=r,
        )
    w.write(
        "ranks",
        {
            "rank": [0, 1, 2],
            "node": [0, 0, 0],
            "local_rank": [0, 1, 2],
            "host": ["h0"] * 3,
            "leaf": [0] * 3,
            "dp_rank": [0, 1, 2],
            "pp_stage": [None] * 3,
            "tp_rank": [None] * 3,
            "numa": [0] * 3,
            "gpu": ["0", "1", "2"],
            "nic": [None] * 3,
            "clock_offset_ns": [0] * 3,
            "clock_err_ns": [1000] * 3,
        },
    )
    w.close()
    return out


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_run(tmp_path_factory.mktemp("tiny") / "tiny")


Columns = dict[str, list[list[Any]]]  # column -> per rank -> values


def _write(out: Path, ranks: int, steps: Columns, coll: Columns) -> Path:
    """A run directory from per-rank columns (``steps[col][rank]``, ``coll[col][rank]``)."""
    w = RunWriter(out, Manifest(source="test", world_size=ranks, nodes=1, gpus_per_node=ranks))
    for r in range(ranks):
        w.write("steps", {k: v[r] for k, v in steps.items()}, rank=r)
        if coll:
            w.write("collectives", {k: v[r] for k, v in coll.items()}, rank=r)
    w.close()
    return out


_STEP_COLS = ("rank", "step", "t_start_ns", "t_end_ns", "compute_ns", "wait_ns", "comm_ns", "data_ns",
              "gc_ns", "paced_ns", "samples")
_COLL_COLS = ("rank", "step", "seq", "group", "op", "bytes", "t_enter_ns", "t_exit_ns")


def write_overlapped_run(out: Path, steps: int = 3) -> Path:
    """2 ranks, steps of 100 ms. Each rank issues 4 buckets while its backward still runs, as DDP does:
    rank 0 at +20, +30, +40, +50 ms (its backward ends at +50), rank 1 (slow) at +30, +45, +60, +70.
    The buckets complete at +35, +50, +65, +75 on both; the optimizer runs from +75 to +100.

    By hand: rank 0 is blocked from +50 to +75 (wait 25 ms; its buckets were in flight 55 ms, from +20
    to +75). Of those 25 ms, +50 to +70 it waits for rank 1's last bucket (20 ms lost to a late peer),
    +70 to +75 the transfer runs (5 ms). Rank 1 is blocked +70 to +75: transfer only. The union of rank
    0's [arrival, last arrival] intervals, [+20, +70] = 50 ms, spans its backward: capped at the 25 ms
    blocked it left no transfer at all. diagnose splits the same step into skew = slowest − median own
    work = 95 − 85 = 10 ms (= the mean over ranks of 20 and 0) and exposed comm = 100 − 95 = 5 ms.
    """
    issue = [[20, 30, 40, 50], [30, 45, 60, 70]]
    done = [35, 50, 65, 75]
    wait = [25, 5]
    st: Columns = {k: [[], []] for k in _STEP_COLS}
    co: Columns = {k: [[], []] for k in _COLL_COLS}
    for r in range(2):
        for s in range(steps):
            base = 100 * s
            comm = done[-1] - issue[r][0]
            row: dict[str, Any] = {
                   "rank": r, "step": s, "t_start_ns": base * MS, "t_end_ns": (base + 100) * MS,
                   "compute_ns": (100 - wait[r]) * MS, "wait_ns": wait[r] * MS, "comm_ns": comm * MS,
                   "data_ns": 0, "gc_ns": 0, "paced_ns": 0, "samples": 8}
            for k, v in row.items():
                st[k][r].append(v)
            for b in range(4):
                crow: dict[str, Any] = {
                        "rank": r, "step": s, "seq": 4 * s + b, "group": "dp", "op": "all_reduce",
                        "bytes": 1 << 20, "t_enter_ns": (base + issue[r][b]) * MS,
                        "t_exit_ns": (base + done[b]) * MS}
                for k, v in crow.items():
                    co[k][r].append(v)
    return _write(out, 2, st, co)


def write_flat_run(out: Path, ranks: int = 4, steps: int = 30) -> Path:
    """A healthy simulated-like run: every step 188.014524 ms, steps 5 and 20 1 ns shorter; all ranks
    arrive together at one all-reduce a step (no arrival spread)."""
    st: Columns = {k: [[] for _ in range(ranks)] for k in _STEP_COLS}
    co: Columns = {k: [[] for _ in range(ranks)] for k in _COLL_COLS}
    dur = [188_014_524 - (1 if s in (5, 20) else 0) for s in range(steps)]
    starts = [sum(dur[:s]) for s in range(steps)]
    for r in range(ranks):
        for s in range(steps):
            row: dict[str, Any] = {
                   "rank": r, "step": s, "t_start_ns": starts[s], "t_end_ns": starts[s] + dur[s],
                   "compute_ns": dur[s] - 2 * MS, "wait_ns": 2 * MS, "comm_ns": 2 * MS, "data_ns": 0,
                   "gc_ns": 0, "paced_ns": 0, "samples": 8}
            for k, v in row.items():
                st[k][r].append(v)
            enter = starts[s] + 150 * MS
            crow: dict[str, Any] = {
                    "rank": r, "step": s, "seq": s, "group": "dp", "op": "all_reduce", "bytes": 1 << 20,
                    "t_enter_ns": enter, "t_exit_ns": enter + 2 * MS}
            for k, v in crow.items():
                co[k][r].append(v)
    return _write(out, ranks, st, co)


def plotly_figure(html: str, div_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(data, layout) of the plotly figure a report draws in ``div_id``."""
    m = re.search(r'Plotly\.newPlot\(\s*"' + re.escape(div_id) + r'",\s*', html)
    assert m, div_id
    dec = json.JSONDecoder()
    data, end = dec.raw_decode(html, m.end())
    end = html.index(",", end) + 1
    while html[end].isspace():
        end += 1
    layout, _ = dec.raw_decode(html, end)
    return data, layout


@pytest.fixture
def overlapped_run(tmp_path: Path) -> Path:
    return write_overlapped_run(tmp_path / "overlapped")


@pytest.fixture
def flat_run(tmp_path: Path) -> Path:
    return write_flat_run(tmp_path / "flat")


@pytest.fixture
def figure_in() -> Callable[[str, str], tuple[list[dict[str, Any]], dict[str, Any]]]:
    """``plotly_figure`` (test modules cannot import conftest under importlib mode)."""
    return plotly_figure
