"""Start-up helpers of the observer: rank and world discovery, the run directory, the manifest's
workload description and the ranks table. Run once per observer, never on the hot path."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from fabricpace.observe._guard import LOG
from fabricpace.run.schema import RANK_SCHEMA


def rank_world() -> tuple[int, int, bool]:
    """(rank, world, distributed): from the process group when initialized, else the environment."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size(), dist.get_world_size() > 1
    except ImportError:
        pass
    rank = int(os.environ.get("RANK", "0") or 0)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1:
        LOG.warning("fabricpace observer: WORLD_SIZE=%d but no process group is initialized; "
                    "recording this rank only (no window gathers, no clock alignment)", world)
    return rank, world, False


def on_cuda(model: Any) -> bool:
    if model is None:
        return False
    try:
        return any(p.is_cuda for p in model.parameters())
    except Exception:
        return False


def cuda_device(model: Any) -> Any:
    """The CUDA device of the model's first CUDA parameter (None when it has none): the observer's
    step stamps must go on that device's stream, whatever the current device is."""
    try:
        return next((p.device for p in model.parameters() if p.is_cuda), None)
    except Exception:
        return None


def default_run_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def fresh_dir(path: Path) -> Path:
    """``path`` if absent or empty, else the first free sibling ``path-1``, ``path-2``, ... (no overwrite)."""
    candidate, n = path, 0
    # A broken symbolic link counts as taken: exists() calls it absent, and mkdir would then fail.
    while (candidate.is_symlink() and not candidate.exists()) or (
        candidate.exists() and (not candidate.is_dir() or any(candidate.iterdir()))
    ):
        n += 1
        candidate = path.with_name(f"{path.name}-{n}")
    if candidate != path:
        LOG.warning("fabricpace observer: %s is taken (not empty, a file or a broken link); writing this "
                    "run to %s", path, candidate)
    return candidate


def workload(model: Any) -> dict[str, Any]:
    if model is None:
        return {}
    inner = getattr(model, "module", model)
    try:
        params = int(sum(p.numel() for p in inner.parameters()))
    except Exception:
        params = None
    return {"model": type(inner).__name__, "parameters": params}


def number_leaves(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with ``leaf`` numbered 0, 1, ... by first appearance of ``leaf_name`` in rank order (ranks
    without a name keep their ``leaf``): diagnosis and placement only compare leaves."""
    ids: dict[str, int] = {}
    out = []
    for row in sorted(rows, key=lambda r: r.get("rank", 0)):
        name = row.get("leaf_name")
        if name is not None and row.get("leaf") is None:
            row = {**row, "leaf": ids.setdefault(str(name), len(ids))}
        out.append(row)
    return out


def ranks_table(rows: list[dict[str, Any]]) -> pa.Table:
    rows = number_leaves(rows)
    arrays, fields = [], []
    for f in RANK_SCHEMA:
        arr = pa.array([r.get(f.name) for r in rows], type=f.type)
        arrays.append(arr)
        fields.append(f)
    for key in ("local_world_size", "cpu_affinity", "gpu_pci", "gpu_numa", "nic_numa", "pid", "leaf_name"):
        arr = pa.array([r.get(key) for r in rows])
        arrays.append(arr)
        fields.append(pa.field(key, arr.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
