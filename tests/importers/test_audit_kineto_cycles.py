"""Kineto import of real torch.profiler traces: several profiler cycles per rank, mixed jobs.

The traces under data/real_gloo_repeat and data/real_gloo_ws1 were written by torch 2.13's
tensorboard_trace_handler(use_gzip=True) in DDP jobs on gloo (CPU); data/make_real_gloo_traces.py is
the script and says how it was run. real_gloo_repeat: 2 ranks, schedule(wait=1, warmup=1, active=3,
repeat=2), so each rank wrote two files (steps 2-4 and 7-9); rank 1 slept 30 ms per step.
real_gloo_ws1: a one-process job (world_size 1).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl

from fabricpace.importers.kineto import import_kineto
from fabricpace.run import load_run

DATA = Path(__file__).parent / "data"


def test_profiler_cycles_of_one_process_are_merged(tmp_path: Path) -> None:
    run = load_run(import_kineto(DATA / "real_gloo_repeat", tmp_path / "run"))
    assert run.world_size == 2
    assert run.manifest.extra["profiler_cycles"] == 2
    for r in (0, 1):
        steps = run.steps.filter(pl.col("rank") == r)["step"].to_list()
        assert sorted(steps) == [2, 3, 4, 7, 8, 9]
    assert all(", " in f for f in run.ranks["trace_file"].to_list())  # both cycles' files named
    c = run.collectives
    assert c.height == 2 * 6
    inst = c.group_by(["group", "seq"]).len()
    assert inst.height == 6 and (inst["len"] == 2).all()  # one instance per step, both ranks in it
    # rank 1 slept 30 ms a step: it waits least in the all-reduce, in both cycles
    w = run.steps.group_by("rank").agg(pl.col("wait_ns").mean()).sort("rank")["wait_ns"].to_list()
    assert w[1] < w[0]


def test_cli_other_run_of_the_same_rank_is_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    shutil.copytree(DATA / "real_gloo_repeat", src)
    for f in (DATA / "real_gloo").iterdir():  # another 2-rank run: same ranks, other processes
        shutil.copy(f, src / f.name)
    before = sorted(p.name for p in src.iterdir())
    out = tmp_path / "out"
    r = cli("import", "kineto", str(src), "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "rank 0 appears twice" in r.stderr and "processes" in r.stderr and "different runs" in r.stderr
    assert not out.exists() and sorted(p.name for p in src.iterdir()) == before


def test_cli_jobs_of_different_sizes_are_named_as_such(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "src"
    shutil.copytree(DATA / "real_gloo_ws1", src)
    for f in (DATA / "real_gloo").iterdir():
        shutil.copy(f, src / f.name)
    out = tmp_path / "out"
    r = cli("import", "kineto", str(src), "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "different jobs" in r.stderr and "world_size 1" in r.stderr and "world_size 2" in r.stderr
    assert not out.exists()
