"""The collective wrapper in a real 4-rank gloo job with two DP subgroups (one spawn; see
_collectives_worker.py): positional group/async_op, time blocked in Work.wait() of async
collectives, and several observers wrapping at once, closed in any order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import fabricpace

HERE = Path(__file__).parent
WORLD = 4
MS = 1e6


@pytest.fixture(scope="module")
def job(tmp_path_factory, launcher):
    launch_ranks, _ = launcher
    out = tmp_path_factory.mktemp("wrap")
    procs = launch_ranks(HERE / "_collectives_worker.py", [str(out)], world=WORLD)
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} failed:\n{p.stderr[-4000:]}"
    results = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(WORLD)]
    return out, results


def _medians(run: Any, rank: int) -> dict[str, float]:
    s = run.steps.filter((pl.col("rank") == rank) & (pl.col("step") >= 2))  # 0-1: start-up
    return {c: float(s[f"{c}_ns"].median()) / MS for c in ("wait", "compute", "comm")}


def test_positional_group_is_recorded_under_its_group(job):
    """dist.all_reduce(t, SUM, sub) / dist.barrier(sub): each row under the subgroup's name, every
    (group, seq) instance seen by that group's two members (before: every row was group 'world',
    and (world, seq) joined collectives of two independent groups)."""
    out, results = job
    c = fabricpace.load_run(out / "p").collectives
    groups = {r["rank"]: r["group"] for r in results}
    assert len(set(groups.values())) == 2 and "world" not in groups.values()
    for rank in range(WORLD):
        mine = c.filter(pl.col("rank") == rank)
        assert mine.height == 4 * 12
        assert set(mine["group"]) == {groups[rank]}, (rank, set(mine["group"]))
        assert sorted(set(mine["op"])) == ["all_reduce", "barrier"]
    members = c.group_by("group", "seq").agg(pl.col("rank").sort())
    for group, ranks in zip(members["group"], members["rank"], strict=True):
        assert ranks.to_list() == sorted(r for r, g in groups.items() if g == group)


def test_positional_async_op_counts_its_wait(job):
    """dist.all_reduce(t, SUM, sub, True).wait() with the peer LATE_MS late: the early member is
    blocked ~40 ms a step in Work.wait(), and that is wait, not compute (before: the positional
    async_op was missed, the row ended when the call returned, wait 0.1 ms, compute 40 ms)."""
    out, results = job
    run = fabricpace.load_run(out / "p")
    for r in results:
        m = _medians(run, r["rank"])
        if not r["late"]:
            assert m["wait"] >= 25 and m["compute"] < 15, (r["rank"], m)


def test_async_wait_is_the_time_blocked_in_work_wait(job):
    """Early member: issue async, 20 ms host work, wait() until the late member issues (~40 ms after
    the step began). The host work is compute and only the ~20 ms in wait() is wait; comm still
    spans issue to completion (before: wait ~40 ms held the host work, compute ~0)."""
    out, results = job
    run = fabricpace.load_run(out / "w")
    for r in results:
        m = _medians(run, r["rank"])
        if not r["late"]:
            assert m["compute"] >= 15, (r["rank"], m)
            assert 5 <= m["wait"] <= m["comm"] - 12, (r["rank"], m)
    c = run.collectives
    assert c.height == WORLD * 12 and set(c["op"]) == {"all_reduce"}  # blocked intervals are no rows


def test_two_observers_close_in_any_order(job):
    """A (opened first) closes first: B keeps recording its 8 later steps, no observer records the
    other's window gathers or start-up all-reduces, and torch.distributed's functions (and
    Work.wait) are the originals once the last observer closed — also after a third one (before:
    B's rows stopped at A's close, A held B's private-group rows, A's wrapper stayed installed)."""
    out, results = job
    for r in results:
        assert r["after_a"] is False  # B still open: wrapped
        assert r["after_ab"] is True and r["after_c"] is True, r
        assert r["failures"] == [{}, {}, {}]
    for name, steps in (("mA", range(8)), ("mB", range(16)), ("mC", range(4))):
        c = fabricpace.load_run(out / name).collectives
        assert set(c["group"]) == {"world"} and set(c["op"]) == {"all_reduce"}, (name, set(c["group"]))
        for rank in range(WORLD):
            assert sorted(c.filter(pl.col("rank") == rank)["step"]) == list(steps), (name, rank)
