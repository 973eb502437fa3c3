"""fabricpace run passes the training script's exit code through (torchrun alone turns it into 1; a plain
exit code: tests/cli/test_app.py)."""

from __future__ import annotations

import importlib.util

import pytest

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


@needs_torch
def test_script_killed_by_a_signal_exits_128_plus_the_signal(cli, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    r = cli("run", "--nproc", "1", "--", str(script), timeout=300)
    assert r.returncode == 137, r.stderr[-2000:]


def test_bad_launch_input_is_one_line(cli, refused, tmp_path):
    refused(cli("run", "--nproc", "2", "--", str(tmp_path / "missing.py")), "missing.py", "not found")
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    refused(cli("run", "--nproc", "0", "--", str(script)), "--nproc 0", "at least 1")
