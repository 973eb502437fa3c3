"""Audit 21: a first move's probe that meets a gap of a straggler that comes and goes is repeated before
the straggler is called gone (PacingConfig.rebalance_gap_duty), on the simulator with the real controller."""

from __future__ import annotations

import polars as pl
import yaml

from fabricpace.pacing.config import PacingConfig
from fabricpace.pacing.controller import Controller
from fabricpace.run import load_run
from fabricpace.sim import SimOptions, simulate

STEPS, WINDOW, NODES = 300, 20, 4


def _flicker(tmp_path):  # type: ignore[no-untyped-def]
    # node 2 1.4x slow for 15 of every 20 steps from step 50, the window 20 steps (in phase with it):
    # the first probe (steps 85-89) falls exactly into a 5-step gap (scenarios_unseen3/c02)
    slow = [{"node": 2, "factor": 1.4, "from_step": a, "to_step": min(a + 15, STEPS)}
            for a in range(50, STEPS, 20)]
    path = tmp_path / "noise.yaml"
    path.write_text(yaml.safe_dump({"jitter": {"cv": 0.02}, "slow": slow}))
    return path


def _run(tmp_path, name, noise, config):  # type: ignore[no-untyped-def]
    ctl = None if config is None else Controller(NODES * 8, config, "auto")
    run = load_run(simulate("dgx-h100-ib", "gpt-1.3b", noise, nodes=NODES, steps=STEPS, seed=1,
                            out_dir=tmp_path / name, controller=ctl, options=SimOptions(window=WINDOW)))
    s = run.steps.group_by("step").agg(pl.col("t_end_ns").max(), pl.col("t_start_ns").min()).sort("step")
    span = float(s["t_end_ns"][-1] - s["t_start_ns"][0])
    return span, run.pacing


def test_a_probe_in_a_gap_is_repeated_and_the_move_kept(tmp_path):
    noise = _flicker(tmp_path)
    base, _ = _run(tmp_path, "base", noise, None)
    paced, log = _run(tmp_path, "paced", noise, PacingConfig())
    old, old_log = _run(tmp_path, "old", noise, PacingConfig(rebalance_gap_duty=0.0))
    reasons = log["reason"].to_list()
    assert any("probing 5 steps more before calling it gone" in r for r in reasons), reasons
    assert "keep" in log.filter(pl.col("policy") == "guard")["action"].to_list()
    assert paced < 0.97 * base  # the move is kept: faster by several percent
    # without the repeat the probe in the gap reverted the move for good: slower than no pacing
    assert "keep" not in old_log.filter(pl.col("policy") == "guard")["action"].to_list()
    assert old > base
