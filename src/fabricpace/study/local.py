"""Study backend ``local``: the lab's workloads as plain processes on loopback (no namespaces, no shaping).

For machines where the lab cannot run (not root, no namespaces). Faults that need the fabric (foreign
flow, placement, uplink changes) have no effect here; a CPU throttle uses a cgroup when running as root
and extra compute on the throttled ranks otherwise.
"""

from __future__ import annotations

from pathlib import Path

from fabricpace.study.lab import DEFAULT_SCENARIO, pacing_of


def run_point(*, nodes: int, mode: str, steps: int, seed: int, out_dir: Path,
              scenario: str | None) -> Path:
    """Run one (nodes, mode) point on loopback; returns the run directory (``out_dir``)."""
    from fabricpace.lab import launcher
    from fabricpace.lab.scenario import load_scenario

    sc = load_scenario(scenario or DEFAULT_SCENARIO)
    launcher.run_scenario(sc, out=Path(out_dir), pacing=pacing_of(mode), steps=steps, nodes=nodes,
                          seed=seed, backend="local")
    return Path(out_dir)
