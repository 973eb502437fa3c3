"""Study backend ``lab``: each point is a real gloo run with one rank per network namespace.

The fabric is built for the point (idempotent ``lab up`` with the scenario's leaves and link rates,
``nodes`` namespaces) and torn down afterwards, so a study never leaves namespaces behind and never
touches a lab the user brought up by hand (prefix ``fp-``). Each point gets a lab prefix of its own,
``fs`` and two random characters (``fs7k-``) that no lab on the machine uses: studies run by several
people on one host (or by one person twice) do not meet. The lab is taken down only by the run that
held it, so a point that could not get its lab ends nothing of another study's.
"""

from __future__ import annotations

import secrets
import string
from pathlib import Path

from fabricpace._errors import InputError

STUDY_PREFIX_STEM = "fs"
DEFAULT_SCENARIO = "healthy"
MODES = {"baseline": "off", "paced": "auto"}
_CHARS = string.ascii_lowercase + string.digits
_TRIES = 8


def pacing_of(mode: str) -> str:
    if mode not in MODES:
        raise InputError(f"mode {mode!r}: choose baseline or paced")
    return MODES[mode]


def free_prefix() -> str:
    """A study lab prefix (``fsXY-``) with nothing of it on this machine and no run holding it."""
    from fabricpace.lab import fabric, state

    for _ in range(64):
        prefix = STUDY_PREFIX_STEM + "".join(secrets.choice(_CHARS) for _ in range(2)) + "-"
        if not fabric.leftovers(prefix) and not state.claimed_elsewhere(prefix):
            return prefix
    raise InputError("study --backend lab: found no free lab prefix fsXY- (64 tries); "
                     "`fabricpace lab status --prefix fsXY-` shows what uses them")


def run_point(*, nodes: int, mode: str, steps: int, seed: int, out_dir: Path,
              scenario: str | None) -> Path:
    """Run one (nodes, mode) point of a study in the lab; returns the run directory (``out_dir``)."""
    from fabricpace.lab import fabric, launcher
    from fabricpace.lab.scenario import load_scenario

    sc = load_scenario(scenario or DEFAULT_SCENARIO)
    fabric.require_lab()
    for attempt in range(_TRIES):
        try:
            launcher.run_scenario(sc, out=Path(out_dir), pacing=pacing_of(mode), steps=steps, nodes=nodes,
                                  seed=seed, backend="lab", prefix=free_prefix(), down_after=True)
        except launcher.LabBusy as exc:  # another study drew the same prefix this instant: draw again
            if attempt == _TRIES - 1:
                raise InputError(f"study --backend lab: the {_TRIES} lab prefixes drawn were all taken "
                                 "by other runs as they started; run the study again") from exc
            continue
        return Path(out_dir)
    raise AssertionError("unreachable")
