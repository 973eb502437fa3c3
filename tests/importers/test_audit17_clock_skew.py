"""Audit 17 L6: hosts whose clocks really disagree by more than the different-runs limit (no NTP) had
no way past the refusal. ``--allow-clock-skew`` imports them as one job, each rank's clock aligned by
the median offset of its step starts; without it the refusal stays, and its line names the option.

data/gloo_buckets is a real 4-rank gloo DDP job's torch.profiler traces (rank 2 sleeps 30 ms a step)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import polars as pl

from fabricpace.importers.kineto import KinetoConfig, import_kineto
from fabricpace.importers.synthetic import SyntheticJob, write_job
from fabricpace.run import load_run

BUCKETS = Path(__file__).parent / "data" / "gloo_buckets"
SKEW_NS = 30 * 1_000_000_000


def _shifted_copy(src: Path, dst: Path, rank: int, shift_ns: int) -> None:
    """A copy of src with rank's clock moved by shift_ns (its baseTimeNanoseconds, as another host's)."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name.startswith(f"rank{rank}."):
            gz = f.suffix == ".gz"
            doc = json.loads(gzip.decompress(f.read_bytes()) if gz else f.read_bytes())
            doc["baseTimeNanoseconds"] = int(doc["baseTimeNanoseconds"]) + shift_ns
            text = json.dumps(doc).encode()
            (dst / f.name).write_bytes(gzip.compress(text) if gz else text)
        else:
            shutil.copy(f, dst / f.name)


def test_refusal_names_the_override(cli, refused, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _shifted_copy(BUCKETS, tmp_path / "src", 3, SKEW_NS)
    r = cli("import", "kineto", str(tmp_path / "src"), "-o", str(tmp_path / "out"))
    refused(r, "traces of different runs", "rank 3", "30.0 s after", "--allow-clock-skew")
    assert not (tmp_path / "out").exists()


def _starts(run, table: str, col: str) -> pl.DataFrame:  # type: ignore[no-untyped-def]
    rows = getattr(run, table).filter(pl.col("rank") == 3)
    return rows.group_by("step").agg(pl.col(col).min()).sort("step")


def test_allow_clock_skew_imports_and_aligns(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The real gloo job, rank 3's host 30 s ahead: with the option, one job on rank 0's clock."""
    _shifted_copy(BUCKETS, tmp_path / "src", 3, SKEW_NS)
    r = cli("import", "kineto", str(tmp_path / "src"), "-o", str(tmp_path / "skewed"), "--allow-clock-skew")
    assert r.returncode == 0, r.stderr
    plain = load_run(import_kineto(BUCKETS, tmp_path / "plain"), tables=("ranks", "steps", "collectives"))
    skewed = load_run(tmp_path / "skewed", tables=("ranks", "steps", "collectives"))
    offsets = dict(skewed.ranks.select("rank", "clock_offset_ns").iter_rows())
    # rank 3's clock is 30 s ahead of the others: its offset to rank 0 says so (to a step's jitter)
    assert abs(offsets[3] - SKEW_NS) < 5_000_000, offsets
    assert all(abs(offsets[r]) < 5_000_000 for r in (0, 1, 2)), offsets
    assert skewed.manifest.extra["clock_aligned_by"] == "median step-start offset (--allow-clock-skew)"

    # On the aligned timeline rank 3's steps, collectives and ops sit where the synchronized import has
    # them (each rank's residual offset, a few ms at most, is all that differs)
    for table, col in (("steps", "t_start_ns"), ("collectives", "t_enter_ns")):
        a, b = _starts(plain, table, col), _starts(skewed, table, col)
        assert a["step"].to_list() == b["step"].to_list()
        gap = (a[col] - b[col]).abs().max()
        assert gap is not None and gap < 5_000_000, (table, gap)


def test_ops_are_aligned_too(tmp_path: Path) -> None:
    """GPU kernels (ops rows, written early in absolute time) move with their rank's clock."""
    write_job(tmp_path / "job", SyntheticJob(world_size=4, steps=6))
    _shifted_copy(tmp_path / "job", tmp_path / "src", 3, SKEW_NS)
    tables = ("steps", "collectives", "ops")
    plain = load_run(import_kineto(tmp_path / "job", tmp_path / "plain"), tables=tables)
    skewed = load_run(import_kineto(tmp_path / "src", tmp_path / "skewed",
                                    config=KinetoConfig(allow_clock_skew=True)), tables=tables)
    assert plain.ops.height > 0 and skewed.ops.height == plain.ops.height
    for table, col in (("steps", "t_start_ns"), ("collectives", "t_enter_ns"), ("ops", "t_start_ns")):
        a, b = _starts(plain, table, col), _starts(skewed, table, col)
        gap = (a[col] - b[col]).abs().max()
        assert gap is not None and gap < 5_000_000, (table, gap)


def test_allow_clock_skew_in_the_api(tmp_path: Path) -> None:
    _shifted_copy(BUCKETS, tmp_path / "src", 3, -SKEW_NS)
    allow = KinetoConfig(allow_clock_skew=True)
    run = load_run(import_kineto(tmp_path / "src", tmp_path / "run", config=allow))
    assert run.world_size == 4
    assert int(run.steps["t_start_ns"].min()) == 0  # the timeline still starts at 0


def test_without_skew_the_option_changes_little(tmp_path: Path) -> None:
    plain = load_run(import_kineto(BUCKETS, tmp_path / "plain"))
    allow = KinetoConfig(allow_clock_skew=True)
    allowed = load_run(import_kineto(BUCKETS, tmp_path / "allowed", config=allow))
    assert plain.steps.height == allowed.steps.height
    assert "clock_aligned_by" not in plain.manifest.extra


def test_the_option_is_for_kineto_only(cli, refused, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    log = Path(__file__).parent / "data" / "n2_all_reduce.log"
    r = cli("import", "nccl-tests", str(log), "-o", str(tmp_path / "out"), "--allow-clock-skew")
    refused(r, "--allow-clock-skew", "kineto")
    assert not (tmp_path / "out").exists()
