"""Diagnoses that real gloo ranks showed wrong (session 9, benchmarks/diagnose_real.py), pinned on run
directories recorded from those real runs (4 ranks on this 2-core machine, 240 steps, observer on;
compacted to manifest, ranks, steps and collectives) and on synthetic twins with exact faults.

Recorded runs (``data/real``): ``pause-rank3`` — rank 3 slept 40 ms every 3–9 steps (a host pause);
``healthy`` — nothing injected (4 ranks on 2 shared cores: the run-queue skew measured beside it was
~20% of step time, so a sync_amplification finding there is the machine's truth, not an error);
``demo-throttled-rank2-load`` — the demo's own local run (``fabricpace lab run --backend local`` on
local-noisy.yaml: GC pressure on all 4 ranks, rank 2 under a 0.08-CPU quota) under background load;
``two-slow-ranks-load`` — ranks 1 and 3 slept 10 ms in every step, with 3 spinning processes beside.
"""

from __future__ import annotations

from pathlib import Path

from fabricpace.diagnose import diagnose

DATA = Path(__file__).parent / "data" / "real"



def _modes(d) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
    return {f.mode: f.culprits.ranks for f in d.findings}


def test_real_host_pauses_on_one_rank_name_that_rank(recorded, cli):
    # Until session 9 this run read "sync_amplification, no culprit" (33% of step time): rank 3 was the
    # slowest in only 43% of steps, below the 2/N count the intermittent rule asked for, although
    # replacing it alone by its peers saves ~21%. Through the real CLI, as a user runs it.
    import json

    run = recorded("pause-rank3")
    r = cli("diagnose", str(run), "--format", "json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    found = {f["mode"]: f for f in d["findings"]}
    assert "persistent_straggler" in found, d["findings"]
    f = found["persistent_straggler"]
    assert f["culprits"]["ranks"] == [3]
    assert f["evidence"]["cause"] == "slower own compute"  # a sleep outside the data phase
    assert f["what_if_saving_pct"] > 10


def test_real_healthy_run_names_no_rank():
    d = diagnose([DATA / "healthy"])
    named = {m: r for m, r in _modes(d).items() if m != "sync_amplification"}
    assert named == {}, [f.to_dict() for f in d.findings]
    assert all(not f.culprits.ranks for f in d.findings)


def test_rare_long_pauses_on_one_rank_are_a_straggler(synth):
    # 1 step in 10 rank 5 pauses ~80 ms (a whole step): the slowest in ~21% of 8 ranks' steps (2/N =
    # 25%), so only its mean excess — not its last-arriver count — shows it. Before: sync_amplification.
    run = synth("rare-pauses-r5", ranks=8, steps=400, gc_ranks=(5,), gc_prob=0.1, gc_ms=80, jitter=0.03)
    d = diagnose([run])
    assert _modes(d).get("persistent_straggler") == [5], [f.to_dict() for f in d.findings]
    assert "sync_amplification" not in _modes(d)


def test_rare_long_pauses_on_every_rank_stay_sync_amplification(synth):
    # The same heavy tail on all ranks: nobody's mean stands out, no culprit (mean-excess route guard).
    run = synth("rare-pauses-all", ranks=16, steps=400, gc_prob=0.02, gc_ms=200, jitter=0.03)
    d = diagnose([run])
    assert set(_modes(d)) == {"sync_amplification"}, [f.to_dict() for f in d.findings]
    assert _modes(d)["sync_amplification"] == []


def test_demo_under_load_says_which_rank_the_amplified_gc_noise_comes_from():
    # The demo's straggler "hidden by GC" (session 8's note): every rank pauses ~250 ms per step for GC,
    # the throttled rank 2 ~540 ms; in 108 usable steps it is the slowest in only 31% of steps, so no
    # straggler rule can name it. The sync_amplification finding is true, and now says that rank 2 alone
    # accounts for about a third of step time, ~2.5x the next rank (before: no rank mentioned at all).
    d = diagnose([DATA / "demo-throttled-rank2-load"])
    sync = next(f for f in d.findings if f.mode == "sync_amplification")
    lead = sync.evidence["largest_single_rank_saving"]
    assert lead["rank"] == 2
    assert lead["saving_pct"] >= 2 * lead["next_pct"]
    assert "rank 2 alone accounts for" in sync.recommendation
    assert sync.evidence["variation_made_of"]["gc"] > 0.5


def test_a_second_slow_rank_behind_a_slower_one_is_named_too():
    # Rank 3 is late by ~15% of the step in 81% of steps (z 13) but the slowest in only 28% of them:
    # rank 1, slower still under this load, takes the role (62%). Before: only rank 1 was named, although
    # replacing rank 1 alone leaves the job waiting for rank 3.
    d = diagnose([DATA / "two-slow-ranks-load"])
    f = next(f for f in d.findings if f.mode == "persistent_straggler")
    assert f.culprits.ranks == [1, 3]
    assert f.evidence["cause"] == "slower own compute"


def test_a_rank_that_left_early_gives_no_numpy_warnings(recorded):
    """Derived from the recorded healthy run: rank 3 stops recording at step 200 of 240, as a rank
    whose inputs ran out under DDP Join does (U10's real loop). The diagnosis skips the empty cells;
    numpy's All-NaN / degrees-of-freedom RuntimeWarnings used to reach the user's terminal."""
    import warnings

    import polars as pl

    run = recorded("healthy")
    for table, step_col in (("steps", "step"), ("collectives", "step")):
        parts = sorted((run / table).rglob("*.parquet"))
        assert parts
        for part in parts:
            df = pl.read_parquet(part)
            df.filter(~((pl.col("rank") == 3) & (pl.col(step_col) >= 200))).write_parquet(part)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        d = diagnose(run)
    assert d.runs[0].steps_used > 150
