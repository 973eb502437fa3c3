"""Fixes for the observer audit 15 (findings 1, 3, 4 and 5, diagnose side), each pinned on a real run.

Recorded runs (``data/real``, compacted from the audit's run directories: manifest, ranks, steps,
collectives; real gloo ranks on one host under the observer):

* ``audit15-pg-positional`` — 4 ranks, two DP subgroups {0,2} and {1,3}, ``dist.all_reduce(g, SUM, sub)``
  and ``dist.barrier(sub)`` with ``wrap_collectives=True``: the observer of that time recorded every row
  under group ``world``, so one ``(world, seq)`` joined collectives of both subgroups;
* ``audit15-pg-subgroups-slow3`` — the same loop with ``group=sub`` (groups ``1`` and ``2``), rank 3
  sleeping 5 ms per step before its all-reduces in group {1,3};
* ``audit15-accum-grad-hooks`` — 2 ranks, DDP in the default grad_hooks mode, gradient accumulation
  (k = 4), buckets of equal size (the last bucket the same size as three others);
* ``audit15-eval-ckpt`` — 2 ranks, DDP, an evaluation every 20 steps and a checkpoint every 50
  (rank 0 sleeps 0.5 s): 2.64 s of the 5.15 s loop is between steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from fabricpace.diagnose import diagnose, stats
from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic

REAL = Path(__file__).parent / "data" / "real"


def test_collectives_of_two_groups_under_one_name_are_left_out() -> None:
    """Finding 1: "persistent_straggler ranks 1, 3, severity 1042.1%, late by 138 ms/step" in a run whose
    steps take 8–17 ms. The two subgroups drifted apart under one (world, seq): in 1368 of 1400
    instances a rank left before another entered (by up to 932 ms), which no collective allows."""
    d = diagnose([REAL / "audit15-pg-positional"])
    assert not d.findings, [(f.mode, f.severity_pct) for f in d.findings]
    assert d.runs[0].verdict == "undecided"
    dropped = d.runs[0].metrics["dropped_groups"]
    assert [g["group"] for g in dropped] == ["world"]
    assert dropped[0]["early_exits"] >= 0.9 * dropped[0]["instances"] and dropped[0]["max_gap_ms"] > 500
    reasons = {a.mode: a.reason for a in d.abstained}
    for mode in ("persistent_straggler", "sync_amplification", "topology_contention"):
        assert "group 'world'" in reasons[mode] and "left before another entered" in reasons[mode]
        assert "no other collectives recorded" in reasons[mode]


def test_a_mislabelled_group_is_left_out_and_the_others_are_read(tmp_path) -> None:
    """The same fault beside sound collectives: two pipeline stages' data-parallel groups written under
    one name (stage 1 30% slower, so its buckets start after stage 0's finished) next to node-pair
    all-gathers. The mixed group is dropped with a warning; the pairs are still read."""
    run = write_synthetic(
        tmp_path / "mixed",
        SynthSpec(stages=2, slow_stage=1, stage_factor=1.3, pair_groups=True, steps=80),
    )
    for part in (run / "collectives").rglob("*.parquet"):
        df = pl.read_parquet(part)
        one = pl.col("group").cast(pl.String).replace({"dp0": "dp", "dp1": "dp"})
        df.with_columns(one).write_parquet(part)
    d = diagnose([run])
    s = d.runs[0]
    assert [g["group"] for g in s.metrics["dropped_groups"]] == ["dp"]
    assert s.warnings and "group 'dp' left out" in s.warnings[0]
    assert "reads the other collectives" in s.warnings[0]
    assert not any(a.mode in ("persistent_straggler", "sync_amplification") for a in d.abstained)
    assert s.metrics["collective_instances"] == 4 * 80  # the pair all-gathers only
    assert [f.mode for f in d.findings] == ["stage_imbalance"]


def test_no_severity_above_the_step_time_on_any_recorded_run() -> None:
    """Finding 1: a share of step time above 100% is never printed."""
    for run in sorted(REAL.iterdir()):
        for f in diagnose([run]).findings:
            assert 0 <= f.severity_pct <= 100, (run.name, f.mode, f.severity_pct)
            assert f.what_if_saving_pct <= 100


def test_whatif_cannot_save_more_than_the_waiting_ranks_were_blocked() -> None:
    """A step shortens by at most what the ranks that waited for the culprit were blocked in it, and by
    at most itself; on the healthy 2-rank run whose rank 0 starts its steps late (observer-race), 11 of
    72 steps have more lateness than rank 1 waited in them, and the evidence says so."""
    per_step = np.array([5.0, 50.0, 3.0, 30.0])
    wait = np.array([[9.0, 9.0, 9.0, 9.0], [2.0, 40.0, 1.0, np.nan]])  # row 0: the culprit
    step = np.array([20.0, 20.0, 20.0, 20.0])
    capped, cut = stats.cap_by_wait(per_step, wait, step, np.array([True, False]))
    assert capped.tolist() == [2.0, 20.0, 1.0, 20.0] and cut == 4
    f = next(f for f in diagnose([REAL / "observer-race"]).findings if f.mode == "persistent_straggler")
    assert f.evidence["whatif_bounded_steps"] > 0
    assert f.severity_pct < f.evidence["whatif_from_lateness_pct"] <= 100


def test_lateness_in_two_rank_subgroups_is_the_whole_gap() -> None:
    """Finding 4: rank 3 sleeps 5 ms per step in its 2-rank group {1,3} (its compute is 5.0 ms above
    rank 1's). The evidence read "late by 2.47 ms/step", "expected 25%" and cause_explains_share 2.08;
    the severity was 13.1% of a 14.8 ms step."""
    d = diagnose([REAL / "audit15-pg-subgroups-slow3"])
    f = next(f for f in d.findings if f.mode == "persistent_straggler")
    ev = f.evidence
    assert f.culprits.ranks == [3]
    assert 4.5 <= ev["median_lateness_ms"] <= 5.5 and 4.5 <= ev["mean_lateness_ms"] <= 5.5
    assert ev["last_arriver_share_expected"] == 0.5 and ev["last_arriver_share"] > 0.9
    assert ev["compared_with_ranks"] == [1, 3]
    assert ev["cause"] == "slower own compute" and 0.9 <= ev["cause_explains_share"] <= 1.0
    assert 4.5 <= ev["component_excess_ms"]["compute"] <= 5.5
    # the job loses ~5 ms of a ~15 ms step while rank 1 waits for rank 3
    assert 25 <= f.severity_pct <= 45


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


def test_wall_time_outside_steps_is_reported(recorded, cli) -> None:
    """Finding 5: 2.64 s of the 5.15 s loop was evaluation and checkpoints between steps; diagnose
    never said so. The JSON has the share and the text a warning under the run's line."""
    d = diagnose([REAL / "audit15-eval-ckpt"])
    m = d.runs[0].metrics
    assert 0.45 <= m["out_of_step_share"] <= 0.6 and 4.5 <= m["wall_s"] <= 5.5
    assert "lies outside steps" in d.runs[0].warnings[0]
    quiet = diagnose([REAL / "audit15-accum-grad-hooks"])
    assert quiet.runs[0].metrics["out_of_step_share"] < 0.05
    assert not any("outside steps" in w for w in quiet.runs[0].warnings)
    run = recorded("audit15-eval-ckpt")
    text = cli("diagnose", str(run))
    assert text.returncode == 0, text.stderr
    assert "warning: 53% of wall time" in " ".join(text.stdout.split()) and "outside steps" in text.stdout
    out = cli("diagnose", str(run), "--format", "json")
    assert json.loads(out.stdout)["runs"][0]["metrics"]["out_of_step_share"] > 0.45
