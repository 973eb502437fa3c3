"""Fixes for the observer audit 15 (finding 3, diagnose side), each pinned on a real run.

Recorded runs (``data/real``, compacted from the audit's run directories: manifest, ranks, steps,
collectives; real gloo ranks on one host under the observer):

* ``audit15-accum-grad-hooks`` — 2 ranks, DDP in the default grad_hooks mode, gradient accumulation
  (k = 4), buckets of equal size (the last bucket the same size as three others).
"""

from __future__ import annotations

from pathlib import Path

from fabricpace.diagnose import diagnose

REAL = Path(__file__).parent / "data" / "real"


def test_grad_hooks_arrival_markers_stay_out_of_the_quiet_baseline() -> None:
    """Finding 3: "cannot tell topology_contention: too few instances of each collective shape for a
    quiet baseline (need 10)" on a run with 796 instances, 199 of them with a real transfer: the
    markers' transfer (0) was the 10th percentile of the shape the last bucket shares with them."""
    d = diagnose([REAL / "audit15-accum-grad-hooks"])
    assert not any(a.mode == "topology_contention" for a in d.abstained), d.abstained
    m = d.runs[0].metrics
    assert m["arrival_marker_instances"] == 3 * 180  # 4 buckets per step, 180 steps after warm-up
    assert "transfer_excess_share_of_step" in m


def test_contention_abstains_with_the_true_reason() -> None:
    """When it still cannot judge, the reason says what there is: 8 completions of one shape (the
    markers left out), not "too few instances" of a run that has 16."""
    d = diagnose([REAL / "observer-short10"])
    reason = next(a.reason for a in d.abstained if a.mode == "topology_contention")
    assert "need 10; 8 instances with a completion" in reason and "arrival markers" in reason
    assert "at most 8 of one shape" in reason
