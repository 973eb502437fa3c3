"""The demo's summary lines measure a run as `fabricpace diagnose` does (audit 15, finding 6): the same
warm-up and the same step CV, so the CV printed by the demo is the one its diagnosis prints next."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fabricpace.cli.demo import _compare
from fabricpace.diagnose import diagnose
from fabricpace.run import Manifest, RunWriter


def _run(path: Path, iters_ms: list[float]) -> Path:
    """Two ranks on two hosts; step s lasts iters_ms[s]; rank 1 starts 2 ms late and ends with rank 0."""
    w = RunWriter(path, Manifest(source="observer", world_size=2, nodes=2, gpus_per_node=1))
    t = 0
    rows: dict[str, list[int]] = {k: [] for k in ("rank", "step", "t_start_ns", "t_end_ns", "samples")}
    for s, ms in enumerate(iters_ms):
        end = t + int(ms * 1e6)
        for r in (0, 1):
            rows["rank"].append(r)
            rows["step"].append(s)
            rows["t_start_ns"].append(t + r * 2_000_000)
            rows["t_end_ns"].append(end)
            rows["samples"].append(8)
        t = end + 1_000_000
    zeros = [0] * len(rows["rank"])
    w.write("steps", {**rows, **{c: zeros for c in ("compute_ns", "wait_ns", "comm_ns", "data_ns", "gc_ns",
                                                      "paced_ns")}}, rank=0)
    w.close()
    return path


def test_demo_summary_prints_the_cv_of_the_diagnosis(tmp_path, capsys):
    # 60 steps: diagnose leaves out 6, the demo used to leave out 15 (min(20, steps // 4)), so the
    # slow steps 6..14 were in one CV and not in the other (CV 0.000 printed here, 1.349 in the diagnosis).
    iters = [300.0] * 6 + [900.0, 80.0, 700.0, 60.0, 1200.0, 90.0, 500.0, 70.0, 800.0] + [100.0] * 45
    off = _run(tmp_path / "off", iters)
    auto = _run(tmp_path / "auto", [100.0] * 60)
    _compare(off, auto)
    text = capsys.readouterr().out
    printed = [float(x) for x in re.findall(r"step CV (\d+\.\d+)", text)]
    want = [diagnose(p).runs[0].metrics["step_cv"] for p in (off, auto)]
    assert printed == [pytest.approx(w, abs=5e-4) for w in want], text
    assert printed[0] > 1.0
    assert f"after the {diagnose(off).runs[0].metrics['warmup_steps']} warm-up steps" in text
