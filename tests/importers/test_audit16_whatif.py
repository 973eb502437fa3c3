"""Audit 16 (What-if import): a pipeline trace in absolute time is kept as traced."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from fabricpace.importers.whatif import import_whatif
from fabricpace.run import load_run


def _gpipe(folder: Path, *, relative: bool = False, steps: int = 6) -> None:
    """What-if trace of dp 2 × pp 2 GPipe with 4 micro-batches, continuous absolute seconds (the audit's
    whatif/gen.py, smaller): stage 1 ends its backward first and starts step s+1 while stage 0 still
    finishes step s. ``relative``: every step's times restart at 0."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dp, pp, mbs, f, b, x = 2, 2, 4, 0.010, 0.020, 0.001
    rows: list[dict[str, object]] = []

    def add(d: int, s: int, step: int, op: str, t0: float, dur: float, seq: int = 0) -> None:
        rows.append(dict(dp_rank=d, stage=s, rank=s * dp + d, step=step, optype=op,
                         start_ts=t0 - (base[d, s] if relative else 0.0), duration=dur, seq_id=seq,
                         mc=0, gmc=0, mb_id=seq))

    t = {(d, s): 0.0 for d in range(dp) for s in range(pp)}
    for step in range(steps):
        base = dict(t)
        for d in range(dp):
            for m in range(mbs):
                for s in range(pp):
                    if s > 0:
                        end = max(t[d, s - 1], t[d, s]) + x
                        add(d, s - 1, step, "forward-send", t[d, s - 1], end - t[d, s - 1], m)
                        add(d, s, step, "forward-recv", t[d, s], end - t[d, s], m)
                        t[d, s - 1] = t[d, s] = end
                    add(d, s, step, "forward-compute", t[d, s], f, m)
                    t[d, s] += f
            for m in range(mbs):
                for s in reversed(range(pp)):
                    if s < pp - 1:
                        end = max(t[d, s + 1], t[d, s]) + x
                        add(d, s + 1, step, "backward-send", t[d, s + 1], end - t[d, s + 1], m)
                        add(d, s, step, "backward-recv", t[d, s], end - t[d, s], m)
                        t[d, s + 1] = t[d, s] = end
                    add(d, s, step, "backward-compute", t[d, s], b, m)
                    t[d, s] += b
        for s in range(pp):
            last = max(t[d, s] for d in range(dp))
            for d in range(dp):
                add(d, s, step, "grads-reduce-scatter", t[d, s], last + 0.003 - t[d, s])
                t[d, s] = last + 0.003
        for k in t:
            add(*k, step, "optimizer", t[k], 0.004)
            t[k] += 0.004
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), folder / "trace-job.parquet")
    (folder / "meta-job.yaml").write_text(
        "trial_name: job\ndp_size: 2\npp_size: 2\ntp_size: 1\ndsp_size: 1\nvpp_size: 1\nworld_size: 4\n"
    )


def test_whatif_pipeline_in_absolute_time_is_kept(tmp_path: Path) -> None:
    """Audit #3: a GPipe trace with continuous absolute timestamps was taken as 'time restarts every
    step' (stage 1 starts step s+1 before stage 0 ends step s) and re-laid with invented gaps (20 ms
    between 168 ms steps). Now a worker's own steps decide: they follow each other, so time is kept."""
    _gpipe(tmp_path / "src")
    run = load_run(import_whatif(tmp_path / "src", tmp_path / "run"))
    assert run.manifest.extra["steps_relative_time"] is False
    s = run.steps.sort("rank", "step")
    gaps = s.group_by("rank").agg((pl.col("t_start_ns").shift(-1) - pl.col("t_end_ns")).drop_nulls())
    assert all(np.all(np.asarray(g) == 0) for g in gaps["t_start_ns"].to_list())  # back to back, as traced
    # and steps of different workers do overlap: the case that misled the old test
    st0 = s.filter((pl.col("rank") == 0) & (pl.col("step") == 0))["t_end_ns"].item()
    st1 = s.filter((pl.col("rank") == 2) & (pl.col("step") == 1))["t_start_ns"].item()
    assert st1 < st0


def test_whatif_pipeline_in_relative_time_is_laid_out(tmp_path: Path) -> None:
    _gpipe(tmp_path / "src", relative=True)
    run = load_run(import_whatif(tmp_path / "src", tmp_path / "run"))
    assert run.manifest.extra["steps_relative_time"] is True
    s = run.steps.sort("rank", "step")
    nxt = s.group_by("rank").agg((pl.col("t_start_ns").shift(-1) - pl.col("t_start_ns")).drop_nulls())
    assert all(min(d) > 0 for d in nxt["t_start_ns"].to_list())  # steps follow each other again
