"""A run directory removed while a job writes it is never re-created (audit 15, finding 4).

Before, every writer created its folders with ``mkdir(parents=True)``: a run directory removed 3 s
into a real 3-rank job came back with steps 350..2999 only, and rank 0's manifest said
``complete: true`` beside them. Now the writer that started a run directory notices it has gone
and the observer switches writing off (docs/observer.md, "Never hurting the job"). Real files;
real gloo ranks for the job.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fabricpace import RunDirError
from fabricpace.run import ChunkWriter, Manifest, RunWriter, write_manifest, write_table_atomic
from fabricpace.run.writer import to_table

WORKER = Path(__file__).parent / "_removed_dir_worker.py"


def _row(rank: int, step: int) -> dict[str, int]:
    return dict(rank=rank, step=step, t_start_ns=step * 100, t_end_ns=step * 100 + 90, compute_ns=50,
                wait_ns=30, comm_ns=40, data_ns=5, gc_ns=0, paced_ns=0, samples=8)


def test_a_chunk_writer_does_not_bring_a_removed_run_dir_back(tmp_path: Path) -> None:
    run = tmp_path / "run"
    w = ChunkWriter(run, "steps", 0)
    w.append(**_row(0, 0))
    assert w.flush() is not None  # the first part creates the run directory: the writer's start
    shutil.rmtree(run)
    w.append(**_row(0, 1))
    with pytest.raises(RunDirError, match="is gone"):
        w.flush()
    assert not run.exists()


def test_a_run_dir_replaced_under_the_same_name_is_noticed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    w = ChunkWriter(run, "steps", 0)
    w.append(**_row(0, 0))
    w.flush()
    shutil.rmtree(run)
    run.mkdir()  # someone else's directory now (it may even get the old inode number)
    w.append(**_row(0, 1))
    with pytest.raises(RunDirError, match="replaced"):
        w.flush()
    assert list(run.iterdir()) == []  # nothing written into it


def test_no_writer_creates_a_missing_run_dir_after_its_start(tmp_path: Path) -> None:
    run = tmp_path / "run"
    man = Manifest(source="observer", world_size=1, nodes=1, gpus_per_node=1)
    writer = RunWriter(run, man)  # creates it: its start
    shutil.rmtree(run)
    with pytest.raises(RunDirError, match="is gone"):
        writer.write("steps", {k: [v] for k, v in _row(0, 0).items()}, rank=0)
    with pytest.raises(RunDirError, match="is gone"):
        writer.close()
    with pytest.raises(RunDirError, match=r"does not exist .* not re-created"):
        write_manifest(run, man)  # rank 0's final manifest
    table = to_table("steps", {k: [v] for k, v in _row(0, 0).items()})
    for path in (run / "ranks.parquet", run / "steps" / "rank-00000" / "part-000003.parquet"):
        with pytest.raises(RunDirError, match=r"does not exist .* not re-created"):
            write_table_atomic(path, table)  # the observer's ranks.parquet, pacing.parquet, parts
    assert not run.exists()
    # Below an existing run directory, the folders of a part are still created.
    run.mkdir()
    write_table_atomic(run / "ops" / "rank-00002" / "part-000000.parquet", table)
    assert (run / "ops" / "rank-00002" / "part-000000.parquet").is_file()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_run_dir_removed_while_real_ranks_run_stays_removed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(run), "60", "22"], env=env,
                                      text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=150))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()  # only the processes this test started
            raise
    for rank, (p, (out, err)) in enumerate(zip(procs, outs, strict=True)):
        assert p.returncode == 0, f"rank {rank}: {err[-2000:]}"
        assert "DONE 60" in out, f"rank {rank}: training did not finish: {out[-500:]} {err[-2000:]}"
        # One line per rank: writing is off, and why.
        lines = [ln for ln in err.splitlines() if "writing disabled" in ln]
        assert len(lines) == 1 and "is gone" in lines[0] and "not re-created" in lines[0], err[-2000:]
        assert '"writing"' in out  # obs.failures names it
    assert not run.exists(), sorted(str(p.relative_to(run)) for p in run.rglob("*"))
