"""Scenarios: a cluster, a workload and a noise file bundled in one folder, with study defaults.

``scenario.yaml`` in the folder::

    name: paper
    cluster: cluster.yaml      # a file next to scenario.yaml, or a cluster preset name
    workload: workload.yaml    # a file, or a workload preset name
    noise: noise.yaml          # optional
    study: {nodes: [4, 8, 16], steps: 300, warmup: 50, repeats: 5}

``--scenario NAME`` finds a shipped scenario (``paper``), ``--scenario DIR`` a folder of your own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from fabricpace._errors import ConfigError
from fabricpace.sim._config import read_yaml, resolve, validate


class StudyDefaults(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    nodes: list[int] = Field(default=[4, 8, 16], min_length=1)
    steps: int = Field(default=300, ge=2)
    warmup: int = Field(default=50, ge=0)
    repeats: int = Field(default=3, ge=1)


class ScenarioSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str = ""
    cluster: str
    workload: str
    noise: str | None = None
    study: StudyDefaults = StudyDefaults()


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str
    folder: Path
    cluster: str
    workload: str
    noise: str | None
    study: StudyDefaults


def _local(folder: Path, ref: str) -> str:
    """A reference relative to the scenario folder when such a file exists, else a preset name."""
    candidate = folder / ref
    return str(candidate) if candidate.exists() else ref


def load_scenario(name_or_dir: str | Path) -> Scenario:
    path, _ = resolve(name_or_dir, "scenarios")
    folder = path if path.is_dir() else path.parent
    file = folder / "scenario.yaml" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{folder}: no scenario.yaml; a scenario folder needs one (see docs/simulator.md)")
    spec = validate(ScenarioSpec, read_yaml(file), source=str(file))
    return Scenario(
        name=spec.name,
        folder=folder,
        cluster=_local(folder, spec.cluster),
        workload=_local(folder, spec.workload),
        noise=_local(folder, spec.noise) if spec.noise else None,
        study=spec.study,
    )
