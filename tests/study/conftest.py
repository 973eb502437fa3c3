"""Fixtures for the study tests."""

from __future__ import annotations

from typing import Any

import pytest


def _row(nodes: int, mode: str, *, repeats: int, cv: float = 0.0122, **kw: Any) -> dict[str, Any]:
    ci = repeats >= 2
    return {"nodes": nodes, "mode": mode, "throughput": 1896.6, "cv": cv, "efficiency": 0.942,
            "throughput_ci": [1838.7, 1954.4] if ci else None, "cv_ci": [0.0, 0.0329] if ci else None,
            "delta_pct": None if mode == "baseline" else 0.0,
            "delta_ci_pct": [0.0, 0.0] if ci and mode != "baseline" else None, "repeats": repeats,
            "steps": 100, "pacing_decisions": None if mode == "baseline" else 0, **kw}


@pytest.fixture
def table_row():
    """``row(nodes, mode, repeats=, cv=, **fields)``: one Table-1 row as ``aggregate`` makes it (an
    8-node paper-study row's numbers), for the table and figure tests."""
    return _row
