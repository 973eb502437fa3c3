"""Writing a simulated run in the run-directory format (DESIGN.md), straight from the engine's arrays.

Tables are built as Arrow arrays without Python row loops and written delta-encoded (``_write``).
Chunked tables go to ``TABLE/all/`` in one part per block of steps (thousands of per-rank folders
would cost more than the simulation itself at 1,024 nodes); the reader globs every folder, so the
layout reads the same as an observer's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fabricpace.pacing.state import Decision
from fabricpace.run.manifest import Manifest
from fabricpace.run.writer import RunWriter
from fabricpace.sim.engine import BlockResult


def _ns(x: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(x) * 1e9).astype(np.int64)


def _table(columns: dict[str, Any]) -> pa.Table:
    # Table.from_arrays, not pa.table(dict): the latter probes for pandas and imports it (1–2 s).
    return pa.Table.from_arrays(
        [pa.array(v) if isinstance(v, np.ndarray) else v for v in columns.values()], names=list(columns)
    )


def _write(path: Path, table: pa.Table) -> None:
    """Atomic write (temp + rename) tuned for big numeric tables.

    Integer columns are delta-encoded (times, ranks and sequence numbers grow in small steps), then
    LZ4-compressed: ~3x faster than the default zstd dictionary encoding and ~10x smaller on a
    collectives table of 1.3 million rows (measured on this machine). Statistics only for rank/step.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    dict_cols = [n for n in ("group", "op") if n in table.column_names]
    delta = {
        f.name: "DELTA_BINARY_PACKED"
        for f in table.schema
        if pa.types.is_integer(f.type) and f.name not in dict_cols
    }
    pq.write_table(
        table,
        tmp,
        compression="lz4",
        use_dictionary=dict_cols or False,
        column_encoding=delta,
        write_statistics=[c for c in ("rank", "step") if c in table.column_names],
    )
    os.replace(tmp, path)


def _dict(values: np.ndarray, labels: Sequence[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(values.astype(np.int32)), pa.array(list(labels)))


class Recorder:
    """Owns the run directory of one simulation."""

    def __init__(
        self,
        out_dir: Path,
        manifest: Manifest,
        *,
        ops: Sequence[str],
        sizes: np.ndarray,
        group: str = "dp",
        record_collectives: bool = True,
    ) -> None:
        self.writer = RunWriter(out_dir, manifest)
        self.dir = Path(out_dir)
        self.labels = sorted(set(ops))
        self.op_codes = np.asarray([self.labels.index(o) for o in ops], dtype=np.int32)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.group = group
        self.record_collectives = record_collectives
        self._part = 0
        self._decisions: list[Decision] = []

    def ranks(
        self,
        *,
        node_of_rank: np.ndarray,
        gpus_per_node: int,
        leaf_of_node: np.ndarray,
        nics_per_gpu: bool,
        tp: int,
        pp: int,
        nodes: int,
    ) -> None:
        world = node_of_rank.shape[0]
        rank = np.arange(world)
        local = rank % gpus_per_node
        nodes_per_stage = max(nodes // pp, 1)
        cols: dict[str, Any] = {
            "rank": rank,
            "node": node_of_rank,
            "local_rank": local,
            "host": [f"node{n:04d}" for n in node_of_rank],
            "leaf": leaf_of_node[node_of_rank],
            "dp_rank": rank // tp,
            "pp_stage": np.minimum(node_of_rank // nodes_per_stage, pp - 1),
            "tp_rank": rank % tp,
            "numa": [None] * world,  # the simulator has no NUMA model; node faults carry that meaning
            "gpu": [f"gpu{i}" for i in local],
            "nic": [f"nic{i}" for i in local] if nics_per_gpu else ["nic0"] * world,
            "clock_offset_ns": np.zeros(world, dtype=np.int64),  # one simulated clock
            "clock_err_ns": np.zeros(world, dtype=np.int64),
        }
        self.writer.write("ranks", cols)

    def block(self, b: BlockResult) -> None:
        S, R = b.t_start.shape
        rank = np.broadcast_to(np.arange(R, dtype=np.int32), (S, R)).ravel()
        step = np.broadcast_to(b.steps[:, None], (S, R)).ravel().astype(np.int64)
        steps = _table(
            {
                "rank": rank,
                "step": step,
                "t_start_ns": _ns(b.t_start).ravel(),
                "t_end_ns": _ns(b.t_end).ravel(),
                "compute_ns": _ns(b.compute).ravel(),
                "wait_ns": _ns(b.wait).ravel(),
                "comm_ns": _ns(b.comm).ravel(),
                "data_ns": _ns(b.data).ravel(),
                "gc_ns": _ns(b.gc).ravel(),
                "paced_ns": _ns(b.paced).ravel(),
                "samples": b.samples.ravel().astype(np.int64),
                "noise_ns": _ns(b.noise).ravel(),  # host pauses (also inside compute_ns)
            }
        )
        _write(self.dir / "steps" / "all" / f"part-{self._part:06d}.parquet", steps)
        if self.record_collectives:
            K = b.end.shape[1]
            shape = (S, R, K)
            seq = (b.steps[:, None, None] * K + np.arange(K)[None, None, :]).astype(np.int64)
            coll = _table(
                {
                    "rank": np.broadcast_to(np.arange(R, dtype=np.int32)[None, :, None], shape).ravel(),
                    "step": np.broadcast_to(b.steps[:, None, None], shape).ravel().astype(np.int64),
                    "seq": np.broadcast_to(seq, shape).ravel(),
                    "group": _dict(np.zeros(S * R * K), [self.group]),
                    "op": _dict(np.broadcast_to(self.op_codes, shape).ravel(), self.labels),
                    "bytes": np.broadcast_to(self.sizes, shape).ravel(),
                    "t_enter_ns": _ns(b.issue).ravel(),
                    "t_exit_ns": np.broadcast_to(_ns(b.end)[:, None, :], shape).ravel(),
                }
            )
            _write(self.dir / "collectives" / "all" / f"part-{self._part:06d}.parquet", coll)
        self._part += 1

    def decisions(self, rows: Sequence[Decision]) -> None:
        self._decisions.extend(rows)

    def close(self, **extra: Any) -> None:
        if self._decisions:
            d = self._decisions
            self.writer.write(
                "pacing",
                {
                    "step": [x.step for x in d],
                    "rank": [x.rank for x in d],
                    "policy": [x.policy for x in d],
                    "action": [x.action for x in d],
                    "value": [float(x.value) for x in d],
                    "reason": [x.reason for x in d],
                },
            )
        self.writer.close(**extra)
