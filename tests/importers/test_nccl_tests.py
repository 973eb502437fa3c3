"""nccl-tests importer: a real-format log becomes a collectives-only run; bad logs give one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from fabricpace.importers.nccl_tests import import_nccl_tests
from fabricpace.run import load_run

LOG = Path(__file__).parent / "data" / "n2_all_reduce.log"  # nccl-tests stdout, 2 nodes × 4 GPUs


def _log(path: Path, old: str = "", new: str = "") -> Path:
    path.write_text(LOG.read_text().replace(old, new) if old else LOG.read_text())
    return path


def test_log_becomes_collectives_only_run(tmp_path: Path) -> None:
    run = load_run(import_nccl_tests(_log(tmp_path / "n2_all_reduce.log"), tmp_path / "run"))
    assert run.manifest.source == "import:nccl-tests"
    assert run.world_size == 8 and run.manifest.nodes == 2 and run.manifest.gpus_per_node == 4
    assert run.ranks.sort("rank")["host"].to_list() == ["host0"] * 4 + ["host1"] * 4
    c = run.collectives
    assert c.height == 8 * 3
    assert set(c["op"].to_list()) == {"all_reduce"}
    r0 = c.filter(pl.col("rank") == 0).sort("seq")
    assert r0["bytes"].to_list() == [1048576, 2097152, 4194304]
    assert (r0["t_exit_ns"] - r0["t_enter_ns"]).to_list() == [93_250, 94_220, 110_900]
    assert r0["busbw_gbps"].to_list() == pytest.approx([21.08, 41.73, 70.91])
    # every rank of one measurement has the same arrival: zero skew by construction
    spread = c.group_by("seq").agg((pl.col("t_enter_ns").max() - pl.col("t_enter_ns").min()).alias("d"))
    assert spread["d"].max() == 0
    assert run.steps.height == 8 * 3


def test_cli_bad_log_one_line_exit_2(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    bad = _log(tmp_path / "all_reduce.log", "94.22   22.26", "94.22")
    out = tmp_path / "run"
    r = cli("import", "nccl-tests", str(bad), "-o", str(out))
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "all_reduce.log:" in r.stderr
    assert not out.exists()


def test_cli_creates_missing_parent_folders_and_removes_them_on_failure(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`-o runs/x` in a fresh checkout: import refused it ("create it first") while simulate, study and
    lab run create their --out's parents. A failed import leaves no folder it created behind."""
    bad = _log(tmp_path / "all_reduce.log", "94.22   22.26", "94.22")
    r = cli("import", "nccl-tests", str(bad), "-o", str(tmp_path / "runs" / "deep" / "x"))
    assert r.returncode == 2, r.stderr
    assert not (tmp_path / "runs").exists()
    out = tmp_path / "runs" / "deep" / "x"
    r = cli("import", "nccl-tests", str(_log(tmp_path / "n2_all_reduce.log")), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert load_run(out).world_size == 8


def test_abridged_device0_log_takes_gpus_per_node_from_the_option(tmp_path: Path, cli) -> None:  # type: ignore[no-untyped-def]
    # The real 4-node x 4-GPU Alps log (every rank 'device 0') with ranks 4..11 cut to '#  ...', named
    # without a node count: the import used to read 16 nodes of 1 GPU; now --gpus-per-node settles it.
    alps = Path(__file__).parents[1] / "fabric" / "data" / "alps_n4_all_reduce.out"
    out, marked = [], False
    for line in alps.read_text().splitlines(keepends=True):
        if any(f"#  Rank {r:2d} " in line for r in range(4, 12)):
            if not marked:
                out.append(" 0: #  ...\n")
                marked = True
            continue
        out.append(line)
    log = tmp_path / "alps_all_reduce.out"
    log.write_text("".join(out))
    r = cli("import", "nccl-tests", str(log), "--out", str(tmp_path / "run"), "--gpus-per-node", "4")
    assert r.returncode == 0, r.stderr
    assert "--gpus-per-node" in r.stderr  # the note says what was assumed
    run = load_run(tmp_path / "run")
    assert (run.world_size, run.manifest.nodes, run.manifest.gpus_per_node) == (16, 4, 4)
