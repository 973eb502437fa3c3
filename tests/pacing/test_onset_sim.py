"""A straggler that appears mid-run, in the simulator with the real controller (audit 17, finding 1)."""

from __future__ import annotations

import polars as pl

from fabricpace.pacing import Controller


def test_a_straggler_that_appears_after_three_healthy_windows_is_kept_on_its_probe(tmp_path):
    """Node 1 3x slower from step 200: the jump into the fault was the fourth change between untreated
    windows and, counted as host drift, kept the -50% move from ever being kept (its CI +-66% after 6
    pairs). A level that moved once and stayed is not drift: the move is kept on its probe."""
    from fabricpace.sim import simulate

    noise = tmp_path / "noise.yaml"
    noise.write_text("jitter: {cv: 0.02}\nslow:\n  - {node: 1, factor: 3.0, from_step: 200}\n")
    run = simulate("dgx-h100-ib", "gpt-1.3b", noise, nodes=2, steps=300, seed=1, out_dir=tmp_path / "run",
                   controller=Controller(16, policies=("rebalance",)))
    d = pl.read_parquet(run / "pacing.parquet")
    keep = d.filter((pl.col("policy") == "guard") & (pl.col("action") == "keep"))
    assert keep.height >= 1 and int(keep["step"][0]) <= 270, d.select("step", "action", "reason").rows()
    assert "rebalance kept" in keep["reason"][0]
