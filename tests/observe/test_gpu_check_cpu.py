"""benchmarks/gpu_check.py on this CPU machine (``--cpu --quick``): the script a GPU lease will run is
itself debugged here. Every item must pass, or say explicitly why it was skipped; the items that need
CUDA are skipped with "no CUDA"; the real gloo/CPU path they share with the GPU run really ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "gpu_check.py"
CUDA_ONLY = {"events", "datastall", "capture"}


@pytest.mark.slow
def test_gpu_check_cpu_quick(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--quick", "--out", str(out)],
                       capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert (out / "gpu_check.json").is_file(), r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads((out / "gpu_check.json").read_text())
    items = data["items"]
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert set(items) == set(gpu_check.ITEMS)
    for name, res in items.items():
        assert res["status"] in ("pass", "skipped"), (name, res.get("reason"), res.get("notes"),
                                                      res.get("stderr_tail", "")[-1500:])
        if res["status"] == "skipped":
            assert res["reason"].startswith("skipped: "), (name, res)
        else:
            assert res["checks"] and all(res["checks"].values()), (name, res["checks"])
    for name in CUDA_ONLY:
        assert "no CUDA" in items[name]["reason"]
    # The events item's own code ran against the fake device (clocks.FakeEventSource): calibration, the
    # anchor chain, an idle gap, an event before its anchor. Its logical checks must hold; its timing
    # bounds (µs, ppm) measure this shared, loaded 2-core host here, so they inform and do not gate.
    selftest = items["events"]["numbers"]["selftest_fake_device"]
    timing = {"calibration_within_50us", "chain_end_before_host", "chain_end_close_to_host",
              "chain_drift_below_20ppm", "gap_end_before_host"}
    logic = {k: v for k, v in selftest["checks"].items() if k not in timing}
    assert set(selftest["checks"]) >= timing and logic and all(logic.values()), selftest
    assert selftest["numbers"]["chain_steps"] > 100
    # The datastall item against the fake device queue: a data phase while the device is busy costs
    # the step nothing, one on a drained queue costs the sleep. The idle arm's compute bound (kernel
    # + 2 ms) measures this loaded host's scheduling, so it informs and does not gate.
    stall = items["datastall"]["numbers"]["selftest_fake_device"]
    logic = {k: v for k, v in stall["checks"].items() if k != "idle_compute_is_the_kernel"}
    assert {"busy_data_near_zero", "busy_compute_is_the_kernel", "idle_data_is_the_sleep"} <= set(logic)
    assert all(logic.values()), stall
    assert stall["numbers"]["busy"]["data_ms"] < 1.0 <= stall["numbers"]["busy"]["host_data_ms"]
    assert r.returncode == 0 and "gpu_check:" in r.stdout
    # What the shared path measured, not only that it ran.
    one = items["nccl1"]
    assert one["numbers"]["backend"] == "gloo" and one["numbers"]["ddp_mode"] == "grad_hooks"
    assert one["checks"]["gradients_bitwise_equal_unobserved"] and one["numbers"]["grad_max_abs_diff"] == 0.0
    assert items["hook1"]["numbers"]["ddp_mode"] == "hook"
    assert items["gloo2"]["numbers"]["diagnosis_off"]["ranks"] == [1]
    assert items["overhead"]["numbers"]["n_pairs"] >= 40
    assert len(items["overhead"]["numbers"]["ratio_ci95"]) == 2
    # The run directories come back packed, for `fabricpace report` where plotly is.
    assert (out / "gpu_check_runs.tar.gz").is_file()
