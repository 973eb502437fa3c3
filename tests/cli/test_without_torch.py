"""Commands that start real ranks, run where torch is missing: one line, exit 2, nothing started.

``sys.modules['torch'] = None`` makes ``import torch`` fail and ``importlib.util.find_spec('torch')``
return None, as in an install without the ``torch`` extra (checked by hand in a fresh venv too).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

_MAIN = (
    "import sys; sys.modules['torch'] = None; "
    "from fabricpace.cli.app import main; sys.argv[0] = 'fabricpace'; main()"
)


def _cli_without_torch(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _MAIN, *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


@pytest.mark.parametrize(
    "args",
    [
        ("lab", "run", "--backend", "local", "--scenario", "healthy", "--steps", "30", "--out", "run"),
        ("study", "--backend", "local", "--nodes", "2", "--repeats", "1", "--steps", "30", "--warmup", "5",
         "--out", "run"),
        ("demo", "--quick", "--out", "run"),
    ],
    ids=["lab-run-local", "study-local", "demo"],
)
def test_missing_torch_is_one_line_before_anything_runs(tmp_path, args):
    r = _cli_without_torch(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install '.[torch]'" in lines[0]
    assert not any(tmp_path.iterdir())  # no run folder, no rank logs, no half-done study
