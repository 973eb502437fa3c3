"""Perfetto export fix from user audit 15 (finding 19): a hook-free DDP run's unobserved bucket
completions were exported as zero-length slices claiming ``transfer_ns: 0``."""

from __future__ import annotations

import json
from pathlib import Path

from fabricpace.report.perfetto import export_perfetto
from fabricpace.run import load_run

REAL = Path(__file__).parents[1] / "diagnose" / "data" / "real"


def test_perfetto_shows_unobserved_completions_as_markers(tmp_path: Path) -> None:
    """75% of the collective slices of a real gloo run had dur 0 and args "transfer_ns: 0" (nothing to
    see in Perfetto, and a false claim); an "ops" thread was named for a run without ops."""
    run = REAL / "healthy"  # 4 real gloo ranks, DDP hook-free: 2,856 of 3,808 rows are arrival markers
    doc = json.loads(export_perfetto(run, tmp_path / "t.json").read_text())
    ev = doc["traceEvents"]
    coll = [e for e in ev if e.get("cat") == "collective"]
    slices = [e for e in coll if e["ph"] == "X"]
    marks = [e for e in coll if e["ph"] == "i"]
    raw = load_run(run).collectives
    n_marks = int((raw["t_exit_ns"] == raw["t_enter_ns"]).sum())
    assert len(marks) == n_marks == 2856 and len(slices) == raw.height - n_marks
    assert all(e["dur"] > 0 for e in slices)
    assert all(e["args"]["completion"] == "not observed" and e["args"]["transfer_ns"] is None for e in marks)
    assert all(e["s"] == "t" and "dur" not in e for e in marks)
    # The backward's last bucket, seen to complete on every rank, keeps its transfer.
    seen = [e["args"]["transfer_ns"] for e in slices]
    assert all(isinstance(v, int) and v >= 0 for v in seen) and max(seen) > 0
    threads = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == {"steps", "collectives"}
    with_ops = json.loads(export_perfetto(run, tmp_path / "o.json", ops=True).read_text())["traceEvents"]
    has_ops = any(e.get("cat") == "op" for e in with_ops)
    named = {e["args"]["name"] for e in with_ops if e["ph"] == "M" and e["name"] == "thread_name"}
    assert ("ops" in named) == has_ops
