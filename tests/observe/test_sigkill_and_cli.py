"""`fabricpace run` launches a real 4-rank job; SIGKILL mid-run leaves a readable run directory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

import fabricpace
from fabricpace.run.schema import STEP_COLUMNS

EXAMPLE = Path(__file__).parents[2] / "examples" / "ddp_train.py"


def _parts(run: Path, rank: int) -> int:
    return len(list((run / "steps" / f"rank-{rank:05d}").glob("part-*.parquet")))


def _worker_pids(run: Path) -> list[int]:
    """The workers' PIDs as the observer recorded them (torchrun starts workers in new sessions)."""
    try:
        return [int(p) for p in pl.read_parquet(run / "ranks.parquet")["pid"].drop_nulls()]
    except (OSError, pl.exceptions.PolarsError):
        return []


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.kill(pid, signal.SIGKILL)


def test_sigkill_mid_run_leaves_readable_run_dir(tmp_path):
    run = tmp_path / "killed"
    cmd = [sys.executable, "-m", "fabricpace.cli.app", "run", "--nproc", "4", "--run-dir", str(run), "--",
           str(EXAMPLE), "--steps", "3000", "--window", "10", "--flush-every", "5", "--flush-interval", "0",
           "--hidden", "64"]
    # A new session: the job (torchrun and its 4 workers) is one process group we can kill at once.
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(_parts(run, r) >= 3 for r in range(4)):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:] if proc.stderr else ""
            time.sleep(0.2)
        assert all(_parts(run, r) >= 3 for r in range(4)), "job never wrote three chunks per rank"
        pids = _worker_pids(run)
        assert len(pids) == 4
        _kill(pids)  # SIGKILL the 4 training processes mid-run
    finally:
        _kill(_worker_pids(run))
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun itself (its own session, started above)
        proc.wait(timeout=30)
    data = fabricpace.load_run(run)
    assert data.manifest.complete is False
    assert any("did not close cleanly" in w for w in data.warnings)
    assert data.ranks.height == 4 and data.world_size == 4
    steps = data.steps
    assert set(steps["rank"].unique().to_list()) == {0, 1, 2, 3}
    per_rank = steps.group_by("rank").len()
    assert (per_rank["len"] >= 15).all()
    assert steps.select(STEP_COLUMNS).null_count().sum_horizontal().item() == 0
    # Rows are whole chunks: each rank's steps are a gap-free prefix 0..n-1.
    for _, g in steps.group_by("rank"):
        s = g["step"].sort().to_list()
        assert s == list(range(len(s)))
    assert data.collectives.filter(pl.col("t_exit_ns").is_null()).height == 0


def test_run_cli_bad_input_is_one_line_exit_2(cli, tmp_path):
    r = cli("run", "--nproc", "2", "--", str(tmp_path / "missing.py"))
    assert r.returncode == 2
    assert "missing.py" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr
    script = tmp_path / "ok.py"
    script.write_text("print('hi')\n")
    r = cli("run", "--nproc", "0", "--", str(script))
    assert r.returncode == 2 and "--nproc" in r.stderr
    r = cli("run", "--nproc", "2")
    assert r.returncode == 2 and "no script" in r.stderr
