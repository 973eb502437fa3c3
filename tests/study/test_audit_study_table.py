"""The study table prints throughputs with enough digits to be read against the efficiency column."""

from __future__ import annotations

import io

from rich.console import Console

from fabricpace.cli.simulate import study_table


def _render(rows):
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(study_table(rows, "t"))
    return console.export_text()


def _row(nodes, thr, half, eff):
    return {"nodes": nodes, "mode": "baseline", "throughput": thr, "throughput_ci": [thr - half, thr + half],
            "cv": 0.01, "efficiency": eff, "delta_pct": None}


def test_small_throughputs_keep_their_digits():
    # A 7B model at batch 1: 14.63 and 29.03 samples/s printed as "15 ± 0" and "29 ± 0", while the
    # efficiency column said 0.992 (29/2 / 15 reads as 0.967).
    text = _render([_row(1, 14.634, 0.148, 1.0), _row(2, 29.031, 0.021, 0.992)])
    assert "14.63 ± 0.15" in text and "29.03 ± 0.02" in text, text
    assert "15 ± 0" not in text


def test_large_throughputs_print_as_before():
    # The paper table's rows (all at least 1,000 samples/s) print as integers, unchanged.
    text = _render([_row(4, 1006.2, 1.1, 1.0), _row(16, 3481.4, 108.3, 0.865)])
    assert "1006 ± 1" in text and "3481 ± 108" in text, text
