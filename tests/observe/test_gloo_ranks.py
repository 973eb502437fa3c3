"""The observer in a real 4-rank gloo job (one spawn shared by all checks; see _gloo_worker.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import fabricpace

HERE = Path(__file__).parent
WORLD = 4
SLOW = 3
SHIFTED = 2
SHIFT_NS = 37_000_000


@pytest.fixture(scope="module")
def job(tmp_path_factory, launcher):
    launch_ranks, free_port = launcher
    out = tmp_path_factory.mktemp("gloo")
    ro = out / "readonly"
    ro.mkdir()
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(ro)]).returncode != 0:
        pytest.skip("chattr +i unavailable: cannot make a read-only run directory here")
    try:
        procs = launch_ranks(HERE / "_gloo_worker.py", [str(out), str(free_port())], world=WORLD,
                             env={"FABRICPACE_CLOCK_SHIFT_NS": f"{SHIFTED}:{SHIFT_NS}"})
    finally:
        subprocess.run(["chattr", "-i", str(ro)], check=False)
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} failed:\n{p.stderr[-4000:]}"
    results = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(WORLD)]
    return out, results, procs


def test_gradients_bitwise_identical_with_and_without_observer(job):
    _, results, _ = job
    for r in results:
        assert r["a"]["equal"] == [True] * 10, r["a"]["equal"]
        assert r["a"]["failures"] == {}


def test_pacing_hook_calls_reach_the_pacer(job):
    out, results, _ = job
    for r in results:
        calls = r["a"]["calls"]
        assert calls["on_step_start"] == calls["on_step_end"] == 10
        assert calls["before_bucket"] == calls["after_bucket"] >= 10
        assert calls["on_window"] == 2 and calls["close"] == 1 and calls["batch_share"] == 10
        # window 1 closes at step 4 and is collected 2 steps later; window 2 (step 9) at close
        assert r["a"]["windows"] == [[6, WORLD], [9, WORLD]]
    run = fabricpace.load_run(out / "a")
    assert run.manifest.complete and not run.warnings
    assert (run.steps["paced_ns"] == 1234).all()
    assert (run.steps["samples"] == 16).all()
    ops = set(zip(run.collectives["group"], run.collectives["op"], strict=True))
    assert {("ddp:world", "all_reduce"), ("world", "all_reduce"), ("world", "manual_op")} <= ops


def test_broken_pacer_is_dropped_and_training_continues(job):
    _, results, _ = job
    for r in results:
        assert "pacing" in r["b"]["failures"]
        assert r["b"]["pacer_calls"]["before_bucket"] == 3  # never called again after raising
        assert len(r["b"]["windows"]) == 3


def test_clock_offset_recovered_within_uncertainty(job):
    out, results, _ = job
    for r in results:
        expected = SHIFT_NS if r["rank"] == SHIFTED else 0
        assert abs(r["b"]["offset_ns"] - expected) <= r["b"]["err_ns"], r["b"]
        assert r["b"]["err_ns"] < 20_000_000  # an uncertainty that large would make the check vacuous
        assert r["b"]["clock_updates"] >= 1  # the estimate checked is a re-alignment made during training
    ranks = fabricpace.load_run(out / "b").ranks.sort("rank")
    assert abs(ranks["clock_offset_ns"][SHIFTED] - SHIFT_NS) <= ranks["clock_err_ns"][SHIFTED]


def test_slow_rank_is_last_arriver_and_waits_least(job):
    out, results, _ = job
    run = fabricpace.load_run(out / "b")
    assert run.manifest.complete, run.warnings
    c = run.collectives.filter(pl.col("step") >= 1)  # step 0 builds DDP's buckets
    last = c.group_by("group", "seq").agg(pl.col("rank").sort_by("t_enter_ns").last().alias("last"))
    share = (last["last"] == SLOW).mean()
    assert share >= 0.9, f"slow rank last in {share:.0%} of {last.height} collectives"
    wait = run.steps.filter(pl.col("step") >= 1).group_by("rank").agg(pl.col("wait_ns").median()).sort("rank")
    assert int(np.argmin(wait["wait_ns"].to_numpy())) == SLOW, wait
    # Every rank received the same window summaries, and they name the slow rank too.
    views = [r["b"]["windows"] for r in results]
    assert all(v == views[0] for v in views)
    for w in views[0][1:]:
        assert max(range(WORLD), key=lambda k: w[k]["last_arrivals"]) == SLOW
        assert w[SLOW]["skew_mean_ns"] < min(w[k]["skew_mean_ns"] for k in range(WORLD) if k != SLOW)


def test_prometheus_metrics_served_on_localhost(job):
    _, results, _ = job
    text = results[0]["b"]["metrics"]
    assert 'fabricpace_rank_last_arrivals{rank="3"}' in text
    assert "fabricpace_throughput" in text


def test_read_only_run_dir_does_not_stop_training(job):
    out, results, _ = job
    for r in results:
        assert len(r["c"]["losses"]) == 12 and all(np.isfinite(r["c"]["losses"]))
        assert "writing" in r["c"]["failures"]
        assert r["c"]["windows"] == 2  # window summaries kept flowing
    assert not any((out / "readonly").iterdir())


def test_each_failure_is_logged_once(job):
    _, _, procs = job
    for p in procs:
        assert p.stderr.count("writing disabled") == 1, p.stderr[-2000:]


def test_gone_peer_costs_one_timeout_then_observer_steps_aside(job):
    _, results, _ = job
    for r in results[:3]:
        assert "gather" in r["d"]["failures"], r["d"]
        assert r["d"]["windows"] == 0  # the first gather timed out; no further attempts
        assert r["d"]["seconds"] < 60
    assert results[3]["d"]["failures"] == {}


def _arrival_checks(run: fabricpace.RunData, first_step: int) -> tuple[float, int, pl.DataFrame]:
    c = run.collectives.filter(pl.col("step") >= first_step)
    last = c.group_by("group", "seq").agg(pl.col("rank").sort_by("t_enter_ns").last().alias("last"))
    wait = (run.steps.filter(pl.col("step") >= first_step).group_by("rank").agg(pl.col("wait_ns").median())
            .sort("rank"))
    return float((last["last"] == SLOW).mean()), last.height, wait


def test_hook_free_mode_names_the_slow_rank_and_keeps_gradients_bitwise(job):
    out, results, _ = job
    for r in results:
        e = r["e"]
        assert e["mode"] == "grad_hooks" and e["failures"] == {}
        assert e["equal"] == [True] * 24
        kept, buckets, handles = e["kept"]
        assert kept == buckets == handles >= 2  # one hook per bucket after learning
    run = fabricpace.load_run(out / "e")
    assert run.manifest.complete and run.manifest.extra["ddp_mode"] == "grad_hooks"
    assert run.manifest.extra["process_group_backend"] == "gloo"  # diagnose: the CPU reduces
    c = run.collectives
    # Learning takes DDP's first two steps (the rebuilt layout is reported one step late); from
    # then on every step has every bucket on every rank. Only the backward's end is seen: the last
    # bucket's row ends there, the others are arrival markers (t_exit = t_enter).
    assert c["step"].min() == 2
    c = c.with_columns((pl.col("t_exit_ns") - pl.col("t_enter_ns")).alias("d"))
    per_step = c.group_by("rank", "step").agg(pl.len().alias("n"), (pl.col("d") > 0).sum().alias("spans"),
                                             (pl.col("d") < 0).sum().alias("neg"))
    assert per_step["n"].n_unique() == 1 and per_step.height == WORLD * 22
    assert (per_step["spans"] == 1).all() and (per_step["neg"] == 0).all()
    spanning = c.group_by("rank", "step").agg(pl.col("seq").max(),
                                              pl.col("seq").sort_by("d").last().alias("s"))
    assert (spanning["seq"] == spanning["s"]).all()  # the span is the last bucket's
    share, n, wait = _arrival_checks(run, 2)
    assert share >= 0.9, f"slow rank last in {share:.0%} of {n} collectives"
    assert int(np.argmin(wait["wait_ns"].to_numpy())) == SLOW, wait
    for w in results[0]["e"]["windows"][1:]:
        assert max(range(WORLD), key=lambda k: w[k]["last_arrivals"]) == SLOW


def test_comm_hook_installed_mid_run_when_the_pacer_asks(job):
    out, results, _ = job
    for r in results:
        f = r["f"]
        assert f["failures"] == {}
        assert f["equal"] == [True] * 14  # bitwise identical before and after the switch
        # Second window closes at step 7 (window 4, lag 0): the hook runs from step 8 on.
        assert f["hook_step"] == 7
        assert f["modes"] == ["grad_hooks"] * 7 + ["hook"] * 7  # switched at the end of step 7
        assert f["bucket_calls"][:8] == [0] * 8 and min(f["bucket_calls"][8:]) >= 2
        assert f["calls"]["before_bucket"] == f["calls"]["after_bucket"]
        assert f["calls"]["wants_comm_hook"] == 3  # at start, after window 1, after window 2; then never
    run = fabricpace.load_run(out / "f")
    c = run.collectives.sort("rank", "seq")
    # One sequence across the switch: no gap, no repeat, the same (seq -> step) on every rank.
    for rank in range(WORLD):
        seqs = c.filter(pl.col("rank") == rank)["seq"].to_list()
        assert seqs == list(range(len(seqs)))
    assert c.group_by("seq").agg(pl.col("step").n_unique().alias("k"))["k"].max() == 1
    assert set(c["step"].to_list()) == set(range(2, 14))
    # Hook mode: every bucket's own completion; probe: one span per backward, arrival markers else.
    spans = c.group_by("rank", "step").agg((pl.col("t_exit_ns") > pl.col("t_enter_ns")).sum().alias("k"),
                                           pl.len().alias("n"))
    assert (spans.filter(pl.col("step") < 8)["k"] == 1).all()
    assert (spans.filter(pl.col("step") >= 8)["k"] == spans.filter(pl.col("step") >= 8)["n"]).all()
    assert run.manifest.extra["comm_hook_installed_after_step"] == 7
