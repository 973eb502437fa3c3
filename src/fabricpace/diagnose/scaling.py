"""Scaling analysis over several runs of one workload at different sizes: efficiency, and where the
lost time goes (own compute, data, skew wait, exposed communication) as the rank count grows.

Per run, per step: own work of the median rank (split into data and the rest), skew = slowest rank's
work minus the median rank's (what synchronization costs), exposed communication = step time minus the
slowest rank's work (transfer the computation did not hide). The four add up to the step time and none
is negative: where the slowest rank's work exceeds the step time (ranks that end their steps at
different times, as pipeline stages do) it is capped at the step, and the scaling notes say so.
Efficiency = per-rank throughput relative to the smallest run. The skew is set beside the iid-noise
model E[max of N] − median ≈ c_N·σ (REFERENCES.md) so growth beyond it points at something other than
random noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fabricpace.diagnose.metrics import RunMetrics
from fabricpace.diagnose.stats import expected_max_normal, nanmedian


def _row(m: RunMetrics) -> dict[str, Any]:
    t = m.step_time
    mean_t = float(np.nanmean(t))
    with np.errstate(all="ignore"):
        if m.work is not None:
            w = m.work
        elif m.lateness is not None:  # own work unknown: the arrival spread is the skew, the rest unknown
            w = m.lateness
        else:
            w = np.zeros_like(m.duration)
        med = nanmedian(w, axis=0)
        mx = np.nanmax(w, axis=0)
        data = nanmedian(m.components["data"], axis=0) if "data" in m.components else np.zeros_like(t)
        sigma = float(nanmedian(np.nanstd(w, axis=0)))
    over = 0
    if m.work is not None:
        # The split is of the step time (median over ranks). Where ranks end their steps at different
        # times (pipeline stages of an imported trace), the slowest rank's own work can exceed it: no
        # component may go negative, so the slowest and median work are capped at the step there
        # (exposed comm 0) and the row says in how many steps, and by how much.
        over = int(np.sum(mx > t))
        excess = float(np.nanmax(mx - t)) if over else 0.0
        mx, med = np.minimum(mx, t), np.minimum(med, t)
    skew = float(np.nanmean(mx - med))
    work_med = float(np.nanmean(med)) if m.work is not None else float("nan")
    data_ms = float(np.nanmean(np.minimum(data, med))) if m.work is not None else float(np.nanmean(data))
    exposed = float(np.nanmean(t - mx)) if m.work is not None else float("nan")
    samples = m.samples_per_step
    if samples is not None and np.nansum(samples) > 0:
        throughput = float(np.nansum(samples) / (np.nansum(t) / 1e9))
        unit = "samples/s"
    else:
        throughput = float(m.n_ranks * m.n_steps / (np.nansum(t) / 1e9))
        unit = "rank-steps/s"
    nodes = int(m.run.manifest.nodes or 0)
    return {
        "path": m.path,
        "world_size": m.n_ranks,
        "nodes": nodes,
        "steps": m.n_steps,
        "step_ms": mean_t / 1e6,
        "throughput": throughput,
        "throughput_unit": unit,
        "compute_ms": (work_med - data_ms) / 1e6,
        "data_ms": data_ms / 1e6,
        "skew_ms": skew / 1e6,
        "exposed_comm_ms": exposed / 1e6,
        "skew_share": skew / mean_t,
        "exposed_comm_share": exposed / mean_t,
        "iid_model_skew_ms": expected_max_normal(m.n_ranks) * sigma / 1e6,
        "work_over_step_steps": over,
        "work_over_step_max_ms": excess / 1e6 if over else 0.0,
    }


# Sources whose "steps" are the message sizes of a size sweep (the engine notes them per run, and the
# report keeps them out of its step-time curve: report/data.py SIZE_SWEEP_SOURCES).
SWEEP_SOURCES = ("import:nccl-tests",)
SWEEP_LEFT_OUT = "nccl-tests size sweep: one step per message size, not a training run"


def analyse(
    metrics: list[RunMetrics], left_out: dict[str, str] | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """(scaling dict, or None with the reason). ``left_out``: path -> why, for runs the diagnosis
    abstained on entirely (too few steps…): their numbers are not trusted for the comparison either.

    No dominant loss unless a component grew from the smallest to the largest run, and no efficiency
    across runs of different workloads or throughput units (samples/s against rank-steps/s): an
    imported 2-rank trace and a 16-rank simulated run read "efficiency 1405%, dominant loss: data
    loading" with every component shrinking (audit).

    nccl-tests size sweeps are left out with ``SWEEP_LEFT_OUT``: their mean "step" is the mean over
    message sizes, and two 12-size all-reduce sweeps (2 and 4 nodes) read "efficiency at the largest
    size 67%" as if a training job had slowed down."""
    left_out = dict(left_out or {})
    for m in metrics:
        if m.run.manifest.source in SWEEP_SOURCES:
            left_out.setdefault(m.path, SWEEP_LEFT_OUT)
    usable = [m for m in metrics if m.n_steps > 0 and m.n_ranks > 0 and m.path not in left_out]
    sizes = {m.n_ranks for m in usable}
    skipped = [f"{Path(p).name} left out of the scaling analysis: {why}" for p, why in left_out.items()]
    if len(usable) < 2:
        return None, "scaling needs two or more usable runs" + (f" ({'; '.join(skipped)})" if skipped else "")
    if len(sizes) < 2:
        return None, "all runs have the same number of ranks; scaling needs different sizes"
    rows = sorted((_row(m) for m in usable), key=lambda r: (r["world_size"], r["path"]))
    base = rows[0]
    workloads = {repr(sorted((m.run.manifest.workload or {}).items())) for m in usable}
    units = {r["throughput_unit"] for r in rows}
    notes = list(skipped)
    comparable = True
    if len(workloads) > 1:
        notes.append(
            "runs have different manifest workloads: efficiency and the dominant loss are not computed "
            "(they compare one workload at several sizes)"
        )
        comparable = False
    if len(units) > 1:
        notes.append(
            "some runs lack samples: throughput mixes samples/s and rank-steps/s, so efficiency is not "
            "computed"
        )
        comparable = False
    per_rank0 = base["throughput"] / base["world_size"]
    for r in rows:
        r["efficiency"] = (
            (r["throughput"] / r["world_size"]) / per_rank0 if comparable and per_rank0 > 0 else None
        )
    last = rows[-1]
    growth = {
        k: last[k] - base[k]
        for k in ("compute_ms", "data_ms", "skew_ms", "exposed_comm_ms")
        if np.isfinite(last[k]) and np.isfinite(base[k])
    }
    grew = {k: v for k, v in growth.items() if v > 0}
    dominant = max(grew, key=lambda k: grew[k]) if grew and comparable else None
    if comparable and growth and not grew:
        notes.append("no component of the step grew from the smallest to the largest run: no dominant loss")
    for r in rows:
        if r["work_over_step_steps"]:
            notes.append(
                f"{Path(r['path']).name}: in {r['work_over_step_steps']} of {r['steps']} steps the slowest "
                f"rank's own work exceeds the step time (median over ranks) by up to "
                f"{r['work_over_step_max_ms']:.2f} ms — its ranks end their steps at different times, as "
                "pipeline stages do; skew wait is capped at the step and exposed comm shown as 0 there"
            )
    ratio = (last["skew_ms"] / last["iid_model_skew_ms"]) if last["iid_model_skew_ms"] > 0 else None
    return (
        {
            "rows": rows,
            "efficiency_at_largest": last["efficiency"],
            "step_time_growth_ms": last["step_ms"] - base["step_ms"],
            "growth_ms_by_component": growth,
            "dominant_loss": {
                "compute_ms": "compute",
                "data_ms": "data loading",
                "skew_ms": "skew wait",
                "exposed_comm_ms": "transfer (exposed communication)",
            }.get(dominant or ""),
            "skew_vs_iid_model_at_largest": ratio,
            "notes": notes,
            "left_out": left_out,  # path -> why that run is not a row
        },
        None,
    )
