"""fabricpace: why distributed GPU training stops scaling, and what to do about it right now.

Public API (everything else is internal)::

    import fabricpace
    with fabricpace.observe(model, run_dir="runs/exp1") as obs: ...
    run = fabricpace.load_run("runs/exp1")
    result = fabricpace.diagnose(["runs/exp1"])

Heavy pieces (torch, the simulator, the diagnosis) are imported on first use, so ``import fabricpace``
stays cheap and works without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from fabricpace._errors import (
    ConfigError,
    FabricpaceError,
    InputError,
    LabError,
    ObserverError,
    ParseError,
    RunDirError,
    SimulationError,
)
from fabricpace.run import RunData, load_run

__version__ = "0.1.0"

# name -> module that defines it; resolved lazily by __getattr__.
_LAZY = {
    "observe": "fabricpace.observe",
    "Observer": "fabricpace.observe",
    "BalancedSampler": "fabricpace.pacing",
    "diagnose": "fabricpace.diagnose",
    "load_cluster": "fabricpace.fabric",
    "simulate": "fabricpace.sim",
}

__all__ = [
    "BalancedSampler",
    "ConfigError",
    "FabricpaceError",
    "InputError",
    "LabError",
    "Observer",
    "ObserverError",
    "ParseError",
    "RunData",
    "RunDirError",
    "SimulationError",
    "__version__",
    "diagnose",
    "load_cluster",
    "load_run",
    "observe",
    "simulate",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fabricpace' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
