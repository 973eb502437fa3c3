"""What-if (OSDI'25 artifact) importer: workers, DP and pipeline instances, relative time, bad input."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from fabricpace._errors import ConfigError, ParseError
from fabricpace.importers.whatif import import_whatif
from fabricpace.run import load_run


def _check(run_dir: Path) -> None:
    run = load_run(run_dir)
    assert run.manifest.source == "import:whatif" and run.manifest.complete
    # 4 workers (dp 2 × pp 2); the TP partner's rows were folded into its worker
    assert run.world_size == 4
    r = run.ranks.sort("rank")
    assert r["dp_rank"].to_list() == [0, 1, 0, 1] and r["pp_stage"].to_list() == [0, 0, 1, 1]
    assert r["global_rank"].to_list() == [0, 2, 4, 6]
    assert run.steps.height == 4 * 4
    s = run.steps.sort(["rank", "step"])
    assert (s["t_end_ns"] > s["t_start_ns"]).all()
    # steps follow each other on every rank
    for _, part in s.group_by("rank"):
        assert (part["t_start_ns"][1:].to_numpy() >= part["t_end_ns"][:-1].to_numpy()).all()
    # compute: fwd 2×50 ms + bwd 2×100 ms (+ optimizer's own 20 ms); slow worker 1.5× on fwd/bwd
    comp = s.group_by("rank").agg(pl.col("compute_ns").mean()).sort("rank")["compute_ns"].to_list()
    assert comp == pytest.approx([320e6, 320e6, 320e6, 470e6], rel=1e-6)
    c = run.collectives
    dp = c.filter(pl.col("group").str.starts_with("dp-stage"))
    assert dp.height == 4 * 4  # one reduce-scatter per worker per step
    assert set(dp["op"].to_list()) == {"reduce_scatter"}
    last = dp.sort("t_enter_ns").group_by(["group", "seq"]).agg(pl.col("rank").last())
    stage1 = last.filter(pl.col("group") == "dp-stage1")
    assert stage1["rank"].to_list() == [3] * 4  # the slow worker (dp 1, stage 1) arrives last
    p2p = c.filter(pl.col("op") == "send_recv")
    sizes = p2p.group_by(["group", "seq"]).len()
    assert (sizes["len"] == 2).all()  # each send met its receive
    assert p2p.height == 2 * 2 * 2 * 2 * 4  # (fwd + bwd) × 2 micro-batches × 2 parties × 2 DP ranks × 4 steps
    assert set(p2p["group"].to_list()) == {"pp-dp0-0-1", "pp-dp1-0-1", "pp-dp0-1-0", "pp-dp1-1-0"}
    ops = run.ops
    assert {"stage", "mb_id", "mc", "gmc"} <= set(ops.columns)


def test_whatif_absolute_time(whatif_writer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    whatif_writer(tmp_path / "src")
    _check(import_whatif(tmp_path / "src", tmp_path / "run"))
    assert load_run(tmp_path / "run").manifest.extra["steps_relative_time"] is False


def test_whatif_relative_time_is_laid_out(whatif_writer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = whatif_writer(tmp_path / "src", relative=True)
    _check(import_whatif(path, tmp_path / "run"))
    assert load_run(tmp_path / "run").manifest.extra["steps_relative_time"] is True


def test_whatif_missing_columns_and_bad_meta(whatif_writer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = whatif_writer(tmp_path / "src")
    t = pq.read_table(path).drop(["start_ts", "mb_id"])
    pq.write_table(t, path)
    with pytest.raises(ParseError, match=r"missing column.*start_ts, mb_id"):
        import_whatif(path, tmp_path / "run")
    path = whatif_writer(tmp_path / "src2")
    (tmp_path / "src2" / "meta-T.yaml").write_text("dp_size: 2\npp_size: 2\ntp_size: 2\nworld_size: 9\n")
    with pytest.raises(ConfigError, match="world_size must equal"):
        import_whatif(path, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_cli_whatif_bad_input(cli, whatif_writer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = whatif_writer(tmp_path / "src")
    (path.parent / "notes.txt").write_text("x")
    out = tmp_path / "run"
    r = cli("import", "whatif", str(path.parent), "-o", str(out))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "mixed folder" in r.stderr
    (path.parent / "notes.txt").unlink()
    (path.parent / "meta-T.yaml").unlink()
    r = cli("import", "whatif", str(path), "-o", str(out))
    assert r.returncode == 2 and "no meta YAML" in r.stderr and "Traceback" not in r.stderr
    other = whatif_writer(tmp_path / "src3")
    pq.write_table(pq.read_table(other).drop(["duration"]), other)
    r = cli("import", "whatif", str(other), "-o", str(out))
    assert (
        r.returncode == 2
        and len(r.stderr.strip().splitlines()) == 1
        and "missing column(s) duration" in r.stderr
    )
    assert not out.exists()
