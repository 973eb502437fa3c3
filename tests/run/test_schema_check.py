"""Run directories whose tables have another schema (CLI audit, finding 3): a renamed or missing required
column, or a contract column of the wrong kind, is one line naming the file and the column and the fix
(RunDirError: exit 2 on the command line) in load_run, StepChunks, diagnose, report and export alike —
before, polars tracebacks (exit 1), and ``diagnose`` and ``export`` accepted a text step column that
``report`` then crashed on."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fabricpace._errors import RunDirError
from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic
from fabricpace.run import load_run
from fabricpace.run.reader import StepChunks


def _damaged(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    run = write_synthetic(tmp_path / kind, SynthSpec(ranks=4, gpus_per_node=4, steps=30))
    table = "collectives" if kind == "coll_missing_col" else "steps"
    part = sorted((run / table).glob("*/part-*.parquet"))[0]
    t = pq.read_table(part)
    if kind == "renamed_col":
        t = t.rename_columns(["t_begin_ns" if c == "t_start_ns" else c for c in t.column_names])
    elif kind == "coll_missing_col":
        t = t.drop(["t_exit_ns"])
    else:  # wrong_type: step stored as text
        i = t.column_names.index("step")
        t = t.set_column(i, "step", pa.array([str(x) for x in t["step"].to_pylist()]))
    pq.write_table(t, part)
    return run, part


@pytest.mark.parametrize(
    ("kind", "column"),
    [("renamed_col", "t_start_ns"), ("coll_missing_col", "t_exit_ns"), ("wrong_type", "step")],
)
def test_reader_names_file_and_column(tmp_path, kind, column) -> None:
    run, part = _damaged(tmp_path, kind)
    with pytest.raises(RunDirError) as e:
        load_run(run)
        StepChunks(run, "collectives")
    msg = str(e.value)
    assert str(part) in msg and f"column {column}" in msg and "re-create the run" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("kind", ["renamed_col", "coll_missing_col", "wrong_type"])
def test_every_command_exits_2_with_one_line(cli, tmp_path, kind) -> None:
    run, part = _damaged(tmp_path, kind)
    for args in (
        ("diagnose", str(run)),
        ("report", str(run), "-o", str(tmp_path / f"{kind}.html")),
        ("export", "perfetto", str(run), "-o", str(tmp_path / f"{kind}.json")),
    ):
        r = cli(*args)
        assert r.returncode == 2, (args, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and str(part) in lines[0], (args, r.stderr)
    assert not (tmp_path / f"{kind}.html").exists() and not (tmp_path / f"{kind}.json").exists()


def test_narrower_integer_types_and_missing_optional_columns_are_accepted(tmp_path) -> None:
    run = write_synthetic(tmp_path / "ok", SynthSpec(ranks=4, gpus_per_node=4, steps=30))
    part = sorted((run / "steps").glob("*/part-*.parquet"))[0]
    t = pq.read_table(part).drop(["samples", "paced_ns"])
    i = t.column_names.index("step")
    t = t.set_column(i, "step", t["step"].cast(pa.int32()))
    pq.write_table(t, part)
    assert load_run(run).steps.height > 0


def test_unreadable_folder_is_a_warning(tmp_path, monkeypatch) -> None:
    """CLI audit 13: a collectives/ folder that cannot be listed (chmod 000) read as "no collectives
    recorded". Root ignores permissions, so listing is made to fail here."""
    run = write_synthetic(tmp_path / "np", SynthSpec(ranks=4, gpus_per_node=4, steps=30))
    real = os.scandir

    def scandir(path):  # type: ignore[no-untyped-def]
        if Path(path).name == "collectives":
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    data = load_run(run)
    assert any("collectives: unreadable folder skipped (Permission denied)" in w for w in data.warnings)
    chunks = StepChunks(run, "collectives")
    assert chunks.rows == 0 and any("unreadable folder" in w for w in chunks.warnings)
    from fabricpace.diagnose import diagnose

    d = diagnose([run])
    reasons = {a.reason for a in d.abstained if a.mode == "persistent_straggler"}
    assert reasons and all(r.startswith("collectives unreadable") for r in reasons)
    assert d.runs[0].verdict == "undecided"
