"""Audit 16 (lab): repeated Ctrl-C during clean-up, tc drift, concurrent studies and local runs, rate
units, scenario checks. Real namespaces, tc, cgroups and gloo ranks; they need root."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fabricpace.lab import fabric, state
from fabricpace.lab._sh import lab_unavailable_reason
from fabricpace.lab.config import LabConfig

REASON = lab_unavailable_reason()
needs_lab = pytest.mark.skipif(REASON is not None, reason=REASON or "")
CLI = [sys.executable, "-m", "fabricpace.cli.app"]


def _uplink_rates(cfg: LabConfig) -> set[int | None]:
    return {fabric.read_rate(cfg.switch_ns, dev) for leaf in range(cfg.leaves)
            for dev in (cfg.uplink_leaf_end(leaf), cfg.uplink_spine_end(leaf))}


def _as_terminal(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    """``cmd`` in its own process group with SIGINT at its default, as a shell's foreground job."""
    with open(log, "wb") as fh:
        return subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


# ------------------------------------------------------------------------------------------------ 3
@needs_lab
@pytest.mark.lab
def test_ctrl_c_pressed_again_and_again_still_restores_the_uplink(tmp_path, lab_down_after):
    """Audit 16 #3: SIGINT to the run's process group every 30 ms once the uplink was changed (a user
    hammering Ctrl-C) killed the clean-up's own `tc class replace` (same process group): exit -2, the
    uplinks stayed at 20mbit and `.RUN.lab` stayed. Now: exit 130, 200mbit again, nothing left."""
    prefix = "f16i-"
    lab_down_after.append(prefix)
    scen = tmp_path / "change.yaml"
    scen.write_text("name: hammer\nworld: 2\nsteps: 400\nfabric: {leaves: 2, uplink: 200mbit, "
                    "node_link: 1gbit}\nworkload: {batch_per_rank: 16, device_ms_per_sample: 1.0, "
                    "hidden: 64, "
                    "layers: 2}\nfaults:\n  uplink_change: {after_s: 1, rate: 20mbit}\n")
    out = tmp_path / "runs" / "hammer"
    proc = _as_terminal([*CLI, "lab", "run", "--scenario", str(scen), "--out", str(out), "--prefix", prefix],
                        tmp_path / "run.log")
    cfg = LabConfig(nodes=2, leaves=2, prefix=prefix)
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if state.read(prefix) and fabric.list_namespaces(prefix) and _uplink_rates(cfg) == {20_000_000}:
                break
            time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "run.log").read_text()[-2000:]
        assert _uplink_rates(cfg) == {20_000_000}
        sent = 0
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:  # the run ended between poll() and killpg()
                break
            sent += 1
            time.sleep(0.03)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    log = (tmp_path / "run.log").read_text()
    assert sent >= 5, log
    assert rc == 130, (rc, log[-2000:])
    assert _uplink_rates(cfg) == {200_000_000}, log[-2000:]
    assert not out.exists() and not (out.parent / ".hammer.lab").exists()

