"""Import nccl-tests logs (all_reduce_perf, all_gather_perf, ...) as a collectives-only run directory.

Each result row (one message size) becomes one "step" in which every rank runs one collective of that
size for the measured average time (out-of-place; in-place, algbw and busbw are kept as extra
columns). nccl-tests reports one time for all ranks, so arrival skew is zero by construction: such a
run describes the fabric (transfer time against size), not stragglers. Several logs (a folder) of one
job follow each other, one group per log; a file that holds several runs (a sweep's one output file) gives
one group per run, named by its lines (a note on stderr lists them). Parsing is
``fabricpace.fabric.nccl_tests_runs.parse_logs`` (one ``parse_log`` per run).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from fabricpace._errors import ParseError, RunDirError
from fabricpace.fabric.nccl_tests import NcclTestsLog
from fabricpace.fabric.nccl_tests_layout import LayoutHint
from fabricpace.fabric.nccl_tests_runs import parse_logs, runs_notes
from fabricpace.importers.staging import list_sources, staged_dir
from fabricpace.run.manifest import Manifest
from fabricpace.run.writer import RunWriter

SUFFIXES = (".log", ".txt", ".out")
_GAP_NS = 1_000  # between two measurements on the synthetic timeline


def import_nccl_tests(src: str | Path, out: str | Path, *, gpus_per_node: int | None = None) -> Path:
    """Import one nccl-tests log (or a folder of logs of one job) into the new run directory OUT."""
    files = list_sources(src, SUFFIXES, what="nccl-tests log")
    # --gpus-per-node also settles a log that cannot tell it (an abridged list whose ranks all say device 0)
    hint = None if gpus_per_node is None else LayoutHint(
        gpus_per_node=gpus_per_node, source="--gpus-per-node"
    )
    logs: list[NcclTestsLog] = [log for p in files for log in parse_logs(p, hint=hint)]
    for note in runs_notes(logs):  # which runs a file of several held, told once before anything else
        print(note, file=sys.stderr)
    for log in logs:  # what was assumed about a log (its GPUs per node, ...), as collective --calibrate says
        if log.assumed:
            print(f"note: {log.name}: {log.assumed}", file=sys.stderr)
    sizes = {log.nranks for log in logs}
    if None in sizes:
        bad = next(log for log in logs if log.nranks is None)
        if bad.nodes is not None:  # a table without rank lines whose file name gives the node count
            raise ParseError(
                f"{bad.label}: no '#  Rank N ... on HOST device D' lines: {bad.nodes} nodes from the file "
                "name, but not the GPUs per node; give them (--gpus-per-node 4)"
            )
        raise ParseError(
            f"{bad.label}: no '#  Rank N ... on HOST device D' lines; cannot tell the number of ranks: give "
            "the complete log, or name the file after its node count (n4_all_reduce.log) and give "
            "--gpus-per-node"
        )
    if len(sizes) > 1:
        raise RunDirError(
            f"{src}: logs of different rank counts {sorted(s for s in sizes if s)}; import one job"
        )
    nranks = int(next(iter(sizes)))  # type: ignore[arg-type]
    gpn = gpus_per_node or next((log.gpus_per_node for log in logs if log.gpus_per_node), None) or nranks
    nodes = max(1, math.ceil(nranks / gpn))
    hosts = next((log.hosts for log in logs if len(log.hosts) == nodes), ())
    ranks = np.arange(nranks)
    with staged_dir(out) as tmp:
        w = RunWriter(
            tmp,
            Manifest(
                source="import:nccl-tests",
                world_size=nranks,
                nodes=nodes,
                gpus_per_node=gpn,
                workload={"name": "nccl-tests"},
            ),
        )
        node = ranks // gpn
        w.write(
            "ranks",
            {
                "rank": ranks,
                "node": node,
                "local_rank": ranks % gpn,
                "host": [hosts[n] for n in node] if hosts else [None] * nranks,
                "leaf": [None] * nranks,
                "dp_rank": ranks,
                "pp_stage": [None] * nranks,
                "tp_rank": [None] * nranks,
                "numa": [None] * nranks,
                "gpu": [None] * nranks,
                "nic": [None] * nranks,
                "clock_offset_ns": [0] * nranks,
                "clock_err_ns": [0] * nranks,
            },
        )
        # One row per (measurement, rank), laid end to end on a synthetic timeline.
        op_col, group_col, size_col, time_col, ip_col, algbw, busbw = [], [], [], [], [], [], []
        for log in logs:
            for row in log.rows:
                op_col.append(log.op or "unknown")
                group_col.append(log.name)
                size_col.append(row.size)
                time_col.append(row.time_us)
                ip_col.append(row.inplace_time_us)
                algbw.append(row.algbw)
                busbw.append(row.busbw)
        dur = np.rint(np.nan_to_num(np.asarray(time_col, dtype=np.float64)) * 1000.0).astype(np.int64)
        start = np.concatenate([[0], np.cumsum(dur + _GAP_NS)[:-1]]).astype(np.int64)
        n = len(dur)
        steps = np.arange(n, dtype=np.int64)
        for r in range(nranks):
            w.write(
                "steps",
                {
                    "rank": np.full(n, r, dtype=np.int32),
                    "step": steps,
                    "t_start_ns": start,
                    "t_end_ns": start + dur,
                    "compute_ns": np.zeros(n, np.int64),
                    "wait_ns": dur,
                    "comm_ns": dur,
                    "data_ns": np.zeros(n, np.int64),
                    "gc_ns": np.zeros(n, np.int64),
                    "paced_ns": np.zeros(n, np.int64),
                    "samples": [None] * n,
                },
                rank=r,
            )
            w.write(
                "collectives",
                {
                    "rank": np.full(n, r, dtype=np.int32),
                    "step": steps,
                    "seq": steps,
                    "group": group_col,
                    "op": op_col,
                    "bytes": np.asarray(size_col, dtype=np.int64),
                    "t_enter_ns": start,
                    "t_exit_ns": start + dur,
                    "inplace_time_us": ip_col,
                    "algbw_gbps": algbw,
                    "busbw_gbps": busbw,
                },
                rank=r,
            )
        w.close(
            import_format="nccl-tests",
            sources=[str(p) for p in files],
            ops=sorted({log.op or "unknown" for log in logs}),
            avg_busbw_gbps=[log.avg_busbw for log in logs],
            note="collectives-only: one step per message size; nccl-tests gives no per-rank arrival times",
        )
    return Path(out)
