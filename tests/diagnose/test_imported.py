"""Diagnosis of Kineto traces imported by fabricpace.importers (engineer R): short profiler windows
(8 ProfilerSteps, as a profiler schedule's active window gives), clocks unknown across ranks."""

from __future__ import annotations

import pytest

from fabricpace.diagnose import diagnose

kineto = pytest.importorskip("fabricpace.importers.kineto", reason="the Kineto importer is not available")
synthetic = pytest.importorskip(
    "fabricpace.importers.synthetic", reason="synthetic Kineto traces unavailable"
)


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
