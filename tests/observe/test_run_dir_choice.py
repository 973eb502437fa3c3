"""Which directory a run goes to when its ``run_dir`` is taken: never one holding another run's rows.

Real ranks (subprocesses; gloo for ``dist``) and real directories. With a process group the ranks
agree on one directory; without one each rank chooses alone and must still pick the same one after
a complete earlier run, and never write over that run's files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabricpace.observe import startup

WORKER = Path(__file__).parent / "_run_dir_worker.py"


def _run(launcher, mode: str, cwds: list[Path], run_dir: str, out: Path) -> list[dict]:
    launch_ranks, _ = launcher
    # launch_ranks gives every rank the same arguments: the worker picks its CWD by RANK
    script = out / "by_rank.py"
    script.write_text(
        "import os, runpy, sys\n"
        f"cwds = {[str(c) for c in cwds]!r}\n"
        "r = int(os.environ['RANK'])\n"
        f"sys.argv = [{str(WORKER)!r}, {mode!r}, cwds[r], {run_dir!r}, {str(out)!r} + f'/rank-{{r}}.json']\n"
        f"runpy.run_path({str(WORKER)!r}, run_name='__main__')\n"
    )
    procs = launch_ranks(script, [], world=len(cwds), timeout=120)
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"rank {r}: {p.stderr[-2000:]}"
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(len(cwds))]


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("mode", ["nodist", "dist"])
def test_a_second_run_on_a_taken_dir_moves_every_rank_and_keeps_the_first(launcher, tmp_path, mode):
    out = tmp_path / "out"
    out.mkdir()
    run = tmp_path / "run"
    first = _run(launcher, mode, [tmp_path, tmp_path], str(run), out)
    assert [r["run_dir"] for r in first] == [str(run)] * 2
    before = _files(run)
    assert any("rank-00001" in k for k in before) and any("rank-00000" in k for k in before)
    second = _run(launcher, mode, [tmp_path, tmp_path], str(run), out)
    assert [r["run_dir"] for r in second] == [str(tmp_path / "run-1")] * 2  # every rank, not only rank 0
    assert _files(run) == before  # the first run's files, byte for byte
    assert any("rank-00001" in k for k in _files(tmp_path / "run-1"))


def test_ranks_on_their_own_disks_agree_on_a_dir_free_on_every_disk(launcher, tmp_path):
    """Rank 1's "node" still holds its rows of an earlier run in ``run``; rank 0's has nothing there."""
    node0, node1, out = tmp_path / "node0", tmp_path / "node1", tmp_path / "out"
    for d in (node0, node1, out):
        d.mkdir()
    old = node1 / "run" / "steps" / "rank-00001" / "part-000000.parquet"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"an earlier run's rows")
    got = _run(launcher, "dist", [node0, node1], "run", out)
    assert [r["run_dir"] for r in got] == ["run-1", "run-1"] and got[0]["failures"] == {}
    assert old.read_bytes() == b"an earlier run's rows"
    assert (node0 / "run-1" / "manifest.json").exists() and not (node0 / "run").exists()
    assert list((node1 / "run-1" / "steps" / "rank-00001").glob("part-*.parquet"))


def test_taken_reads_a_rank_s_own_rows(tmp_path):
    d = tmp_path / "run"
    assert not startup.taken(d, 0) and not startup.taken(d, 3)
    (d / "steps" / "rank-00003").mkdir(parents=True)
    assert not startup.taken(d, 0) and not startup.taken(d, 3)  # an empty folder holds no rows
    (d / "steps" / "rank-00003" / "part-000000.parquet").write_bytes(b"x")
    # rank 3's rows: taken for rank 3 only (rank 0 may be a rank of the same job, started later)
    assert startup.taken(d, 3) and not startup.taken(d, 2) and not startup.taken(d, 0)
    (d / "manifest.json").write_text("{}")
    assert startup.taken(d, 0) and not startup.taken(d, 2)
    (d / "manifest.json").unlink()
    (d / "steps" / "notes.txt").write_text("the user's")
    assert startup.taken(d, 0)
    (tmp_path / "file").write_text("x")
    assert startup.taken(tmp_path / "file", 2)
    assert startup.first_free(d, 3) == 1 and startup.fresh_dir(d, 2) == d
    assert startup.sibling(d, 2) == tmp_path / "run-2"
