"""Workload files: what one training step does on each GPU (compute, gradients, buckets, parallelism).

A workload is YAML (validated with pydantic) or a shipped preset (``gpt-1.3b``, ``gpt-7b``,
``bert-large``, ``resnet-50``). A file may start from a preset with ``preset: NAME`` and override
fields. Compute per step is given either directly (``compute.seconds`` per GPU at ``batch_per_gpu``)
or as FLOPs per sample and achieved TFLOP/s. DDP gradients are cut into buckets as PyTorch's reducer
does: parameters in reverse registration order (the order gradients appear during backward), a first
bucket of 1 MiB, then ``bucket_mb`` (25 MiB by default) — torch/csrc/distributed/c10d/reducer.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fabricpace._errors import ConfigError
from fabricpace.sim._config import presets, read_yaml, resolve, validate

MiB = 1024 * 1024
# Bounds that keep a simulation finite and its times exact (the simulator keeps int64 nanoseconds):
# a 1T-parameter model in bf16 with 25 MiB buckets has ~80,000 buckets; a million took 10 s for 5 steps
# of 2 nodes, 25 million ran for minutes without end. A training step of more than a day is a unit
# mistake (tflops given in FLOP/s, seconds in ms), and a month of such steps fills int64 nanoseconds.
MAX_BUCKETS = 1_000_000
MAX_PARAMETERS = 1e15
MAX_STEP_S = 86_400.0


class _Strict(BaseModel):
    # allow_inf_nan=False: 'tflops: .inf' made compute time 0 and 'bucket_mb: .inf' an OverflowError
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ComputeSpec(_Strict):
    """Per-GPU forward+backward time per step: ``seconds``, or ``flops_per_sample`` at ``tflops``."""

    seconds: float | None = Field(default=None, gt=0)
    flops_per_sample: float | None = Field(default=None, gt=0)
    tflops: float | None = Field(default=None, gt=0, description="achieved TFLOP/s per GPU")

    @model_validator(mode="after")
    def _one_way(self) -> ComputeSpec:
        by_flops = self.flops_per_sample is not None or self.tflops is not None
        if self.seconds is None and not by_flops:
            raise ValueError("give either 'seconds' or both 'flops_per_sample' and 'tflops'")
        if self.seconds is not None and by_flops:
            raise ValueError("give either 'seconds' or 'flops_per_sample'+'tflops', not both")
        if by_flops and (self.flops_per_sample is None or self.tflops is None):
            raise ValueError("'flops_per_sample' and 'tflops' must be given together")
        return self


class ParallelismSpec(_Strict):
    kind: Literal["ddp", "fsdp"] = "ddp"
    bucket_mb: float = Field(default=25.0, gt=0)
    first_bucket_mb: float = Field(default=1.0, gt=0)
    tp: int = Field(default=1, ge=1, description="tensor-parallel group size (inside a node)")
    pp: int = Field(default=1, ge=1, description="pipeline stages (each spans nodes/pp nodes)")
    microbatches: int = Field(default=1, ge=1, description="pipeline micro-batches per step")


class WorkloadSpec(_Strict):
    name: str = "custom"
    preset: str | None = None
    parameters: float = Field(gt=0, description="trainable parameters")
    layers: int = Field(default=24, ge=1)
    grad_bytes: int = Field(default=2, ge=1, le=8, description="bytes per gradient element")
    batch_per_gpu: int = Field(gt=0, description="samples per GPU per step")
    compute: ComputeSpec
    forward_fraction: float = Field(default=1 / 3, gt=0, lt=1)
    optimizer_seconds: float = Field(default=0.0, ge=0)
    data_seconds: float = Field(default=0.0, ge=0)
    fixed_compute_fraction: float = Field(
        default=0.0, ge=0, lt=1, description="part of compute that does not scale with samples"
    )
    gc_garbage_mb_per_sample: float = Field(
        default=0.0, ge=0, description="Python garbage created per sample (noise 'gc' scales it)"
    )
    parallelism: ParallelismSpec = ParallelismSpec()


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A validated workload with its derived quantities (times in seconds, sizes in bytes)."""

    spec: WorkloadSpec
    source: str

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def batch_per_gpu(self) -> int:
        return self.spec.batch_per_gpu

    @property
    def compute_s(self) -> float:
        """Forward+backward seconds per GPU per step at ``batch_per_gpu``."""
        c = self.spec.compute
        if c.seconds is not None:
            return c.seconds
        assert c.flops_per_sample is not None and c.tflops is not None
        return c.flops_per_sample * self.spec.batch_per_gpu / (c.tflops * 1e12)

    @property
    def model_parallel(self) -> int:
        return self.spec.parallelism.tp * self.spec.parallelism.pp

    @property
    def grad_bytes_per_gpu(self) -> int:
        """Gradient bytes each data-parallel rank reduces per step (its model shard under TP/PP)."""
        return int(self.spec.parameters * self.spec.grad_bytes / self.model_parallel)

    def buckets(self) -> np.ndarray:
        """Bucket sizes in launch order (bytes): first bucket, then ``bucket_mb`` pieces.

        Buckets fill at layer granularity where layers are larger than the cap is not modelled: with
        uniform layers, DDP's cap-based cutting gives the same sizes up to one layer's rounding.
        """
        p = self.spec.parallelism
        total = self.grad_bytes_per_gpu
        first = min(total, int(p.first_bucket_mb * MiB))
        rest = total - first
        cap = int(p.bucket_mb * MiB)
        n_rest = -(-rest // cap) if rest > 0 else 0
        sizes = [first] + [cap] * n_rest
        if n_rest:
            sizes[-1] = rest - cap * (n_rest - 1)
        return np.asarray(sizes, dtype=np.int64)

    def pipeline_factor(self) -> float:
        """Step-time factor of the pipeline bubble, (p-1)/m extra (GPipe/1F1B schedule)."""
        p = self.spec.parallelism
        return 1.0 + (p.pp - 1) / p.microbatches

    def describe(self) -> dict[str, Any]:
        d = self.spec.model_dump()
        d.update(
            source=self.source,
            compute_s=self.compute_s,
            grad_bytes_per_gpu=self.grad_bytes_per_gpu,
            buckets=len(self.buckets()),
        )
        return d


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _raw(name_or_path: str | Path, seen: tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    path, _ = resolve(name_or_path, "workloads")
    raw = read_yaml(path)
    preset = raw.get("preset")
    if preset is not None:
        if str(preset) in seen:
            raise ConfigError(f"{path}: field 'preset': {preset!r} refers back to itself")
        try:
            base, _ = _raw(str(preset), (*seen, str(preset)))
        except ConfigError as exc:
            if str(preset) in presets("workloads"):
                raise  # the preset itself is bad (a chain of presets): its own message names it
            raise ConfigError(
                f"{path}: field 'preset': {preset!r} is not a workload preset; use one of "
                f"{', '.join(presets('workloads'))}, or leave 'preset' out and give every field"
            ) from exc
        # ``compute`` is either seconds or flops+tflops: an override replaces the whole block.
        if "compute" in raw:
            base.pop("compute", None)
        raw = _merge(base, raw)
    return raw, str(path)


def load_workload(name_or_path: str | Path | Workload) -> Workload:
    """A preset name or YAML path -> ``Workload``; ConfigError naming file and field on bad input."""
    if isinstance(name_or_path, Workload):
        return name_or_path
    raw, source = _raw(name_or_path)
    spec = validate(WorkloadSpec, raw, source=source)
    p = spec.parallelism
    if p.pp > 1 and p.microbatches < p.pp:
        raise ConfigError(f"{source}: field 'parallelism.microbatches': must be at least pp ({p.pp})")
    workload = Workload(spec=spec, source=source)
    _check_bounds(workload)
    return workload


def _check_bounds(w: Workload) -> None:
    """Refuse values the simulator cannot run in finite time or represent (one line naming the field).

    Before: ``bucket_mb: 0.0001`` (25 million buckets) ran for minutes with no end, ``parameters: 1e18``
    ended in a MemoryError traceback and ``tflops: 1e-9`` printed NaN throughput with exit code 0."""
    spec, source = w.spec, w.source
    if spec.parameters > MAX_PARAMETERS:
        raise ConfigError(
            f"{source}: field 'parameters': {spec.parameters:.3g} is more than {MAX_PARAMETERS:.0e}; "
            "give the model's trainable parameters (e.g. 1.3e9)"
        )
    p = spec.parallelism
    rest = max(w.grad_bytes_per_gpu - int(p.first_bucket_mb * MiB), 0)
    cap = max(int(p.bucket_mb * MiB), 1)
    n_buckets = 1 + -(-rest // cap)
    if n_buckets > MAX_BUCKETS:
        need = rest / (MAX_BUCKETS - 1) / MiB
        raise ConfigError(
            f"{source}: field 'parallelism.bucket_mb': {p.bucket_mb:g} MiB cuts "
            f"{w.grad_bytes_per_gpu / MiB:,.0f} MiB of gradients into {n_buckets:,} buckets (at most "
            f"{MAX_BUCKETS:,}); use at least {need:.3g} MiB (PyTorch's default is 25)"
        )
    c = spec.compute
    how = (
        "compute.seconds"
        if c.seconds is not None
        else "compute.flops_per_sample x batch_per_gpu / compute.tflops (TFLOP/s, e.g. 150)"
    )
    parts = {
        "compute": (w.compute_s * w.pipeline_factor(), how),
        "optimizer_seconds": (spec.optimizer_seconds, "optimizer_seconds"),
        "data_seconds": (spec.data_seconds, "data_seconds"),
    }
    for field, (seconds, what) in parts.items():
        if not seconds <= MAX_STEP_S:  # also NaN
            raise ConfigError(
                f"{source}: field '{field}': {seconds:.3g} s per step from {what}; at most "
                f"{MAX_STEP_S:,.0f} s (a day) per step: check the units"
            )
