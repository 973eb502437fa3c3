"""``diagnose()``: load runs, build metrics, run every detector, abstain where the data cannot decide,
and add the scaling analysis when runs of several sizes are given. Writes nothing (the CLI does)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from fabricpace._errors import InputError
from fabricpace.diagnose import (
    input_stall,
    one_off,
    onset,
    per_sample,
    persistent_straggler,
    scaling,
    stage_imbalance,
    sync_amplification,
    topology_contention,
)
from fabricpace.diagnose.config import DiagnoseConfig
from fabricpace.diagnose.culprits import CulpritScan, scan
from fabricpace.diagnose.findings import Abstention, Diagnosis, Finding, RunSummary
from fabricpace.diagnose.metrics import RunMetrics, build_metrics
from fabricpace.diagnose.stats import named, nanmedian, robust_cv, sample_size_confidence, whatif_saving
from fabricpace.run.reader import StepChunks, load_run
from fabricpace.run.schema import COLLECTIVE_COLUMNS, TABLES

_ARRIVAL_MODES = ("sync_amplification", "persistent_straggler")


def _n(k: int, noun: str) -> str:
    """'1 warm-up step', '5 usable steps'."""
    return f"{k} {noun}" if k == 1 else f"{k} {noun}s"


def _load_cluster(cluster: Any) -> Any:
    if cluster is None or not isinstance(cluster, str | os.PathLike):
        return cluster
    from fabricpace.fabric import load_cluster

    return load_cluster(Path(cluster))


def _clock_check(m: RunMetrics, step_skew: np.ndarray, cfg: DiagnoseConfig) -> str | None:
    """Reason to abstain from arrival-based modes, or None. Skew below the clock uncertainty cannot
    name who was last; it only matters when skew + uncertainty could still reach a threshold."""
    unc = m.clock_uncertainty_ns
    if m.arrival_basis != "aligned clocks" or not unc:
        return None
    typical = float(np.median(step_skew)) if step_skew.size else 0.0
    if typical >= unc:
        return None
    bound = (float(np.mean(step_skew)) + unc) / m.mean_step_ns
    if bound < min(cfg.sync_min_share, cfg.straggler_min_excess):
        m.notes.append(
            f"arrival skew (median {typical / 1e3:.1f} µs) is below the clock uncertainty "
            f"({unc / 1e3:.1f} µs), "
            f"but even skew + uncertainty is only {bound:.1%} of step time: no material skew"
        )
        return None
    return (
        f"arrival skew (median {typical / 1e3:.1f} µs per step) is below the clock uncertainty "
        f"({unc / 1e3:.1f} µs from ranks.clock_err_ns): cannot tell which rank arrived last"
    )


def _cpu_reduces(man: Any) -> bool:
    """Whether the run's collectives reduce on the CPU, where a rank slow at its own work slows the
    transfer itself: a gloo process group (the observer records it; the lab always runs gloo). NCCL
    runs, the simulator and imported GPU traces reduce on the GPU (audit 17 review: the rule that lets
    a named straggler explain a uniform transfer excess must not hide an NCCL fabric problem)."""
    backend = man.extra.get("process_group_backend")
    if backend:
        return "gloo" in str(backend) and "nccl" not in str(backend)
    return man.source in ("lab", "local", "observer")  # recorded before the field: gloo unless told


def _late_but_unnamed(m: RunMetrics, sc: CulpritScan, cfg: DiagnoseConfig) -> str | None:
    """Why persistent_straggler is undecided when ranks are consistently late by a material amount (and
    replacing them all would save ≥ straggler_min_saving) but no straggler was named — e.g. half the
    ranks or more (the rule names a minority). Before, such a run read "healthy" (the audit's 2-node
    run with node 1 10% slow); healthy must mean decided."""
    late = sc.consistently_late
    if late is None or not late.any():
        return None
    saving, _ = whatif_saving(sc.centred, late, m.step_time, m.sets)
    if saving < cfg.straggler_min_saving:
        return None
    ranks = [int(v) for v in m.ranks[late]]
    whole = persistent_straggler.whole_nodes(m, ranks)
    where = named("rank", ranks, limit=6)
    if whole:
        where += f" ({named('node', whole)})"
    return (
        f"{where}, {len(ranks)} of {m.n_ranks} ranks, arrive late by ≥ {cfg.straggler_min_excess:.0%} of the "
        f"step in ≥ {cfg.straggler_consistency:.0%} of steps (replacing them would save {saving:.1%}), but "
        "half the ranks or more, or rarely the last: cannot tell whether they are slow or the others fast "
        "(run longer, or compare with a run without them)"
    )


def _note_left_out(
    m: RunMetrics, sc: CulpritScan, findings: list[Finding], metrics: dict[str, Any], cfg: DiagnoseConfig
) -> None:
    """Culprits of the scan that no finding names (below the straggler's saving threshold) are still
    left out of sync_amplification's loss: say who, and why they are not reported, in the run's
    metrics (``left_out_culprits``) and notes and in the sync finding's evidence."""
    named_ranks = {
        r for f in findings if f.mode in ("persistent_straggler", "input_stall") for r in f.culprits.ranks
    }
    # Ranks a finding names as late only through a pipeline peer (persistent_straggler.downstream).
    named_ranks |= {
        int(r) for f in findings if f.run == m.path for r in (f.evidence.get("downstream_ranks") or {})
    }
    out = persistent_straggler.left_out(m, sc, named_ranks, cfg)
    if out is None:
        return
    metrics["left_out_culprits"] = out
    m.notes.append(out["note"])
    for f in findings:
        if f.mode == "sync_amplification" and f.run == m.path:
            f.evidence["left_out_of_loss"] = out["note"]


_SWEEP_SOURCES = scaling.SWEEP_SOURCES  # one step per message size: a description of the fabric


def _bytes(n: int) -> str:
    """1073741824 -> '1 GiB', 8 -> '8 B'."""
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def _size_sweep(m: RunMetrics) -> list[dict[str, Any]] | None:
    """Per step of an nccl-tests import (one step per message size): op, bytes, time (median over
    ranks) and algorithm bandwidth; None for any other source."""
    if m.run.manifest.source not in _SWEEP_SOURCES or m.instances is None or m.run.steps.height == 0:
        return None
    t0, t1 = pl.col("t_start_ns"), pl.col("t_end_ns")
    times = (
        m.run.steps.filter(t0.is_not_null() & t1.is_not_null())
        .group_by("step")
        .agg((t1 - t0).median().cast(pl.Float64).alias("ns"))
    )
    shape = m.instances.group_by("step").agg(pl.col("op").first(), pl.col("bytes").max())
    ok = pl.col("bytes").is_not_null() & (pl.col("ns") > 0)
    rows = shape.join(times, on="step").filter(ok).sort("step")
    return [
        {"step": int(st), "op": str(op), "bytes": int(b), "time_ms": ns / 1e6, "algbw_gbytes_s": b / ns}
        for st, op, b, ns in rows.select("step", "op", "bytes", "ns").iter_rows()
    ] or None


def _sweep_note(rows: list[dict[str, Any]]) -> str:
    """'nccl-tests size sweep …: all_reduce 8 B 0.030 ms, 1 KiB …, 1 GiB 6.346 ms (28 sizes …)'."""
    parts = []
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        keep = [
            r for i, r in enumerate(mine)
            if i in (0, len(mine) - 1) or any(r["bytes"] == 1 << k for k in (10, 20, 30))
        ]
        parts.append(f"{op} " + ", ".join(f"{_bytes(r['bytes'])} {r['time_ms']:.3f} ms" for r in keep))
    return (
        "nccl-tests size sweep: one step per message size, not a training run, so step-time statistics "
        f"are left out (they would describe the sizes): {'; '.join(parts)} ({_n(len(rows), 'size')}; "
        "metrics.size_sweep lists each)"
    )


def _headline(m: RunMetrics, cfg: DiagnoseConfig) -> dict[str, Any]:
    """The run's step time: mean, median, CV, and a spread one outlier step cannot make (robust CV
    = 1.4826·MAD/median, p95/p50); ``step_outliers`` when one or a few steps make the CV (one_off.py):
    a 45 s SIGSTOP in 1,980 steps of 10 ms read "step 33.16 ms (CV 30.538)"."""
    with np.errstate(all="ignore"):
        t = m.step_time
        p50 = float(nanmedian(t)) if t.size else float("nan")
        p95 = float(np.nanpercentile(t, 95)) if t.size and np.isfinite(t).any() else float("nan")
        out: dict[str, Any] = {
            "step_ms_mean": float(np.nanmean(t)) / 1e6 if t.size else None,
            "step_ms_median": p50 / 1e6 if t.size else None,
            "step_cv": float(np.nanstd(t) / np.nanmean(t)) if t.size else None,
            "step_cv_robust": robust_cv(t),
            "step_ms_p95": p95 / 1e6 if np.isfinite(p95) else None,
            "step_p95_over_p50": p95 / p50 if np.isfinite(p95) and p50 > 0 else None,
            "warmup_steps": m.warmup,
            **(
                {"step_window": [int(m.steps[0]), int(m.steps[-1])] if m.steps.size else None}
                if cfg.steps is not None
                else {}
            ),
            "arrival_basis": m.arrival_basis,
            "clock_uncertainty_us": (m.clock_uncertainty_ns / 1e3)
            if m.clock_uncertainty_ns is not None
            else None,
        }
        if m.instances is not None:
            out["collective_instances"] = int(m.instances.height)
        outliers = one_off.step_outliers(m, cfg) if m.n_steps else None
        if outliers:
            out["step_outliers"] = outliers
    out.update(_out_of_step(m))
    sweep = _size_sweep(m)
    if sweep:  # the spread of a size sweep is the sizes': "step 27 took 6.35 ms" read as a stall
        for k in ("step_ms_mean", "step_ms_median", "step_cv", "step_cv_robust", "step_ms_p95"):
            out[k] = None
        out["step_p95_over_p50"] = None
        out.pop("step_outliers", None)
        out["size_sweep"] = sweep
    return out


_OUT_OF_STEP_WARN = 0.10  # above this share of wall time outside steps, the run's warnings say so


def _out_of_step(m: RunMetrics) -> dict[str, float]:
    """Wall time outside steps: per rank, on its own clock, the gaps between consecutive step numbers
    from its first to its last used step (warm-up left out), against that time plus the time inside
    its steps; the median rank's share, wall time and time outside. Evaluation, checkpoints and logging
    between steps — or a rank waiting there for others — are in no step: an audit's run spent 2.64 s
    of 5.15 s there, and step-based numbers (severity, throughput per step) described only the other
    half without saying so. A gap in the step *numbers* is left out: those steps ran but were not
    recorded (a profiler schedule's wait/warm-up steps between its ``repeat`` cycles, a trace cut into
    windows), and "68% of wall time lies outside steps" on a 3-cycle Kineto import sent the user
    looking for an evaluation loop that did not exist (audit 16). Rows of one step number overlapping
    the previous one count 0 (never negative)."""
    st = m.run.steps
    if m.n_steps == 0 or st.height == 0 or not {"t_start_ns", "t_end_ns"} <= set(st.columns):
        return {}
    lo, hi = int(m.steps[0]), int(m.steps[-1])
    t0, t1 = pl.col("t_start_ns"), pl.col("t_end_ns")
    rows = (
        st.filter(pl.col("step").is_between(lo, hi) & t0.is_not_null() & t1.is_not_null())
        .select("rank", "step", t0.cast(pl.Int64), t1.cast(pl.Int64))
        .sort("rank", "step")
    )
    next_to = pl.col("step") == pl.col("step").shift(1).over("rank") + 1
    gap = (t0 - t1.shift(1).over("rank")).clip(lower_bound=0)
    per = (
        rows.with_columns(pl.when(next_to).then(gap).otherwise(0).fill_null(0).alias("gap"))
        .group_by("rank")
        .agg(
            (t1 - t0).clip(lower_bound=0).sum().cast(pl.Float64).alias("inside"),
            pl.col("gap").sum().cast(pl.Float64).alias("out"),
        )
        .with_columns((pl.col("inside") + pl.col("out")).alias("span"))
        .filter(pl.col("span") > 0)
    )
    if per.height == 0:
        return {}
    span = per["span"].to_numpy()
    out = per["out"].to_numpy()
    i = int(np.argsort(out / span)[(span.size - 1) // 2])  # the median rank (lower median: a real one)
    return {
        "out_of_step_share": float(out[i] / span[i]),
        "out_of_step_s": float(out[i]) / 1e9,
        "wall_s": float(span[i]) / 1e9,
    }


def diagnose_metrics(
    m: RunMetrics, cfg: DiagnoseConfig, cluster: Any = None
) -> tuple[list[Finding], list[Abstention], RunSummary]:
    """All detectors on one run's metrics."""
    findings: list[Finding] = []
    abstained: list[Abstention] = []
    metrics = _headline(m, cfg)
    not_applicable: list[str] = []

    def abstain(mode: str, reason: str) -> None:
        abstained.append(Abstention(run=m.path, mode=mode, reason=reason))

    if m.n_steps == 0 or m.n_ranks == 0:
        abstain("all", "no usable steps recorded (steps table empty or without t_start_ns/t_end_ns)")
    elif m.n_steps < cfg.min_steps:
        abstain(
            "all",
            f"only {_n(m.n_steps, 'usable step')} after {_n(m.warmup, 'warm-up step')}; need at least "
            f"{cfg.min_steps} (run longer)",
        )
    else:
        sc = None
        sc_sync: CulpritScan | None = None  # the culprits sync_amplification left out of its loss
        if m.n_ranks < 2:
            for mode in (*_ARRIVAL_MODES, "topology_contention"):
                abstain(mode, "one rank: nothing to synchronize with")
        elif m.lateness is None:
            lost = [w for w in m.run.warnings if "collectives" in w and "unreadable" in w]
            dropped = m.dropped_reason()
            cov = getattr(m.run, "coverage", None)
            left_out = [w for w in m.run.warnings if "collectives of every rank are left out" in w]
            if cov is not None and "collectives" in cov.dropped and left_out:
                # The reader left them out (a rank has none): they were recorded, just not comparable.
                no_coll = f"collectives left out: {left_out[0].split(': ', 1)[-1]}"
            elif lost:
                more = f" and {len(lost) - 1} more" if len(lost) > 1 else ""
                no_coll = f"collectives unreadable ({lost[0]}{more}): arrivals and transfer times unknown"
            elif dropped:
                no_coll = f"{dropped}; no other collectives recorded"
            else:
                no_coll = "no collectives recorded: arrivals and transfer times unknown"
            for mode in (*_ARRIVAL_MODES, "topology_contention"):
                abstain(mode, no_coll)
        else:
            sc = scan(m, m.lateness, cfg)
            reason = _clock_check(m, sc.step_skew, cfg)
            if reason:
                for mode in _ARRIVAL_MODES:
                    abstain(mode, reason)
                sc_for_modes = None
            else:
                sc_for_modes = sc
                f_strag = persistent_straggler.detect(m, sc, cfg, per_sample.scan(m, cfg))
                if not any(f.mode == "persistent_straggler" for f in f_strag):
                    f_strag += onset.detect(m, sc, cfg)  # one that starts or ends mid-run
                findings += f_strag
                # A straggler that pacing hid (named by compute per sample), or one of only part of the
                # run, is a persistent culprit too: the synchronization loss is what the other ranks'
                # noise costs.
                hidden = [
                    r for f in f_strag if {"route", "onset"} & set(f.evidence) for r in f.culprits.ranks
                ]
                sc_sync = replace(sc, culprit=sc.culprit | np.isin(m.ranks, hidden)) if hidden else sc
                f_sync, mm = sync_amplification.detect(m, sc_sync, cfg)
                findings += f_sync
                metrics.update(mm)
                why_late = _late_but_unnamed(m, sc, cfg) if not f_strag else None
                if why_late:
                    abstain("persistent_straggler", why_late)
            # The stragglers named above: a transfer excess that is uniform against the fabric model in
            # their groups is theirs to explain first where the CPU reduces (a CPU-starved gloo rank
            # slows the ring itself); a GPU's NCCL ring is not slowed by its host's compute.
            strag = {
                int(r): str(f.evidence.get("cause", "slower than its peers"))
                for f in findings if f.mode == "persistent_straggler" for r in f.culprits.ranks
            } if _cpu_reduces(m.run.manifest) else {}
            f_top, mm, why = topology_contention.detect(m, cfg, cluster, strag)
            findings += f_top
            metrics.update(mm)
            if why:
                abstain("topology_contention", why)
            sc = sc_for_modes
        f_in, mm = input_stall.detect(m, sc, cfg)
        findings += f_in
        metrics.update(mm)
        if sc_sync is not None:
            _note_left_out(m, sc_sync, findings, metrics, cfg)
        if "data" not in m.components and not any(f.mode == "input_stall" for f in findings):
            not_applicable.append(
                "input_stall: no data_ns recorded (data time unknown; only per-rank lateness could show it)"
            )
        f_st, mm, why = stage_imbalance.detect(m, cfg)
        findings += f_st
        metrics.update(mm)
        if why:
            not_applicable.append(f"stage_imbalance: {why}")
    for f in findings:  # a short run cannot be as sure as a long one, whatever its bootstrap says
        f.confidence = sample_size_confidence(f.confidence, m.n_steps, cfg)
    findings.sort(key=lambda f: -f.severity_pct)
    moves = per_sample.decisions(m.run.pacing)
    if moves:
        metrics["pacing_decisions"] = moves
    if findings:
        verdict = ", ".join(dict.fromkeys(f.mode for f in findings))
    elif abstained:
        verdict = "undecided"
    else:
        verdict = "healthy"
    man = m.run.manifest
    metrics["not_applicable"] = not_applicable
    metrics["notes"] = m.notes
    said: list[str] = []  # what the reader of any number above must know, first in the run's warnings
    if metrics.get("size_sweep"):
        metrics["step_cv"] = None  # sync_amplification's metrics give it again
        said.append(_sweep_note(metrics["size_sweep"]))
    if m.dropped_groups:
        metrics["dropped_groups"] = m.dropped_groups
        if m.lateness is not None:
            said.append(f"{m.dropped_reason()}; the diagnosis reads the other collectives")
    share = metrics.get("out_of_step_share")
    if share is not None and share > _OUT_OF_STEP_WARN:
        said.append(
            f"{share:.0%} of wall time ({metrics['out_of_step_s']:.1f} s of {metrics['wall_s']:.1f} s, "
            f"median rank) lies outside steps — work between steps (evaluation, checkpoints, logging) or "
            f"waiting there: step times, severities and per-step rates describe only the other "
            f"{1 - share:.0%}"
        )
    summary = RunSummary(
        path=m.path,
        run_id=man.run_id,
        source=man.source,
        world_size=int(man.world_size),
        nodes=int(man.nodes),
        steps_used=m.n_steps,
        verdict=verdict,
        metrics=metrics,
        warnings=[*said, *m.run.warnings],
    )
    return findings, abstained, summary


def _metrics(
    path: Path, cfg: DiagnoseConfig, chunk_progress: Callable[[str, int, int], None] | None
) -> RunMetrics:
    """One run's metrics: the small tables loaded whole, the collectives streamed."""
    run = load_run(path, tables=[t for t in TABLES if t != "collectives"], step_range=cfg.steps)
    chunks = StepChunks(
        path, "collectives", columns=COLLECTIVE_COLUMNS, categorical=True, coverage=run.coverage,
        step_range=cfg.steps,
    )
    name = str(path)

    def tick(done: int, total: int) -> None:
        if chunk_progress:
            chunk_progress(name, done, total)

    span = StepChunks(path, "steps", coverage=run.coverage).step_span if cfg.steps is not None else None
    m = build_metrics(run, cfg, collectives=chunks, progress=tick, run_span=span)
    run.warnings.extend(chunks.warnings)
    return m


def diagnose(
    run_dirs: Sequence[str | os.PathLike[str]] | str | os.PathLike[str],
    *,
    cluster: Any = None,
    config: DiagnoseConfig | None = None,
    progress: Callable[[str], None] | None = None,
    chunk_progress: Callable[[str, int, int], None] | None = None,
) -> Diagnosis:
    """Diagnose one or more run directories (several sizes of one workload add a scaling analysis).

    ``cluster``: a ``fabricpace.fabric.Cluster``, a preset name or a cluster file; transfer times are
    then judged against the fabric model instead of the run's own quiet baseline.
    ``progress(run)`` before each run; ``chunk_progress(run, done, total)`` after each chunk of its
    collectives table, which is streamed (``config.chunk_rows`` rows at a time) so that memory stays
    bounded whatever the size of the run.
    """
    if isinstance(run_dirs, str | os.PathLike):
        run_dirs = [run_dirs]
    paths = [Path(p) for p in run_dirs]
    if not paths:
        raise InputError("diagnose: no run directory given; pass one or more RUN_DIRs")
    cfg = config or DiagnoseConfig()
    cl = _load_cluster(cluster)
    findings: list[Finding] = []
    abstained: list[Abstention] = []
    runs: list[RunSummary] = []
    all_metrics: list[RunMetrics] = []
    for p in paths:
        if progress:
            progress(str(p))
        # Cells without data are NaN by design (a rank that left early under DDP Join, steps a rank
        # did not record) and every reduction skips them; numpy's "All-NaN slice" / "Degrees of
        # freedom" RuntimeWarnings about such columns reached the user's terminal as noise.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            m = _metrics(p, cfg, chunk_progress)
            f, a, s = diagnose_metrics(m, cfg, cl)
        findings += f
        abstained += a
        runs.append(s)
        all_metrics.append(m)
    scale = None
    if len(all_metrics) > 1:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            left_out = {a.run: a.reason for a in abstained if a.mode == "all"}
            scale, why = scaling.analyse(all_metrics, left_out)
        if why:
            abstained.append(Abstention(run="*", mode="scaling", reason=why))
        elif scale is not None:
            _annotate_sync(findings, scale)
    return Diagnosis(runs=runs, findings=findings, abstained=abstained, scaling=scale)


def _annotate_sync(findings: list[Finding], scale: dict[str, Any]) -> None:
    """Sync-amplification findings gain the skew's growth with N across the runs as evidence."""
    rows = {r["path"]: r for r in scale["rows"]}
    growth = [(r["world_size"], r["skew_share"]) for r in scale["rows"]]
    for f in findings:
        if f.mode == "sync_amplification" and f.run in rows:
            f.evidence["skew_share_by_world_size"] = growth
