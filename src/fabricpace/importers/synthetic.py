"""Synthetic PyTorch-profiler (Kineto) traces, for tests, benchmarks and docs.

The traces follow the structure PyTorch's profiler writes (``export_chrome_trace``): a top-level object
with ``schemaVersion``, ``deviceProperties``, ``distributedInfo`` (optional here), a ``traceEvents``
array of complete events (``ph: "X"``: ``user_annotation`` ProfilerStep#N, ``cpu_op``,
``cuda_runtime`` launches, ``kernel`` events with NCCL metadata args, ``gpu_user_annotation``), flow
and metadata events, and trailing ``traceName`` / ``displayTimeUnit`` / ``baseTimeNanoseconds``.
Timestamps are microseconds relative to ``baseTimeNanoseconds`` (as Kineto writes them since 2023).

All ranks of one synthetic job are drawn from one seeded generator, so their collectives agree: every
rank enters the step's all-reduce after its own compute, and all leave it together after the last
arrival plus a transfer time. ``slow_rank`` makes one rank's compute persistently slower.
"""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NCCL_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
GEMM_KERNEL = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute"


@dataclass(frozen=True, kw_only=True)
class SyntheticJob:
    """Shape of a synthetic job: ``world_size`` ranks, ``steps`` steps, compute kernels and buckets."""

    world_size: int = 4
    steps: int = 8
    first_step: int = 3
    kernels_per_step: int = 20
    buckets_per_step: int = 2
    bucket_nelems: int = 1 << 20
    step_compute_us: float = 20_000.0
    jitter_us: float = 300.0
    slow_rank: int | None = None
    slow_factor: float = 1.3
    transfer_us: float = 1_500.0
    seed: int = 0
    base_time_ns: int = 1_780_000_000_000_000_000

    def compute_us(self) -> np.ndarray:
        """Per-rank, per-step compute time in µs (world_size × steps), identical for every file."""
        rng = np.random.default_rng(self.seed)
        c = self.step_compute_us + rng.normal(0.0, self.jitter_us, (self.world_size, self.steps))
        if self.slow_rank is not None:
            c[self.slow_rank] *= self.slow_factor
        return np.maximum(c, self.step_compute_us * 0.2)


def _event(parts: list[str], **fields: object) -> None:
    parts.append(json.dumps(fields, separators=(",", ":")))


def trace_text(job: SyntheticJob, rank: int, *, distributed_info: bool = True) -> str:
    """The whole trace of one rank as JSON text."""
    buf = io.StringIO()
    write_trace(buf, job, rank, distributed_info=distributed_info)
    return buf.getvalue()


def write_trace(
    out: io.TextIOBase | io.StringIO, job: SyntheticJob, rank: int, *, distributed_info: bool = True
) -> None:
    """Write one rank's trace to a text stream, event by event (bounded memory at any size)."""
    compute = job.compute_us()
    pid, tid = 4000 + rank, 4000 + rank
    head: dict[str, object] = {
        "schemaVersion": 1,
        "deviceProperties": [
            {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045542912, "numSms": 132}
        ],
    }
    if distributed_info:
        head["distributedInfo"] = {
            "backend": "nccl",
            "rank": rank,
            "world_size": job.world_size,
            "pg_count": 1,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                           "pg_size": job.world_size, "ranks": list(range(job.world_size))}],
            "nccl_version": "2.21.5",
        }
    head["cuda_runtime_version"] = 12040
    head["record_shapes"] = 1
    head["trace_id"] = f"synthetic-{job.seed}-{rank}"
    text = json.dumps(head, separators=(",", ":"))
    out.write(text[:-1] + ',"traceEvents":[\n')
    # The job's shared schedule: every step starts on all ranks together (DDP is synchronous);
    # rank r reaches the step's first collective after its own compute, all leave after the last one.
    last = 20.0 + compute.max(axis=0)
    step_len = last + job.buckets_per_step * job.transfer_us + 200.0
    starts = 1_000.0 + np.concatenate([[0.0], np.cumsum(step_len + 50.0)[:-1]])
    corr = 250_000  # correlation ids of a process that has run a while (as in real traces)
    first = True
    t = 0.0
    for s in range(job.steps):
        step = job.first_step + s
        parts: list[str] = []
        k_dur = compute[rank, s] / job.kernels_per_step
        t = float(starts[s])
        gap = np.zeros(job.world_size)
        gap[:] = compute[:, s].max() - compute[:, s]
        step_start = t
        cpu_t = t + 5.0
        gpu_t = t + 20.0
        for _k in range(job.kernels_per_step):
            _event(parts, ph="X", cat="cpu_op", name="aten::mm", pid=pid, tid=tid, ts=round(cpu_t, 3),
                   dur=8.5, args={"External id": corr, "Record function id": 0, "Sequence number": corr,
                                  "Fwd thread id": 0, "Ev Idx": corr})
            _event(parts, ph="X", cat="cuda_runtime", name="cudaLaunchKernel", pid=pid, tid=tid,
                   ts=round(cpu_t + 2.0, 3), dur=4.1, args={"External id": corr, "cbid": 211,
                                                           "correlation": corr})
            _event(parts, ph="X", cat="kernel", name=GEMM_KERNEL, pid=0, tid=7, ts=round(gpu_t, 3),
                   dur=round(k_dur - 0.5, 3), args={"External id": corr, "queued": 0, "device": 0,
                                                   "context": 1, "stream": 7, "correlation": corr,
                                                   "registers per thread": 168, "shared memory": 0,
                                                   "grid": [132, 1, 1], "block": [384, 1, 1],
                                                   "est. achieved occupancy %": 0})
            _event(parts, ph="f", id=corr, pid=0, tid=7, ts=round(gpu_t, 3), cat="ac2g", name="ac2g",
                   bp="e")
            corr += 1
            cpu_t += 10.0
            gpu_t += k_dur
        for b in range(job.buckets_per_step):
            cargs = {"Collective name": "allreduce", "In msg nelems": job.bucket_nelems,
                     "Out msg nelems": job.bucket_nelems, "Group size": job.world_size,
                     "dtype": "BFloat16", "In split size": "[]", "Out split size": "[]",
                     "Process Group Name": "0", "Process Group Description": "default_pg",
                     "Process Group Ranks": str(list(range(job.world_size)))}
            _event(parts, ph="X", cat="cpu_op", name="c10d::allreduce_", pid=pid, tid=tid,
                   ts=round(cpu_t, 3), dur=30.0, args={"External id": corr, "Ev Idx": corr})
            _event(parts, ph="X", cat="cpu_op", name="record_param_comms", pid=pid, tid=tid,
                   ts=round(cpu_t + 1.0, 3), dur=25.0, args={"External id": corr, **cargs})
            _event(parts, ph="X", cat="cuda_runtime", name="cudaLaunchKernelExC", pid=pid, tid=tid,
                   ts=round(cpu_t + 5.0, 3), dur=6.0, args={"External id": corr, "correlation": corr})
            wait = gap[rank] if b == 0 else 0.0  # only the first bucket waits for the last arriver
            dur = wait + job.transfer_us
            _event(parts, ph="X", cat="kernel", name=NCCL_KERNEL, pid=0, tid=20, ts=round(gpu_t, 3),
                   dur=round(dur, 3), args={"External id": corr, "queued": 0, "device": 0, "context": 1,
                                           "stream": 20, "correlation": corr, **cargs})
            corr += 1
            cpu_t += 40.0
            gpu_t += dur
        step_end = float(starts[s] + step_len[s])
        _event(parts, ph="X", cat="user_annotation", name=f"ProfilerStep#{step}", pid=pid, tid=tid,
               ts=round(step_start, 3), dur=round(step_end - step_start, 3),
               args={"External id": corr, "Record function id": 0})
        _event(parts, ph="X", cat="gpu_user_annotation", name=f"ProfilerStep#{step}", pid=0, tid=7,
               ts=round(step_start + 20.0, 3), dur=round(gpu_t - step_start - 20.0, 3),
               args={"External id": corr})
        corr += 1
        t = step_end + 50.0
        chunk = ",\n".join(parts)
        out.write(chunk if first else ",\n" + chunk)
        first = False
    meta = [{"name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0, "args": {"name": "python"}},
            {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": round(t, 3)}]
    for m in meta:
        out.write(",\n" + json.dumps(m, separators=(",", ":")))
    tail = {"traceName": f"rank{rank}.pt.trace.json", "displayTimeUnit": "ms",
            "baseTimeNanoseconds": job.base_time_ns}
    out.write("\n]," + json.dumps(tail, separators=(",", ":"))[1:] + "\n")


def write_job(
    folder: str | Path,
    job: SyntheticJob,
    *,
    gz: bool = False,
    distributed_info: bool = True,
    name: str = "rank{rank}.pt.trace.json",
) -> list[Path]:
    """Write one trace file per rank into ``folder``; returns the paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in range(job.world_size):
        path = folder / (name.format(rank=r) + (".gz" if gz else ""))
        if gz:
            with gzip.open(path, "wt", encoding="utf-8", compresslevel=3) as fh:
                write_trace(fh, job, r, distributed_info=distributed_info)  # type: ignore[arg-type]
        else:
            with path.open("w", encoding="utf-8") as fh:
                write_trace(fh, job, r, distributed_info=distributed_info)  # type: ignore[arg-type]
        paths.append(path)
    return paths
