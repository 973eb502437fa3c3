"""examples/ddp_train.py refuses counts below 1 before it starts (it used to finish at once, exit 0)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_train.py"


def test_nonpositive_counts_are_refused_naming_the_option(tmp_path):
    for opt in ("--steps", "--batch", "--window"):
        r = subprocess.run([sys.executable, str(EXAMPLE), opt, "-5", "--run-dir", str(tmp_path / "r")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (opt, r.stderr)
        assert f"argument {opt}: -5 must be at least 1" in r.stderr
        assert "Traceback" not in r.stderr
        assert not (tmp_path / "r").exists()
