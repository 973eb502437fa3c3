"""A straggler that starts or ends mid-run (onset.py) is named, with its steps, and priced over the run.

Simulated: 4 nodes x 8 GPUs, gpt-1.3b, 2% jitter, node 1 computing 30% slower over part of 300 steps.
Over the whole run it is late in too few steps for persistent_straggler; the change point finds its
steps, and persistent_straggler on those steps alone names node 1."""

from __future__ import annotations

import numpy as np
import pytest

from fabricpace import sim
from fabricpace.diagnose import diagnose
from fabricpace.diagnose.onset import change_point


def _run(tmp_path, name: str, slow: str):  # type: ignore[no-untyped-def]
    noise = tmp_path / f"{name}.yaml"
    noise.write_text(f"jitter: {{cv: 0.02}}\n{slow}")
    return sim.simulate("roce-leaf-spine-2to1", "gpt-1.3b", noise, nodes=4, steps=300, seed=2,
                        out_dir=tmp_path / name)


def _straggler(run):  # type: ignore[no-untyped-def]
    d = diagnose([run])
    return d, next((f for f in d.findings if f.mode == "persistent_straggler"), None)


def test_a_node_that_turns_slow_is_named_from_its_onset(tmp_path):  # type: ignore[no-untyped-def]
    d, f = _straggler(_run(tmp_path, "starts", "slow:\n  - {node: 1, factor: 1.3, from_step: 180}\n"))
    assert f is not None and f.culprits.nodes == [1]
    assert f.evidence["onset"]["kind"] == "starts"
    assert abs(f.evidence["onset"]["step"] - 180) <= 2
    assert f.evidence["step_window"][1] == 299
    share = f.evidence["onset"]["share_of_run"]
    assert 0.3 < share < 0.55  # 120 of 280 steps, the slow ones longer
    assert "--steps" in f.recommendation and "From step" in f.recommendation
    # the loss is the straggler's, not spread-out noise's
    assert not any(x.mode == "sync_amplification" for x in d.findings)


def test_a_node_that_recovers_is_named_until_it_does(tmp_path):  # type: ignore[no-untyped-def]
    _, f = _straggler(_run(tmp_path, "ends", "slow:\n  - {node: 2, factor: 1.3, to_step: 120}\n"))
    assert f is not None and f.culprits.nodes == [2]
    assert f.evidence["onset"]["kind"] == "ends"
    assert abs(f.evidence["onset"]["step"] - 120) <= 2


def test_a_healthy_run_and_a_whole_run_straggler_have_no_onset(tmp_path):  # type: ignore[no-untyped-def]
    d, f = _straggler(_run(tmp_path, "healthy", ""))
    assert f is None and d.runs[0].verdict == "healthy"
    _, f = _straggler(_run(tmp_path, "whole", "slow:\n  - {node: 3, factor: 1.3}\n"))
    assert f is not None and f.culprits.nodes == [3] and "onset" not in f.evidence


def test_a_short_burst_is_not_an_onset(tmp_path):  # type: ignore[no-untyped-def]
    # 10 slow steps: fewer than onset_min_steps (one_off.py's business, not a straggler)
    burst = "slow:\n  - {node: 1, factor: 1.3, from_step: 150, to_step: 160}\n"
    _, f = _straggler(_run(tmp_path, "burst", burst))
    assert f is None or "onset" not in f.evidence


def test_change_point_on_a_step_change():  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    e = rng.normal(0, 1, (16, 400))
    e[5, 260:] += 3.0
    row, split, score = change_point(e)
    assert row == 5 and abs(split - 260) <= 2 and score > 5
    _, _, quiet = change_point(rng.normal(0, 1, (16, 400)))  # type: ignore[misc]
    assert quiet < 2.5
    assert change_point(np.zeros((4, 1))) is None


@pytest.mark.parametrize("factor", [1.3])
def test_to_step_is_inclusive_enough(tmp_path, factor):  # type: ignore[no-untyped-def]
    # a straggler of the last 40 steps (> onset_min_steps): still found, priced at its small share
    _, f = _straggler(_run(tmp_path, "late", f"slow:\n  - {{node: 0, factor: {factor}, from_step: 260}}\n"))
    assert f is not None and f.culprits.nodes == [0]
    assert f.evidence["onset"]["share_of_run"] < 0.2
