"""Thresholds of the diagnosis, in one frozen keyword-only config (docs/diagnosis.md gives the reasons).

Every share is a fraction of the run's mean step time. The defaults are chosen so that a healthy run
(per-rank jitter of a few percent, as on a quiet cluster) never crosses them; see docs/diagnosis.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from fabricpace.run.reader import DEFAULT_CHUNK_ROWS


@dataclass(frozen=True, kw_only=True)
class DiagnoseConfig:
    """Tunables of every detector. Shares are fractions of mean step time."""

    # Data sufficiency.
    min_steps: int = 8  # usable steps (after warm-up) below which every mode abstains (see docs)
    warmup_steps: int | None = None  # None: min(20, max(1, steps // 10)) of the run's first steps
    # Only these steps (first, last; inclusive) of each run: a window of a long job, read alone (memory
    # and time grow with the steps read). None: all. The warm-up is dropped only where it falls inside.
    steps: tuple[int, int] | None = None
    min_rank_coverage: float = 0.5  # a step is used only when at least this share of ranks recorded it

    # Reading: the collectives table (one row per rank, collective and step) is streamed in chunks of
    # whole steps of about this many rows (~0.2 GB of memory per million rows, peak).
    chunk_rows: int = DEFAULT_CHUNK_ROWS

    # synchronization amplification: time the median rank waits for each step's slowest rank.
    sync_min_share: float = 0.05

    # persistent straggler: a rank slower than its peers in most steps, by a material amount.
    straggler_min_excess: float = 0.03  # median excess over the other ranks' median, share of step time
    straggler_consistency: float = 0.7  # share of steps in which the rank is slower than the others
    straggler_z: float = 5.0  # excess / standard error of its median
    straggler_last_enrichment: float = 1.5  # ... and the slowest rank in ≥ this / N of the steps
    # ... or one rank that is the slowest far more often than 1/N, and costs a material amount.
    straggler_last_z: float = 4.5  # binomial z of the last-arriver count against 1/N
    straggler_min_saving: float = 0.02  # what-if saving (this rank alone; all culprits for the finding)
    # ... or one rank whose *mean* excess (pauses included) is far above the other ranks' (z against its
    # own spread): rare long pauses that make it the slowest in too few steps for the binomial test.
    straggler_mean_z: float = 5.0
    # ... or, when pacing moved samples away from it (so it is no longer late), one rank whose own
    # compute per sample is ≥ this × the other ranks' (median over steps; docs/diagnosis.md) ...
    per_sample_min_ratio: float = 1.5
    # ... and that processes at least this share fewer samples than its peers (a move happened).
    per_sample_min_moved: float = 0.1
    # ... or a straggler that starts or ends mid-run (onset.py): the strongest change in a rank's excess
    # lateness (peak |CUSUM| in σ·√S; ~1.4 is the 5% level of one series, 2.5 of a thousand) splits the
    # run, and the detector above must name a culprit on the slow side's steps alone, at least this many.
    onset_min_score: float = 3.0
    onset_min_steps: int = 20
    # The cause of a straggler's lateness is a step component only when that component's excess is at
    # least this share of the rank's mean lateness; else the lateness is "not explained".
    cause_min_share: float = 0.5

    # topology contention: transfer time above what the fabric delivered (or should deliver).
    contention_min_share: float = 0.05  # exposed excess transfer, share of step time
    contention_min_inflation: float = 1.2  # a collective counts as inflated above this × baseline
    contention_baseline_quantile: float = 0.10  # quiet baseline: this quantile of a collective's times
    contention_concentration: float = 0.7  # share of the excess that must sit on cross-leaf groups
    contention_runs_z: float = -4.0  # runs-test z below which inflated steps cluster in periods
    contention_min_period_steps: int = 5  # a period of foreign traffic spans at least this many steps

    # input stall: data-loader wait.
    input_min_share: float = 0.10  # fleet-wide data time, share of step time
    input_dominant_component: float = 0.5  # a culprit's excess is "data" when data is ≥ this share of it

    # stage imbalance: pipeline stages with unequal work.
    stage_min_excess: float = 0.10  # slowest stage's median work above the median stage, relative
    stage_min_saving: float = 0.03

    # One-off stalls (one_off.py): one or a few steps carrying most of a finding's loss are named as such
    # in its evidence and recommendation (a 45 s SIGSTOP of one rank read as amplified per-step noise).
    one_off_loss_share: float = 0.5  # the steps carry more than this share of the finding's loss ...
    one_off_max_step_share: float = 0.01  # ... and are at most this share of the steps (at least one) ...
    one_off_max_steps: int = 5  # ... and at most this many ...
    one_off_min_ratio: float = 10.0  # ... and each lost at least this × the mean of the other steps ...
    one_off_min_step_ratio: float = 5.0  # ... and at least this × the median step time

    # Confidence: block bootstrap over steps.
    bootstrap_resamples: int = 200
    bootstrap_block: int = 10
    seed: int = 0
