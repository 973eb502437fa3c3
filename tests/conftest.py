"""Shared fixtures: temporary run directories and a CLI runner with fabricpace's exit-code contract."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the real ``fabricpace`` entry point in a subprocess (exit codes and stderr as users see them)."""
    return subprocess.run(
        [sys.executable, "-m", "fabricpace.cli.app", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


def one_line_refusal(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    """Assert the bad-input contract — exit 2, no traceback, one stderr line that starts with
    "fabricpace: error: " and holds every needle — and return that line."""
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fabricpace: error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def refused():
    """``one_line_refusal`` (test modules cannot import conftest under importlib mode)."""
    return one_line_refusal
