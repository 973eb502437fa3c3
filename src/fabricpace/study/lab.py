"""Study backend ``lab``: each point is a real gloo run with one rank per network namespace.

The fabric is built for the point (idempotent ``lab up`` with the scenario's leaves and link rates,
``nodes`` namespaces, prefix ``fps-``) and torn down afterwards, so a study never leaves namespaces behind
and never touches a lab the user brought up by hand (prefix ``fp-``).
"""

from __future__ import annotations

from pathlib import Path

from fabricpace._errors import InputError

STUDY_PREFIX = "fps-"
DEFAULT_SCENARIO = "healthy"
MODES = {"baseline": "off", "paced": "auto"}


def pacing_of(mode: str) -> str:
    if mode not in MODES:
        raise InputError(f"mode {mode!r}: choose baseline or paced")
    return MODES[mode]


def run_point(*, nodes: int, mode: str, steps: int, seed: int, out_dir: Path,
              scenario: str | None) -> Path:
    """Run one (nodes, mode) point of a study in the lab; returns the run directory (``out_dir``)."""
    from fabricpace.lab import fabric, launcher
    from fabricpace.lab.scenario import load_scenario

    sc = load_scenario(scenario or DEFAULT_SCENARIO)
    fabric.require_lab()
    try:
        launcher.run_scenario(sc, out=Path(out_dir), pacing=pacing_of(mode), steps=steps, nodes=nodes,
                              seed=seed, backend="lab", prefix=STUDY_PREFIX)
    finally:
        fabric.down(STUDY_PREFIX)
    return Path(out_dir)
