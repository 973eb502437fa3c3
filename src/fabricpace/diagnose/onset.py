"""A straggler that starts (or ends) mid-run: found on the steps where it is slow, priced over the run.

persistent_straggler asks whether a rank is late in most steps *of the run*. A node that turns 30%
slower at step 250 of 400 is late in every step after that and in none before: over the whole run it
is the last arriver in under 40% of the steps, below the detector's consistency, and the run read as
spread-out lateness (sync_amplification, no culprit) although each step after the onset waited for the
same node.

The change point is found on the culprit scan's per-rank excess lateness (lateness minus the other
ranks' median): for every rank the CUSUM of its centred excess, and the step where its absolute value
peaks splits the run (the classic single change-point estimate; Page 1954). The rank whose peak, in
units of ``σ·√S``, is largest names the split; below ``onset_min_score`` there is no change to test.
The slow side of the split (the one with the larger mean excess) must hold at least
``onset_min_steps`` steps, and persistent_straggler, run with its own thresholds on those steps alone,
must name a culprit there: the split only chooses where to look, the detector decides. The finding
keeps that detector's evidence, adds the steps and the onset, and prices the saving over the whole run
(the segment's saving times its share of the run's time), so a straggler of a tenth of the run does not
read as a whole-run one.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fabricpace.diagnose import persistent_straggler
from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.culprits import CulpritScan, scan
from fabricpace.diagnose.findings import Finding
from fabricpace.diagnose.metrics import RunMetrics


def slice_steps(m: RunMetrics, cols: np.ndarray) -> RunMetrics:
    """``m`` restricted to the step columns ``cols`` (indices, ascending): matrices, step ids and the
    collective instances of those steps. The cache is shared: what it holds is per instance, not per
    step range."""
    steps = m.steps[cols]

    def cut(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else a[..., cols]

    inst = m.instances
    if inst is not None and "step" in inst.columns:
        inst = inst.filter(inst["step"].is_in(steps.tolist()))
    return replace(
        m,
        steps=steps,
        step_time=m.step_time[cols],
        duration=m.duration[:, cols],
        components={k: v[:, cols] for k, v in m.components.items()},
        work=cut(m.work),
        lateness=cut(m.lateness),
        samples_per_step=cut(m.samples_per_step),
        samples=cut(m.samples),
        instances=inst,
        notes=[],
    )


def change_point(excess: np.ndarray) -> tuple[int, int, float] | None:
    """(row, split, score) of the strongest single change in a rank's excess lateness [R, S]: the run
    splits into columns ``[0, split)`` and ``[split, S)``; ``score`` is the peak |CUSUM| in units of
    ``σ·√S`` (about 1.36 at the 5% level for one series without a change). None without two steps."""
    e = np.where(np.isfinite(excess), excess, np.nan)
    n = e.shape[1] if e.ndim == 2 else 0
    if n < 2 or e.shape[0] == 0:
        return None
    centred = np.nan_to_num(e - np.nanmean(e, axis=1, keepdims=True), nan=0.0)
    cusum = np.abs(np.cumsum(centred, axis=1))[:, :-1]  # a split after column k, k < S - 1
    sd = np.nanstd(e, axis=1)
    with np.errstate(all="ignore"):
        score = cusum.max(axis=1) / (sd * np.sqrt(n))
    score = np.where(np.isfinite(score), score, 0.0)
    row = int(np.argmax(score))
    return row, int(np.argmax(cusum[row])) + 1, float(score[row])


def detect(m: RunMetrics, sc: CulpritScan, cfg: DiagnoseConfig) -> list[Finding]:
    """The persistent_straggler finding of the slow side of the run's strongest change point, priced
    over the whole run; empty when there is none (call it only when the whole run names no straggler)."""
    found = change_point(sc.excess)
    if found is None or found[2] < cfg.onset_min_score:
        return []
    row, split, score = found
    e = np.nan_to_num(sc.excess[row], nan=0.0)
    after = float(e[split:].mean()) > float(e[:split].mean())
    cols = np.arange(split, m.n_steps) if after else np.arange(0, split)
    if cols.size < max(cfg.onset_min_steps, cfg.min_steps) or cols.size == m.n_steps:
        return []
    seg = slice_steps(m, cols)
    seg_sc = scan(seg, seg.lateness, cfg) if seg.lateness is not None else None
    if seg_sc is None:
        return []
    out: list[Finding] = []
    total = float(np.nansum(m.step_time))
    share = float(np.nansum(seg.step_time)) / total if total > 0 else 0.0
    for f in persistent_straggler.detect(seg, seg_sc, cfg):
        if f.mode != "persistent_straggler":
            continue
        first, last = int(seg.steps[0]), int(seg.steps[-1])
        f.run = m.path
        f.severity_pct *= share
        f.what_if_saving_pct *= share
        if f.severity_ci_pct is not None:
            f.severity_ci_pct = (f.severity_ci_pct[0] * share, f.severity_ci_pct[1] * share)
        if f.severity_pct < 100 * cfg.straggler_min_saving:
            continue
        f.evidence["step_window"] = [first, last]
        f.evidence["onset"] = {
            "kind": "starts" if after else "ends",
            "step": first if after else last,
            "share_of_run": share,
            "cusum_score": score,
            "rank": int(m.ranks[row]),
        }
        when = f"from step {first} on" if after else f"until step {last}"
        f.recommendation = (
            f"{when.capitalize()} (steps {first}..{last}, {share:.0%} of the run's time): "
            f"{f.recommendation} `fabricpace diagnose RUN --steps {first}:{last}` diagnoses those steps "
            "alone."
        )
        out.append(f)
    return out
