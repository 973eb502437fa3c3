"""What the diagnosis returns: findings, abstentions and the whole Diagnosis (JSON of DESIGN.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

MODES = (
    "sync_amplification",
    "persistent_straggler",
    "topology_contention",
    "input_stall",
    "stage_imbalance",
)


def _clean(value: Any) -> Any:
    """JSON-safe: numpy scalars to Python, NaN/inf to None, tuples to lists."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return round(value, 6)
    return value


@dataclass(kw_only=True)
class Culprits:
    ranks: list[int] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    stages: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "nodes": self.nodes, "links": self.links, "stages": self.stages}


@dataclass(kw_only=True)
class Finding:
    """One failure mode found in one run."""

    mode: str
    run: str
    severity_pct: float  # share of step time lost, percent
    confidence: float  # share of block-bootstrap resamples in which the mode stays above its threshold
    culprits: Culprits
    evidence: dict[str, Any]
    # What fixing the mode would save, percent of step time. Every detector computes the severity *as*
    # this what-if (culprits at their peers' median, excess transfer at its baseline, data wait at 0),
    # so the two are equal; both keys stay in the JSON (docs/diagnosis.md), the table shows one number.
    what_if_saving_pct: float
    recommendation: str
    severity_ci_pct: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return _clean(
            {
                "mode": self.mode,
                "run": self.run,
                "severity_pct": self.severity_pct,
                "severity_ci_pct": list(self.severity_ci_pct) if self.severity_ci_pct else None,
                "confidence": self.confidence,
                "culprits": self.culprits.to_dict(),
                "evidence": self.evidence,
                "what_if_saving_pct": self.what_if_saving_pct,
                "recommendation": self.recommendation,
            }
        )


@dataclass(kw_only=True)
class Abstention:
    """A mode the data cannot decide, and why."""

    run: str
    mode: str  # a mode name, or "all"
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "mode": self.mode, "reason": self.reason}


@dataclass(kw_only=True)
class RunSummary:
    """Per-run headline numbers and the verdict (healthy / modes found / undecided)."""

    path: str
    run_id: str
    source: str
    world_size: int
    nodes: int
    steps_used: int
    verdict: str
    metrics: dict[str, Any]
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return _clean(
            {
                "path": self.path,
                "run_id": self.run_id,
                "source": self.source,
                "world_size": self.world_size,
                "nodes": self.nodes,
                "steps_used": self.steps_used,
                "verdict": self.verdict,
                "metrics": self.metrics,
                "warnings": self.warnings,
            }
        )


@dataclass(kw_only=True)
class Diagnosis:
    """Everything ``diagnose`` found over one or more runs."""

    runs: list[RunSummary]
    findings: list[Finding]
    abstained: list[Abstention]
    scaling: dict[str, Any] | None = None

    @property
    def healthy(self) -> bool:
        """True when every run was decided healthy (no findings, nothing left undecided)."""
        return bool(self.runs) and all(r.verdict == "healthy" for r in self.runs)

    def for_run(self, path: str) -> Diagnosis:
        """The part of this diagnosis about one run (what RUN_DIR/diagnosis.json holds)."""
        return Diagnosis(
            runs=[r for r in self.runs if r.path == path],
            findings=[f for f in self.findings if f.run == path],
            abstained=[a for a in self.abstained if a.run == path],
            scaling=self.scaling,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "fabricpace.diagnosis/1",
            "runs": [r.to_dict() for r in self.runs],
            "healthy": self.healthy,
            "findings": [f.to_dict() for f in self.findings],
            "abstained": [a.to_dict() for a in self.abstained],
            "scaling": _clean(self.scaling) if self.scaling is not None else None,
        }


@dataclass(kw_only=True)
class Outcome:
    """What one detector returns for one run: findings, abstentions, headline metrics."""

    findings: list[Finding] = field(default_factory=list)
    abstained: list[Abstention] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    not_applicable: list[str] = field(default_factory=list)
