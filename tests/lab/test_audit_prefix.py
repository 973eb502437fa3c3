"""A lab prefix that is not one (``fp``, ``''``) is refused before anything on the machine is looked at.

``lab down`` removes every namespace and root link whose name *starts with* the prefix and ends every
process inside those namespaces. Before this check, ``lab down --prefix fp`` (a user dropping the dash)
removed all 7 namespaces of a lab that was up as ``fpa-``; ``--prefix ''`` would have removed every
namespace on the machine. Only ``lab up`` (through LabConfig) checked the prefix.

The tests put fake ``ip``/``tc`` first on PATH (they log their arguments and fail), so even code that
ignored the prefix could not touch a real namespace; they need neither root nor a lab.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fabricpace._errors import InputError
from fabricpace.lab import _sh, fabric


def _fake_tools(tmp_path: Path) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in ("ip", "tc", "umount"):
        script = bin_dir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\nexit 1\n')
        script.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["FABRICPACE_LAB_STATE_DIR"] = str(tmp_path / "state")
    return env, log


@pytest.mark.parametrize("command", ["down", "status", "measure", "run"])
@pytest.mark.parametrize("prefix", ["fp", "", "f*-", "fp-n0"])
def test_cli_refuses_a_prefix_that_would_match_other_labs(tmp_path, refused, command, prefix):
    env, log = _fake_tools(tmp_path)
    args = ["lab", command, "--prefix", prefix]
    if command == "run":
        args += ["--out", str(tmp_path / "run")]
    r = subprocess.run([sys.executable, "-m", "fabricpace.cli.app", *args], capture_output=True, text=True,
                       env=env, timeout=120)
    refused(r, f"--prefix {prefix!r}", "fp-")
    assert not log.exists(), log.read_text()  # no ip/tc command ran
    assert not (tmp_path / "run").exists() and not (tmp_path / ".run.lab").exists()


@pytest.mark.parametrize("call", [fabric.down, fabric.status, fabric.load, fabric.leftovers])
def test_library_refuses_a_bad_prefix_before_running_any_tool(monkeypatch, call):
    def touched(*args, **kwargs):
        raise AssertionError(f"a system tool ran for a bad prefix: {args}")

    monkeypatch.setattr(_sh, "run", touched)
    monkeypatch.setattr(_sh, "ok", touched)
    monkeypatch.setattr(fabric, "require_lab", lambda: None)
    with pytest.raises(InputError, match="--prefix 'fp'"):
        call("fp")
