"""Abstention: when the data cannot decide, the diagnosis says why instead of guessing."""

from __future__ import annotations

import shutil

from fabricpace.diagnose import diagnose
from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic

BASE = dict(ranks=8, gpus_per_node=4, steps=100)


def _modes(d):
    return {a.mode: a.reason for a in d.abstained}


def test_no_collectives(tmp_path):
    run = write_synthetic(tmp_path / "r", SynthSpec(**BASE, slow_ranks=(2,), slow_factor=1.3))
    shutil.rmtree(run / "collectives")
    d = diagnose([run])
    ab = _modes(d)
    assert {"sync_amplification", "persistent_straggler", "topology_contention"} <= set(ab)
    assert "no collectives" in ab["persistent_straggler"]
    assert d.findings == [] and not d.healthy and d.runs[0].verdict == "undecided"


def test_one_rank(tmp_path):
    run = write_synthetic(tmp_path / "r", SynthSpec(**{**BASE, "ranks": 1, "gpus_per_node": 1}))
    d = diagnose([run])
    assert "one rank" in _modes(d)["persistent_straggler"]
    assert not d.healthy


def test_one_rank_input_stall_is_still_found(tmp_path):
    run = write_synthetic(
        tmp_path / "r", SynthSpec(**{**BASE, "ranks": 1, "gpus_per_node": 1, "data_ms": 30})
    )
    d = diagnose([run])
    assert [f.mode for f in d.findings] == ["input_stall"]


def test_too_few_steps(tmp_path):
    run = write_synthetic(tmp_path / "r", SynthSpec(**{**BASE, "steps": 8}, slow_ranks=(1,), slow_factor=1.5))
    d = diagnose([run])
    assert d.findings == []
    assert "usable steps" in _modes(d)["all"]


def test_skew_below_clock_uncertainty(tmp_path):
    # ~1 ms of skew per step, but each clock is only known to ±5 ms.
    run = write_synthetic(tmp_path / "r", SynthSpec(**BASE, clock_err_ns=5_000_000))
    d = diagnose([run])
    ab = _modes(d)
    assert (
        "clock uncertainty" in ab["sync_amplification"] and "clock uncertainty" in ab["persistent_straggler"]
    )
    assert d.findings == [] and not d.healthy


def test_skew_below_small_clock_uncertainty_is_still_decided(tmp_path):
    # Skew and clock error both tiny against the step: no threshold can be reached, so healthy.
    run = write_synthetic(tmp_path / "r", SynthSpec(**BASE, jitter=0.0005, clock_err_ns=300_000))
    d = diagnose([run])
    assert d.healthy, d.to_dict()
    assert any("clock uncertainty" in n for n in d.runs[0].metrics["notes"])


def test_missing_rank_chunks_still_diagnose(tmp_path):
    run = write_synthetic(tmp_path / "r", SynthSpec(**BASE, slow_ranks=(6,), slow_factor=1.2))
    d = diagnose([run])
    assert d.findings[0].culprits.ranks == [6]
