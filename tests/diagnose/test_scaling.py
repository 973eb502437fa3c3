"""Scaling analysis across runs of one workload at several sizes."""

from __future__ import annotations

from fabricpace.diagnose import diagnose


def test_noise_amplification_shows_as_growing_skew(synth):
    runs = [
        synth(f"scale_gc_{n}", ranks=n, gpus_per_node=4, steps=100, gc_prob=0.05, gc_ms=20, jitter=0.02)
        for n in (4, 16, 64)
    ]
    d = diagnose(runs)
    s = d.scaling
    assert s is not None
    rows = s["rows"]
    assert [r["world_size"] for r in rows] == [4, 16, 64]
    assert rows[0]["efficiency"] == 1.0
    assert rows[0]["efficiency"] > rows[1]["efficiency"] > rows[2]["efficiency"]
    assert rows[0]["skew_ms"] < rows[1]["skew_ms"] < rows[2]["skew_ms"]
    assert s["dominant_loss"] == "skew wait"
    sync = [f for f in d.findings if f.mode == "sync_amplification"]
    assert sync and "skew_share_by_world_size" in sync[-1].evidence


def test_same_size_runs_abstain_from_scaling(synth):
    d = diagnose([synth("same_a", ranks=8, steps=60), synth("same_b", ranks=8, steps=60, seed=3)])
    assert d.scaling is None
    assert any(a.mode == "scaling" for a in d.abstained)
