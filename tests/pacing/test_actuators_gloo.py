"""Every actuator on real gloo ranks (separate processes, DDP, free ports).

The workload is benchmarks/pacing_real.py's worker at small size. gc and comm are pinned (a fixed
state from step 0), so the test sees the actuator itself; rebalance runs the real controller through
``fabricpace.observe(..., pacing="rebalance")``. Parameters after N steps must equal an unpaced run:
bitwise for gc and comm (they change only *when* things happen), allclose for rebalance (the global
batch is the same and losses are weighted by sample count; only the float summation order differs).
"""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest

from fabricpace.pacing.actuators import CommGate

pytestmark = pytest.mark.slow

SMALL = {
    "world": 2,
    "steps": 20,
    "window": 10,
    "global_batch": 32,
    "hidden": 64,
    "churn": 300,
    "dump_params": True,
    "timeout": 120.0,
}


@pytest.fixture(scope="module")
def off_run(bench):
    return bench.run_training(pacing="off", **SMALL)


def test_gc_lockstep_keeps_parameters_bitwise(bench, off_run):
    rec = bench.run_training(pacing="gc", pin={"gc_interval": 5}, **SMALL)
    assert rec["gc_lockstep_collections"] == SMALL["steps"] // 5
    assert rec["params"] == off_run["params"]


def test_comm_gate_keeps_parameters_bitwise_and_limits_in_flight(bench, off_run):
    # budget = 1% of 10 s = 100 ms per step: enough that the window of one bucket is always honoured
    rec = bench.run_training(
        pacing="comm", pin={"comm_window": 1, "step_time_ns": 1e10}, bucket_mb=0.01, **SMALL
    )
    assert rec["max_in_flight"] == 1
    rows = np.asarray(rec["rows"], dtype=np.float64)
    assert rows[:, 6].sum() > 0  # waits were reported as paced_ns
    assert rows[:, 6].max() <= 1e8 + 5e6  # never more than the budget (plus scheduling slack)
    assert rec["params"] == off_run["params"]


def test_rebalance_through_the_observer_moves_samples_and_matches_off(bench):
    kw = {
        "world": 3,
        # 60 steps: under load the trigger may need its second window, and a decision at step 40 of 40
        # would change shares only after the run (seen once in a full-suite run at load 6)
        "steps": 60,
        "window": 10,
        "global_batch": 48,
        "hidden": 64,
        "slow_rank": 1,
        # a per-sample delay (a slower device): it stays the clear straggler even when other jobs load
        # this 2-core machine, where extra CPU work per sample (slow_factor) competes with the other
        # ranks and its share of last arrivals falls with the load (the benchmark's slow-cpu case)
        "slow_ms_per_sample": 0.5,
        "dump_params": True,
        "timeout": 150.0,
        "driver": "observer",
    }
    off = bench.run_training(pacing="off", **kw)
    reb = bench.run_training(pacing="rebalance", **kw)
    enables = [d for d in reb["decisions"] if d["policy"] == "rebalance" and d["action"] == "enable"]
    assert enables and enables[0]["rank"] == 1 and "rank 1" in enables[0]["reason"]
    samples0 = {row[7] for row in reb["rows"]}
    assert len(samples0) > 1  # rank 0's share changed during the run
    a, b = np.asarray(off["params_f"]), np.asarray(reb["params_f"])
    assert np.allclose(a, b, rtol=1e-5, atol=1e-6), float(np.abs(a - b).max())


def test_placement_proposed_on_real_ranks_from_their_leaf_names(bench):
    # Ranks 0 and 2 hang off one leaf, 1 and 3 off another: the rank-order ring crosses leaves 4 times.
    # Each rank knows only its own leaf (FABRICPACE_LEAF); the window summaries carry it to every rank.
    rec = bench.run_training(
        pacing="placement", world=4, steps=30, window=10, global_batch=32, hidden=32,
        leaves=["leaf-a", "leaf-b", "leaf-a", "leaf-b"], driver="observer", timeout=150.0,
    )
    placed = [d for d in rec["decisions"] if d["policy"] == "placement"]
    assert len(placed) == 1, rec["decisions"]
    assert "crosses leaves 4 times" in placed[0]["reason"] and "crosses 2 times" in placed[0]["reason"]


def test_comm_gate_never_blocks_past_its_budget():
    gate = CommGate()
    gate.apply(1, 0, 20_000_000)  # window 1, 20 ms budget per step
    gate.before(0)  # in flight: 1, and its completion never comes
    t0 = time.perf_counter()
    gate.before(1)
    waited = time.perf_counter() - t0
    assert 0.015 <= waited < 1.0
    assert gate.end_step() >= 15_000_000
    # a completion from another thread releases a waiting launch at once
    gate.apply(1, 0, 2_000_000_000)
    gate.before(0)
    threading.Timer(0.05, gate.after, args=(0,)).start()
    t0 = time.perf_counter()
    gate.before(1)
    assert time.perf_counter() - t0 < 1.0


def test_a_rebalance_trial_probes_with_a_short_window_on_every_rank(bench, tmp_path):
    """The first ON window of a rebalance trial is closed early (after 5 steps of moved samples, and at
    least one more than the steps it ran before the new shares applied, so its medians speak for the
    move), at the same step on every rank; a move kept on that probe is re-checked in short windows
    for one whole window. Every rank's summary of every window covers the same steps, and parameters
    still match an unpaced run."""
    import polars as pl

    kw = {
        "world": 3, "steps": 100, "window": 20, "global_batch": 48, "hidden": 64, "slow_rank": 1,
        "slow_ms_per_sample": 3.0, "dump_params": True, "timeout": 150.0, "driver": "observer",
    }  # fmt: skip
    off = bench.run_training(pacing="off", **kw)
    reb = bench.run_training(pacing="rebalance", run_dir=str(tmp_path), **kw)
    enables = [d for d in reb["decisions"] if d["policy"] == "rebalance" and d["action"] == "enable"]
    assert enables and enables[0]["rank"] == 1, reb["decisions"]
    w = pl.read_parquet(tmp_path / "obs-rebalance" / "windows.parquet")
    per = w.group_by("window").agg(
        pl.col("first_step").n_unique().alias("firsts"), pl.col("steps").n_unique().alias("lengths"),
        pl.col("first_step").min(), pl.col("steps").max(),
    ).sort("window")  # fmt: skip
    assert per["firsts"].max() == 1 and per["lengths"].max() == 1, per  # every rank, the same steps
    probe = per.filter(pl.col("first_step") <= enables[0]["step"]).tail(1)
    # the window open when the trial started: 1-2 steps before the decision, 4 of share lag, then the
    # probe's steps of moved samples (at least 5, and more than the steps before them)
    assert probe["steps"][0] < kw["window"], per
    assert [int(s) for s in per["first_step"]] == [0, *itertools.accumulate(per["steps"][:-1])], per
    # A move kept on its probe (usually, with a 3 ms/sample straggler; on a loaded host the probe can
    # be inconclusive and the keep waits for a whole pair): re-checks, short windows until a whole
    # window of steps has passed, then whole windows again.
    def judged(step: int) -> int:  # length of the window a decision at ``step`` was made on
        done = per.filter(pl.col("first_step") + pl.col("steps") <= step)
        return int(done["steps"][-1])

    keeps = [d["step"] for d in reb["decisions"] if d["action"] == "keep"]
    on_probe = [k for k in keeps if judged(k) < kw["window"]]
    if on_probe:
        # the windows from the one open at the keep: short re-checks that together make up one whole
        # window (unless the run ends first: a keep late in a loaded run), then whole windows again
        after = [int(s) for s in per.filter(pl.col("first_step") + pl.col("steps") > on_probe[-1])["steps"]]
        short = list(itertools.takewhile(lambda s: s < kw["window"], after))
        assert short and (sum(short) >= kw["window"] or len(short) == len(after)), per
        assert sum(short[:-1]) < kw["window"], per  # (and they stop once they make up one)
        assert all(s == kw["window"] for s in after[len(short) :]), per
    a, b = np.asarray(off["params_f"]), np.asarray(reb["params_f"])
    assert np.allclose(a, b, rtol=1e-5, atol=1e-6), float(np.abs(a - b).max())
