"""The observer inside training loops as users write them, with real gloo ranks.

One module fixture launches ``_job_patterns_worker.py`` as 2 real env:// ranks in ``matrix:`` mode:
every pattern trains twice in one process group — without and with the observer, same weights and
data — so the tests compare the final parameters bitwise, then read each run directory back: the
user's steps, the DDP bucket instances (every one seen by every rank), a clean manifest, no observer
failure. (One launch for all patterns: starting torch and gloo costs more than the patterns.)
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from fabricpace.run.reader import load_run

WORKER = Path(__file__).parent / "_job_patterns_worker.py"


STEPS = 8
EARLY = ["join", "early_close"]  # a rank stops observing before the others (last: nothing after them)
PATTERNS = ["val", "val_wrapped", "val_in_step", "accum", "accum_flag", "accum_micro", "static",
            "tiny_buckets", "huge_bucket", "bf16", "varbatch", "skip", "two_backward", "catch",
            "catch_one_rank", "sweep", "two_models", "observe_twice", "fsdp2", "fsdp2_model", "slow_rank",
            "slow_rank_shares", "gc_churn", "act_ckpt", "unused", "zero", *EARLY]


def _launch(launcher, out: Path, pattern: str, *args: str, world: int = 2) -> list[dict]:
    launch, _ = launcher
    results = launch(WORKER, [str(out), pattern, *args], world=world, timeout=400)
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return [json.loads((out / f"rank-{i}.json").read_text()) for i in range(world)]


@pytest.fixture(scope="module")
def matrix(launcher, tmp_path_factory) -> list[dict]:
    """Every pattern without and with the observer (pacing off, except slow_rank*: auto, gc_churn:
    gc), 2 ranks; gather timeout 60 s."""
    out = tmp_path_factory.mktemp("jobs")
    return _launch(launcher, out, "matrix:" + ",".join(PATTERNS), "--steps", str(STEPS), "--window", "4",
                   "--gather-timeout", "60")


def _check_matrix(ranks: list[dict], name: str, *, steps: int = STEPS) -> list[Path]:
    """Bitwise-equal parameters with and without the observer; each observed run's directory
    holds the user's steps on every rank and DDP bucket instances seen by every rank."""
    dirs = []
    for res in ranks:
        pair = res["patterns"][name]
        assert pair["observed"]["digest"] == pair["plain"]["digest"], f"{name}: parameters differ"
        assert pair["observed"]["steps_taken"] == pair["plain"]["steps_taken"]
        for o in pair["observed"]["observers"]:
            assert o["failures"] == {}, (name, o["failures"])
            assert o["steps"] == steps
    for o in ranks[0]["patterns"][name]["observed"]["observers"]:
        run = load_run(o["run_dir"])
        assert run.manifest.complete, name
        per_rank = run.steps.group_by("rank").agg(pl.len().alias("n")).sort("rank")
        assert per_rank["n"].to_list() == [steps] * len(ranks), name
        coll = run.collectives
        assert coll.height > 0, f"{name}: no collective rows"
        seen = coll.group_by(["group", "seq"]).agg(pl.col("rank").n_unique().alias("r"))
        assert seen["r"].min() == len(ranks), f"{name}: an instance missed by a rank"
        dirs.append(Path(o["run_dir"]))
    return dirs


def _buckets_per_step(run_dir: Path) -> list[int]:
    c = load_run(run_dir).collectives.filter(pl.col("rank") == 0)
    return sorted(set(c.group_by("step").agg(pl.len().alias("n"))["n"].to_list()))


def test_eval_loops_and_accumulation_leave_training_and_records_intact(matrix):
    """Validation between and inside steps (eval, no_grad forwards through DDP, all_reduce of the
    val loss), accumulation with no_sync() and with nanoGPT's require_backward_grad_sync flag, and
    accumulation with obs.step() around each micro-batch (rows only in the synchronized ones)."""
    base = None
    for name in ["val", "val_in_step", "accum", "accum_flag", "accum_micro"]:
        (run,) = _check_matrix(matrix, name)
        # Eval forwards and no_sync backwards reduce nothing: one bucket round per step, as in training.
        per_step = _buckets_per_step(run)
        assert len(per_step) == 1, (name, per_step)
        base = base or per_step
        assert per_step == base, name
    micro = load_run(_check_matrix(matrix, "accum_micro")[0]).collectives
    assert set(micro["step"].to_list()) == {7}  # step 3 synchronized too, while DDP's layout was learned
    for res in matrix:
        v = res["patterns"]["val"]
        assert v["observed"]["notes"]["val_losses"] == v["plain"]["notes"]["val_losses"]


def test_collectives_between_steps_count_in_no_step(matrix):
    """wrap_collectives=True with a logging all_reduce after every step and a validation pass every
    5 steps, both outside ``obs.step()``: their rows are recorded (with the next step's number) but
    no step's wait or comm includes them. Before, the next step counted them whole: wait longer than
    the step itself (84 ms in a 3.5 ms step) and compute 0 in most steps."""
    (run,) = _check_matrix(matrix, "val_wrapped")
    data = load_run(run)
    steps = data.steps.with_columns(dur=pl.col("t_end_ns") - pl.col("t_start_ns"))
    assert steps.filter(pl.col("wait_ns") > pl.col("dur")).height == 0
    assert steps.filter(pl.col("comm_ns") > pl.col("dur")).height == 0
    world = data.collectives.filter(pl.col("group") == "world", pl.col("rank") == 0)
    assert world.height == STEPS - 1 + (STEPS - 1) // 5  # the last step's are issued after it ended
    for res in matrix:
        v = res["patterns"]["val_wrapped"]
        assert v["observed"]["notes"]["logged"] == v["plain"]["notes"]["logged"]


def test_ddp_options_autocast_and_irregular_steps(matrix):
    """static_graph + gradient_as_bucket_view, one bucket per parameter, one bucket for all, bf16
    autocast, batch sizes that vary by step and rank, skipped optimizer steps, two synchronized
    backwards per step, activation checkpointing, find_unused_parameters, ZeroRedundancyOptimizer."""
    names = ["static", "tiny_buckets", "huge_bucket", "bf16", "varbatch", "skip", "two_backward",
             "act_ckpt", "unused", "zero"]
    runs = {name: _check_matrix(matrix, name)[0] for name in names}
    # ZeRO-1's parameter broadcasts after each step, recorded through wrap_collectives.
    zero = load_run(runs["zero"]).collectives.filter(pl.col("rank") == 0, pl.col("op") == "broadcast")
    assert zero.height == 6 * STEPS
    assert _buckets_per_step(runs["huge_bucket"]) == [1]
    # 6 tensors, one per bucket, except DDP's first bucket (1 MiB cap) holding the last layer's two.
    assert _buckets_per_step(runs["tiny_buckets"]) == [5]
    assert _buckets_per_step(runs["two_backward"]) == [2 * _buckets_per_step(runs["static"])[0]]
    samples = load_run(runs["varbatch"]).steps.sort(["rank", "step"])
    expect = [4 + (s * 5 + 3) % 29 for s in range(STEPS)]
    assert samples.filter(pl.col("rank") == 1)["samples"].to_list() == expect
    for res in matrix:  # a skipped optimizer step is still a step of the loop
        assert res["patterns"]["skip"]["plain"]["steps_taken"] == STEPS - 1


def test_caught_errors_sweeps_and_several_observers(matrix):
    """A step that raises and is caught (on every rank, on one rank), two observed runs back to back,
    two DDP models each observed, observe() twice on one model."""
    for name in ["catch", "catch_one_rank", "sweep", "two_models", "observe_twice"]:
        dirs = _check_matrix(matrix, name)
        assert len(dirs) == (1 if name.startswith("catch") else 2)
        assert len(set(dirs)) == len(dirs)


def test_fsdp2_collectives_are_recorded(matrix):
    """FSDP2 (fully_shard) on gloo: its all-gathers and reduce-scatters go through
    all_gather_single / reduce_scatter_single (torch 2.13), which the collective wrapper records
    (before: not wrapped, no rows); passing the sharded module as ``model`` switches the wrapper on
    (before: a 'ddp probe' failure and no collective rows)."""
    for name in ["fsdp2", "fsdp2_model"]:
        (run,) = _check_matrix(matrix, name)
        ops = load_run(run).collectives.filter(pl.col("rank") == 0).group_by("op").agg(pl.len().alias("n"))
        counts = dict(zip(ops["op"].to_list(), ops["n"].to_list(), strict=True))
        # 3 sharded Linear layers: an all-gather each per forward, a reduce-scatter each per backward.
        assert counts.get("all_gather_single", 0) >= 3 * STEPS, (name, counts)
        assert counts.get("reduce_scatter_single", 0) >= 3 * STEPS, (name, counts)


@pytest.mark.parametrize("pattern", EARLY)
def test_a_rank_that_stops_observing_early_does_not_stall_the_others(matrix, pattern):
    """DDP Join with uneven inputs (rank 1 runs 3 of 8 batches, then waits inside Join.__exit__
    shadowing rank 0's all-reduces, its observer still open) and a rank that calls obs.close() half
    way: the others' next window gather can never complete. Before, it held their training for
    gather_timeout_s (here 60 s); now the rank says so on the Store when it joins (a wrapper on this
    DDP instance's join hook) or closes, and the gather is given up at once, with one logged reason.
    Parameters stay bitwise those of the plain job."""
    for res in matrix:
        pair = res["patterns"][pattern]
        assert pair["observed"]["digest"] == pair["plain"]["digest"]
        assert pair["observed"]["steps_taken"] == pair["plain"]["steps_taken"]
    rank0 = matrix[0]["patterns"][pattern]["observed"]
    assert rank0["wall_s"] < 30, rank0["wall_s"]  # well below the 60 s gather timeout
    assert "stopped observing" in rank0["observers"][0]["failures"]["gather"]
    assert matrix[1]["patterns"][pattern]["observed"]["observers"][0]["failures"] == {}
    # Every row recorded (all_steps): diagnose and report compare ranks over the steps both cover.
    run = load_run(rank0["observers"][0]["run_dir"], all_steps=True)
    counts = run.steps.group_by("rank").agg(pl.len().alias("n")).sort("rank")["n"].to_list()
    assert counts == [STEPS, STEPS - 5 if pattern == "join" else STEPS // 2 + 1]
    assert any("end at step" in w for w in run.warnings), run.warnings
    assert run.manifest.complete


def test_auto_pacing_leaves_rebalance_out_of_a_loop_without_batch_share(matrix):
    """pacing="auto" in a loop that never calls obs.batch_share (most loops): rebalance could move no
    sample, yet before it was enabled on a persistent straggler (a no-op), judged by the guard on noise
    and logged in pacing.parquet as if it acted. Now the first window shows that no rank asks for its
    share and every rank leaves rebalance out (gc and placement stay; comm is left out too, as on any
    job whose ranks all run on one host); a loop that asks keeps it."""
    for res in matrix:
        slow = res["patterns"]["slow_rank"]
        assert slow["observed"]["digest"] == slow["plain"]["digest"]
        assert slow["observed"]["notes"]["policies"] == ["gc", "placement"]
        assert "rebalance" in res["patterns"]["slow_rank_shares"]["observed"]["notes"]["policies"]
    run = load_run(matrix[0]["patterns"]["slow_rank"]["observed"]["observers"][0]["run_dir"])
    notes = run.manifest.extra["pacing_notes"]
    assert any("rebalance left out" in n for n in notes), notes
    assert run.pacing.filter(pl.col("policy") == "rebalance").height == 0


def test_gc_pacing_keeps_parameters_bitwise(matrix):
    """pacing="gc" on a loop that makes cyclic garbage every step (30 steps, windows of 4): the
    parameters stay bitwise those of the unobserved job whether or not the pacer moved collections
    into lockstep in this run (here it usually enables them after two or three windows)."""
    (run,) = _check_matrix(matrix, "gc_churn", steps=30)
    assert load_run(run).manifest.pacing["mode"] == "gc"
