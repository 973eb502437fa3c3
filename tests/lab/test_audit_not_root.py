"""Without root, every lab command says what to do in one line, and points only at options that exist.

Before: `lab up`, `status`, `down` and `measure` said "use --backend local instead", an option only
`lab run` has (`lab up --backend local` is "No such option").
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fabricpace.lab import _sh


def test_reason_names_lab_run_backend_local(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = _sh.lab_unavailable_reason()
    assert reason is not None and "sudo" in reason and "lab run --backend local" in reason


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/setpriv"),
                    reason="needs root to drop to nobody with setpriv")
@pytest.mark.parametrize("command", ["up", "status", "down", "measure"])
def test_as_nobody_each_command_is_one_line(tmp_path, command):
    tmp_path.chmod(0o777)
    env = dict(os.environ, FABRICPACE_LAB_STATE_DIR=str(tmp_path / "state"), HOME=str(tmp_path))
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
                        "fabricpace.cli.app", "lab", command, "--prefix", "fpz-"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs root" in lines[0] and "lab run --backend local" in lines[0], lines
    assert not (tmp_path / "state").exists()
