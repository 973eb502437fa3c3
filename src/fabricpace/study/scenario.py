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

import difflib
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from fabricpace._errors import ConfigError
from fabricpace.sim._config import presets, read_yaml, resolve, validate


class StudyDefaults(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    nodes: list[int] = Field(default=[4, 8, 16], min_length=1)

    @field_validator("nodes")
    @classmethod
    def _node_counts(cls, v: list[int]) -> list[int]:
        if min(v) < 1:
            raise ValueError(f"node counts must be at least 1 (got {min(v)})")
        twice = sorted({n for n in v if v.count(n) > 1})
        if twice:
            raise ValueError(f"node count {twice[0]} is given twice; give each node count once")
        return v

    steps: int = Field(default=300, ge=2)
    warmup: int = Field(default=50, ge=0)
    repeats: int = Field(default=3, ge=1)

    @model_validator(mode="after")
    def _enough_steps(self) -> StudyDefaults:
        if self.steps < self.warmup + 2:
            raise ValueError(
                f"steps {self.steps} with warmup {self.warmup}: need at least warmup + 2 steps to measure"
            )
        return self


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


def _local(folder: Path, ref: str, *, file: Path, field: str) -> str:
    """A reference relative to the scenario folder when such a file exists, else a preset name; a
    reference that looks like a file but is missing is an error naming scenario.yaml and the field."""
    candidate = folder / ref
    if candidate.exists():
        return str(candidate)
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        raise ConfigError(
            f"{file}: field '{field}': {ref} not found next to scenario.yaml (looked for {candidate}); "
            "fix the file name or use a preset name"
        )
    return ref


def _scenario_folders(parent: Path) -> list[str]:
    """Names of the scenario folders (those holding scenario.yaml) directly under ``parent``."""
    try:
        return sorted(p.name for p in parent.iterdir() if (p / "scenario.yaml").is_file())
    except OSError:
        return []


def _not_found(text: str) -> ConfigError:
    """A ``--scenario`` that is neither a path nor a preset: say what a scenario is and name the close
    folders next to the one given and the close presets. The shared wording "use a YAML file" sent the
    user to pass scenario.yaml itself when the folder name had a typo (audit 17 A1)."""
    given = Path(text)
    parent = given.parent
    near = [str(parent / n) if str(parent) != "." else n for n in
            difflib.get_close_matches(given.name, _scenario_folders(parent), n=2, cutoff=0.6)]
    if (parent / "scenario.yaml").is_file():
        near.insert(0, str(parent))  # 'DIR/scenario.yml' or 'DIR/scenaro.yaml': the folder itself
    if "/" not in text:
        near += [p for p in difflib.get_close_matches(text, presets("scenarios"), n=2, cutoff=0.6)
                 if p not in near]
    hint = f" (did you mean {' or '.join(repr(n) for n in near)}?)" if near else ""
    return ConfigError(
        f"{text}: no such scenario folder or preset{hint}; a scenario is a folder holding scenario.yaml "
        f"(and the files it names), or a preset: {', '.join(presets('scenarios')) or '(none)'}"
    )


def load_scenario(name_or_dir: str | Path) -> Scenario:
    text = str(name_or_dir)
    shipped = "/" not in text and text in presets("scenarios")
    if not Path(text).exists() and not shipped:
        raise _not_found(text)
    path, _ = resolve(name_or_dir, "scenarios")
    folder = path if path.is_dir() else path.parent
    file = folder / "scenario.yaml" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{folder}: no scenario.yaml; a scenario folder needs one (see docs/simulator.md)")
    spec = validate(ScenarioSpec, read_yaml(file), source=str(file))
    return Scenario(
        name=spec.name,
        folder=folder,
        cluster=_local(folder, spec.cluster, file=file, field="cluster"),
        workload=_local(folder, spec.workload, file=file, field="workload"),
        noise=_local(folder, spec.noise, file=file, field="noise") if spec.noise else None,
        study=spec.study,
    )
