"""Report and export fixes from the user audits: the pacing decisions section (observer report 5), a
skew wait that is blocked time and a whole node named as the last arriver (CLI report 5), warnings on
stderr and no silent empty export (CLI report 13)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fabricpace._errors import InputError
from fabricpace.report import data as rd
from fabricpace.report.html import render_report
from fabricpace.report.perfetto import export_perfetto
from fabricpace.run import Manifest, RunWriter, load_run

MS = 1_000_000
REAL = Path(__file__).parents[1] / "diagnose" / "data" / "real"


def test_report_lists_pacing_decisions(tmp_path) -> None:
    run = tmp_path / "prop-auto"
    shutil.copytree(REAL / "observer-prop-auto", run)
    html = render_report([run], findings=False)
    assert "Pacing decisions (3)" in html
    assert "moving 64% of rank 3&#x27;s samples" in html and "rebalance kept" in html


def _ddp_run(out: Path) -> Path:
    """4 ranks on 2 nodes (node 1 = ranks 2, 3 arrives late), 3 steps of 100 ms, 10 buckets a step
    launched 1 ms apart like DDP's. Node 0's ranks enter bucket i at 50 + i ms, node 1's 2 or 3 ms
    later (alternating, so each of ranks 2 and 3 is last in half the buckets). A node-0 rank's
    [enter, last arrival] intervals overlap: their union is 12 ms a step, but it is blocked 3 ms
    (wait_ns); node 1's ranks are blocked 1 ms."""
    w = RunWriter(out, Manifest(source="test", world_size=4, nodes=2, gpus_per_node=2))
    for r in range(4):
        slow = r >= 2
        w.write("steps", {
            "rank": [r] * 3, "step": [0, 1, 2], "t_start_ns": [s * 100 * MS for s in range(3)],
            "t_end_ns": [(s + 1) * 100 * MS for s in range(3)], "compute_ns": [60 * MS] * 3,
            "wait_ns": [(1 if slow else 3) * MS] * 3, "comm_ns": [(1 if slow else 3) * MS] * 3,
            "data_ns": [0] * 3, "gc_ns": [0] * 3, "paced_ns": [0] * 3, "samples": [8] * 3,
        }, rank=r)
        rows: dict[str, list] = {k: [] for k in ("rank", "step", "seq", "group", "op", "bytes",
                                                  "t_enter_ns", "t_exit_ns")}
        for s in range(3):
            for i in range(10):
                lag = 0 if not slow else (2 if (i + r) % 2 else 3)
                enter = s * 100 + 50 + i + lag
                for k, v in (("rank", r), ("step", s), ("seq", s * 10 + i), ("group", "dp"),
                             ("op", "all_reduce"), ("bytes", 1 << 20), ("t_enter_ns", enter * MS),
                             ("t_exit_ns", (s * 100 + 50 + i + 4) * MS)):
                    rows[k].append(v)
        w.write("collectives", rows, rank=r)
    w.write("ranks", {
        "rank": [0, 1, 2, 3], "node": [0, 0, 1, 1], "local_rank": [0, 1, 0, 1], "host": ["a", "a", "b", "b"],
        "leaf": [0] * 4, "dp_rank": [0, 1, 2, 3], "pp_stage": [None] * 4, "tp_rank": [None] * 4,
        "numa": [0] * 4, "gpu": ["0", "1", "0", "1"], "nic": [None] * 4, "clock_offset_ns": [0] * 4,
        "clock_err_ns": [1000] * 4,
    })
    w.close()
    return out


def test_skew_wait_is_blocked_time_and_a_late_node_is_named(tmp_path) -> None:
    run = load_run(_ddp_run(tmp_path / "ddp"))
    s = rd.summarize(run, "ddp")
    # mean blocked wait (3 + 3 + 1 + 1) / 4 = 2 ms of a 100 ms step; the union alone read ~6%+
    assert s.skew_share is not None and 0 < s.skew_share <= 0.02 + 1e-9
    assert s.top_last_share == pytest.approx(0.5)  # no single rank stands out...
    assert s.top_last_node == 1 and s.top_last_node_share == pytest.approx(1.0)  # ...its node does
    from fabricpace.report.html import summary_table

    assert "node 1 (100%); rank" in summary_table([s])


def _truncated(tmp_path: Path) -> Path:
    from fabricpace.diagnose.synthetic import SynthSpec, write_synthetic

    run = write_synthetic(tmp_path / "trunc", SynthSpec(ranks=4, gpus_per_node=4, steps=30))
    part = sorted((run / "steps").glob("*/part-*.parquet"))[0]
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    return run


def test_report_and_export_print_warnings_and_export_refuses_no_steps(tmp_path, capsys) -> None:
    run = _truncated(tmp_path)
    render_report([run], findings=False)
    err = capsys.readouterr().err
    assert "fabricpace: warning:" in err and "unreadable chunk skipped" in err
    with pytest.raises(InputError, match="no step rows to export"):
        export_perfetto(run, tmp_path / "t.json")
    assert "unreadable chunk skipped" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()
