"""Noise and fault files: what makes ranks, nodes and links differ from the ideal.

- ``jitter``: per-rank, per-step compute variation (normal or lognormal with a given CV), iid.
- ``gc``: a garbage process per rank (``hostnoise.GcState``). Each step creates garbage; mid-step
  young collections promote it to the old generation; when a rank's old garbage passes its (randomly
  drawn) threshold the rank pauses for ``pause_ms_base + pause_ms_per_mb × garbage`` and starts over.
  Ranks start at random fill levels, so their pauses fall on different steps — as Python's automatic
  collector does in real jobs. The pacing gc actuator's twin turns this off and collects on every rank
  at the same step boundaries (see ``sim.twins``).
- ``pauses``: other host noise (daemons, interrupts): Poisson events per rank with a duration law.
- ``slow``: persistent slow ranks or nodes (a factor on their compute), optionally for a step range.
- ``links``: slow or flapping links (capacity scale, optionally periodic).
- ``foreign``: another tenant's traffic on chosen links for a step range (capacity left to the job).

Ranks, nodes and links are checked against the job when the simulation starts (``validate_against``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fabricpace._errors import ConfigError
from fabricpace.sim._config import read_yaml, resolve, validate


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JitterSpec(_Strict):
    cv: float = Field(default=0.0, ge=0, le=1)
    distribution: Literal["normal", "lognormal"] = "normal"


class GcSpec(_Strict):
    garbage_mb_per_step: float = Field(default=0.0, ge=0)
    garbage_cv: float = Field(default=0.3, ge=0)
    threshold_mb: float = Field(default=500.0, gt=0)
    threshold_cv: float = Field(default=0.1, ge=0, lt=1)
    pause_ms_base: float = Field(default=0.0, ge=0)
    pause_ms_per_mb: float = Field(default=0.0, ge=0)
    young_pause_ms_base: float = Field(default=0.0, ge=0, description="fixed cost of a young collection")
    promoted_fraction: float = Field(
        default=1.0, ge=0, le=1, description="share of a step's garbage promoted by mid-step collections"
    )
    baseline_rss_mb: float = Field(default=2048.0, ge=0, description="heap that is never garbage")


class PauseSpec(_Strict):
    rate_hz: float = Field(default=0.0, ge=0)
    duration_ms: float = Field(default=0.0, ge=0)
    duration_cv: float = Field(default=0.5, ge=0)


class _StepRange(_Strict):
    from_step: int = Field(default=0, ge=0)
    to_step: int | None = Field(default=None, ge=0, description="exclusive; none = to the end")

    @model_validator(mode="after")
    def _order(self) -> _StepRange:
        if self.to_step is not None and self.to_step <= self.from_step:
            raise ValueError("to_step must be greater than from_step")
        return self


class SlowSpec(_StepRange):
    rank: int | None = Field(default=None, ge=0)
    node: int | None = Field(default=None, ge=0)
    factor: float = Field(gt=0, description="compute time multiplier (1.1 = 10% slower)")
    reason: str = ""

    @model_validator(mode="after")
    def _target(self) -> SlowSpec:
        if (self.rank is None) == (self.node is None):
            raise ValueError("give exactly one of 'rank' or 'node'")
        return self


class LinkSpec(_StepRange):
    link: str
    scale: float = Field(gt=0, le=1, description="capacity left (0.5 = half speed)")
    flap_period_steps: int | None = Field(default=None, ge=2)
    flap_down_steps: int | None = Field(default=None, ge=1)
    reason: str = ""

    @model_validator(mode="after")
    def _flap(self) -> LinkSpec:
        if (self.flap_period_steps is None) != (self.flap_down_steps is None):
            raise ValueError("give flap_period_steps and flap_down_steps together")
        if (
            self.flap_period_steps is not None
            and self.flap_down_steps is not None
            and self.flap_down_steps >= self.flap_period_steps
        ):
            raise ValueError("flap_down_steps must be less than flap_period_steps")
        return self


class ForeignSpec(_StepRange):
    """Another tenant's traffic. Without ``duty`` it sends for the whole step range; with ``duty`` it
    sends in random bursts (an on/off Markov chain per entry, mean burst ``burst_steps`` steps, on for a
    ``duty`` share of steps in the long run), drawn from the simulation's seed."""

    links: list[str] = Field(min_length=1)
    scale: float = Field(gt=0, le=1, description="capacity left to the job while the tenant sends")
    duty: float | None = Field(default=None, gt=0, lt=1)
    burst_steps: float = Field(default=20.0, ge=1)
    reason: str = ""


class NoiseSpec(_Strict):
    name: str = "custom"
    jitter: JitterSpec = JitterSpec()
    gc: GcSpec = GcSpec()
    pauses: PauseSpec = PauseSpec()
    slow: list[SlowSpec] = []
    links: list[LinkSpec] = []
    foreign: list[ForeignSpec] = []


@dataclass(frozen=True, kw_only=True)
class Noise:
    spec: NoiseSpec
    source: str

    @property
    def gc_enabled(self) -> bool:
        return self.spec.gc.garbage_mb_per_step > 0

    def validate_against(
        self,
        *,
        world: int,
        nodes: int,
        links: Sequence[str] | None,
        cluster_links: Sequence[str] | None = None,
        cluster_nodes: int | None = None,
    ) -> list[str]:
        """Faults must name ranks and nodes of this job and links of the cluster (ConfigError otherwise).

        A node or link of the cluster that this job does not use (another leaf's uplink) is fine: the
        fault is there, the job just does not meet it. Returns those faults (for the manifest).
        """
        outside: list[str] = []
        for i, s in enumerate(self.spec.slow):
            if s.rank is not None and s.rank >= world:
                # A study runs every node count with one noise file: say which job lacks the rank, and
                # that a node fault (which jobs without the node skip) serves every count.
                per = max(1, world // max(1, nodes))
                node = s.rank // per
                if node < (cluster_nodes or node + 1):
                    fix = (f"run at least {node + 1} nodes, or name its node instead (node: {node}), which "
                           "jobs without that node leave out")
                else:
                    fix = f"the cluster has only {cluster_nodes} nodes: name a smaller rank"
                raise ConfigError(
                    f"{self.source}: field 'slow.{i}.rank': rank {s.rank} does not exist "
                    f"in the {nodes}-node job (ranks 0..{world - 1}); {fix}"
                )
            if s.node is not None and nodes <= s.node < (cluster_nodes or 0):
                outside.append(f"slow.{i}: node {s.node} is not in this {nodes}-node job")
            elif s.node is not None and s.node >= nodes:
                raise ConfigError(
                    f"{self.source}: field 'slow.{i}.node': node {s.node} does not exist "
                    f"(the job has nodes 0..{nodes - 1})"
                )
        if links is None:
            return outside
        job = set(links)
        known = job | set(cluster_links or ())
        named = [(f"links.{i}.link", s.link) for i, s in enumerate(self.spec.links)]
        named += [(f"foreign.{i}.links", n) for i, f in enumerate(self.spec.foreign) for n in f.links]
        for field, name in named:
            if name not in known:
                sample = ", ".join(sorted(known)[:6])
                raise ConfigError(
                    f"{self.source}: field '{field}': no link {name!r} in this cluster (links look like: "
                    f"{sample}, ...)"
                )
            if name not in job:
                outside.append(f"{field}: link {name} is not used by this {nodes}-node job")
        return outside

    def describe(self) -> dict[str, Any]:
        d = self.spec.model_dump()
        d["source"] = self.source
        return d

    def link_scales(
        self, steps: int, *, rng: np.random.Generator, used: set[str] | None = None
    ) -> tuple[np.ndarray, list[dict[str, float]]]:
        """Piecewise-constant link capacity scales over steps.

        Returns (segment id per step, list of {link: scale} per segment). Scales of overlapping faults
        multiply (a slow link that also carries foreign traffic). Links outside ``used`` are dropped.
        """
        events: list[tuple[str, float, np.ndarray]] = []
        idx = np.arange(steps)
        for s in self.spec.links:
            on = (idx >= s.from_step) & (idx < (s.to_step if s.to_step is not None else steps))
            if s.flap_period_steps is not None and s.flap_down_steps is not None:
                on &= ((idx - s.from_step) % s.flap_period_steps) < s.flap_down_steps
            events.append((s.link, s.scale, on))
        for f in self.spec.foreign:
            on = (idx >= f.from_step) & (idx < (f.to_step if f.to_step is not None else steps))
            if f.duty is not None:
                on &= _bursts(steps, f.duty, f.burst_steps, rng)
            for name in f.links:
                events.append((name, f.scale, on))
        if used is not None:
            events = [e for e in events if e[0] in used]
        if not events:
            return np.zeros(steps, dtype=np.int64), [{}]
        active = np.stack([e[2] for e in events], axis=1)  # steps x events
        keys, seg = np.unique(active, axis=0, return_inverse=True)
        states: list[dict[str, float]] = []
        for row in keys:
            scale: dict[str, float] = {}
            for (name, value, _), on in zip(events, row, strict=True):
                if on:
                    scale[name] = scale.get(name, 1.0) * value
            states.append(scale)
        return np.asarray(seg, dtype=np.int64).reshape(steps), states


def _bursts(steps: int, duty: float, mean_on: float, rng: np.random.Generator) -> np.ndarray:
    """On/off Markov chain: P(on→off) = 1/mean_on, P(off→on) chosen so the stationary on-share is duty."""
    p_off = 1.0 / mean_on
    p_on = min(1.0, duty * p_off / (1.0 - duty))
    u = rng.random(steps)
    out = np.empty(steps, dtype=bool)
    state = bool(rng.random() < duty)
    for i in range(steps):  # a few thousand steps at most: a scalar loop is fine here
        out[i] = state
        state = (u[i] >= p_off) if state else (u[i] < p_on)
    return out


def load_noise(name_or_path: str | Path | Noise | None) -> Noise:
    """A preset name or YAML path (None = no noise) -> ``Noise``."""
    if isinstance(name_or_path, Noise):
        return name_or_path
    if name_or_path is None:
        return Noise(spec=NoiseSpec(name="none"), source="(none)")
    path, _ = resolve(name_or_path, "noise")
    spec = validate(NoiseSpec, read_yaml(path), source=str(path))
    return Noise(spec=spec, source=str(path))
