"""Rank 0's files of an observed run: ranks.parquet and manifest.json.

Written at start (every rank's row as published on the Store, the manifest with ``complete: false``)
and again at close (``shutdown.finish_rank0``: the final clock offsets, the manifest completed).
Atomic files; a failure turns the observer's writing off (``Guard``), never the job.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from fabricpace.observe import startup
from fabricpace.observe.pacer import pacing_mode
from fabricpace.run.manifest import Manifest, write_manifest
from fabricpace.run.writer import write_table_atomic

if TYPE_CHECKING:
    from fabricpace.observe.observer import Observer


def collect_ranks(obs: Observer, prefix: str, timeout_s: float) -> list[dict[str, Any]]:
    """Every rank's row, waiting at most ``timeout_s`` in all: with a per-key timeout, 100 ranks
    that never reported would hold rank 0 for 100 timeouts."""
    deadline = time.monotonic() + timeout_s
    keys = [f"{prefix}/{r}" for r in range(obs.world)]
    try:  # one wait and one multi_get for all (4,096 serial gets cost rank 0 a round trip each)
        return [json.loads(v.decode()) for v in obs.channel.get_many(keys, timeout_s)]
    except Exception:  # a rank never reported: key by key below, within what is left
        pass
    rows = []
    for r in range(obs.world):
        try:
            rows.append(obs.channel.get_json(keys[r], max(0.01, deadline - time.monotonic())))
        except Exception:  # a rank that never reported keeps the row it had at start, else nulls
            rows.append(getattr(obs, "_start_rows", {}).get(r, {"rank": r}))
    return rows


def write_rank0_files(obs: Observer, *, complete: bool, model: Any = None, pacing: Any = None) -> None:
    """Rank 0: ranks.parquet and manifest.json (atomic files; a failure turns writing off)."""
    if not obs.sink.enabled:
        return
    try:
        rows = collect_ranks(obs, "rank", obs.config.store_timeout_s if not complete else 1.0)
        if not complete:
            obs._start_rows = {r: row for r, row in enumerate(rows) if len(row) > 1}
        hosts: list[str] = []
        for row in rows:
            if row.get("host") is not None and row["host"] not in hosts:
                hosts.append(row["host"])
        for row in rows:
            if row.get("node") is None and row.get("host") in hosts:
                row["node"] = hosts.index(row["host"])
        write_table_atomic(obs.run_dir / "ranks.parquet", startup.ranks_table(rows))
        if not complete:
            per_node = rows[0].get("local_world_size") or max(obs.world // max(len(hosts), 1), 1)
            obs._manifest = Manifest(
                source="observer", world_size=obs.world, nodes=max(len(hosts), 1),
                gpus_per_node=int(per_node),
                workload=startup.workload(model),
                pacing={"mode": pacing_mode(pacing)},
                extra={"observer": {k: getattr(obs.config, k) for k in obs.config.__dataclass_fields__},
                       "clock": "perf_counter_ns aligned to rank 0 (NTP-style over the Store)",
                       "process_group_backend": _backend()},
            )
        write_manifest(obs.run_dir, obs._manifest)
    except Exception as exc:
        obs.guard.fail("writing", exc)


def _backend() -> str | None:
    """The training's default process group backend ("gloo", "nccl", "cpu:gloo,cuda:nccl"): diagnose
    reads it to tell whether a slow rank can slow the reduction itself (the CPU reduces under gloo)."""
    try:
        import torch.distributed as dist

        return str(dist.get_backend()) if dist.is_initialized() else None
    except Exception:
        return None
