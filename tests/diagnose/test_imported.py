"""Diagnosis of Kineto traces imported by fabricpace.importers (engineer R): short profiler windows
(8 ProfilerSteps, as a profiler schedule's active window gives), clocks unknown across ranks."""

from __future__ import annotations

import pytest

from fabricpace.diagnose import diagnose
from fabricpace.importers import kineto, synthetic, whatif


@pytest.mark.parametrize("slow_rank", [None, 3])
def test_imported_kineto_trace(tmp_path, slow_rank):
    job = synthetic.SyntheticJob(world_size=8, steps=10, slow_rank=slow_rank, slow_factor=1.2, seed=2)
    synthetic.write_job(tmp_path / "src", job, distributed_info=False)
    run = kineto.import_kineto(tmp_path / "src", tmp_path / "run")
    d = diagnose([run])
    assert d.runs[0].metrics["arrival_basis"] == "collective durations"  # no clock_err: clock-free basis
    if slow_rank is None:
        assert d.healthy, [f.to_dict() for f in d.findings]
    else:
        assert [(f.mode, f.culprits.ranks) for f in d.findings] == [("persistent_straggler", [slow_rank])]


def _write_whatif(folder, *, steps: int, dp: int, pp: int, slow_stage=None, slow_worker=None):
    """A What-if (OSDI'25 artifact layout) trace: dp × pp workers, 2 micro-batches, ``steps`` steps.
    Workers of ``slow_stage`` (or the one ``slow_worker`` = (dp_rank, stage)) compute 1.3× longer."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    cols = (
        "dp_rank",
        "stage",
        "rank",
        "step",
        "optype",
        "start_ts",
        "duration",
        "seq_id",
        "mc",
        "gmc",
        "mb_id",
    )
    rows: dict[str, list] = {k: [] for k in cols}

    def add(d, st, step, op, t, dur, seq, mb):
        for key, v in zip(cols, (d, st, st * dp + d, step, op, t, dur, seq, 0, st, mb), strict=True):
            rows[key].append(v)

    for step in range(steps):
        base = 10.0 + step * 2.0
        arrive = {}
        for d in range(dp):
            for st in range(pp):
                f = 1.3 if st == slow_stage or (d, st) == slow_worker else 1.0
                t = base
                for mb in range(2):
                    dur = 0.05 * f * (1 + 0.01 * rng.standard_normal())
                    add(d, st, step, "forward-compute", t, dur, mb, mb)
                    t += dur
                for mb in range(2):
                    dur = 0.1 * f * (1 + 0.01 * rng.standard_normal())
                    add(d, st, step, "backward-compute", t, dur, mb, mb)
                    t += dur
                arrive[(d, st)] = t
        for d in range(dp):
            for st in range(pp):
                end = max(arrive[(x, st)] for x in range(dp)) + 0.02
                add(d, st, step, "grads-reduce-scatter", arrive[(d, st)], end - arrive[(d, st)], 0, None)
                add(d, st, step, "optimizer", end, 0.03, 0, None)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows), folder / "trace-T.parquet")
    (folder / "meta-T.yaml").write_text(f"dp_size: {dp}\npp_size: {pp}\ntp_size: 1\nworld_size: {dp * pp}\n")
    return folder / "trace-T.parquet"


@pytest.mark.parametrize("case", ["healthy", "slow_stage", "slow_worker"])
def test_imported_whatif_trace(tmp_path, case):
    kw = {"slow_stage": {"slow_stage": 2}, "slow_worker": {"slow_worker": (1, 3)}}.get(case, {})
    src = _write_whatif(tmp_path / "src", steps=30, dp=4, pp=4, **kw)
    run = whatif.import_whatif(src, tmp_path / "run")
    d = diagnose([run])
    got = [(f.mode, f.culprits.ranks, f.culprits.stages) for f in d.findings]
    if case == "healthy":
        assert d.healthy, got
    elif case == "slow_stage":
        assert [g[0] for g in got] == ["stage_imbalance"] and got[0][2] == [2], got
    else:  # worker (dp 1, stage 3) is rank 3 * 4 + 1 = 13; judged against its own stage's ranks
        assert got == [("persistent_straggler", [13], [3])], got


def test_scaling_split_of_imported_pipeline_runs_is_never_negative(tmp_path):
    """U7: an imported What-if run with pipeline stages showed "exposed comm -15.00" ms. Its slow stage's
    ranks end their steps later than the fast stage's, so the slowest rank's own work exceeds the step
    time (the median over ranks): the split caps it there and says so instead of going negative."""
    runs = []
    for dp in (2, 4):
        src = _write_whatif(tmp_path / f"src{dp}", steps=12, dp=dp, pp=2, slow_stage=1)
        runs.append(whatif.import_whatif(src, tmp_path / f"run{dp}"))
    s = diagnose(runs).scaling
    assert s is not None
    parts = ("compute_ms", "data_ms", "skew_ms", "exposed_comm_ms")
    for r in s["rows"]:
        assert all(r[p] >= 0 for p in parts), r
        assert sum(r[p] for p in parts) == pytest.approx(r["step_ms"], rel=1e-9), r
        assert r["work_over_step_steps"] > 0 and r["exposed_comm_ms"] == 0.0, r  # capped in every step
    assert any("exceeds the step time" in n and "run4" in n for n in s["notes"]), s["notes"]
