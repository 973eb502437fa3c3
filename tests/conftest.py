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


@pytest.fixture
def cli():
    return run_cli
