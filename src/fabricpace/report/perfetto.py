"""Export a run directory as a Chrome trace JSON for Perfetto (ui.perfetto.dev) or chrome://tracing.

One process per rank (named with its node and host when known); thread 1 holds the steps, thread 2
the collectives (enter → exit, with the skew wait and the transfer in args), thread 3 the ops when
asked for. Times are µs on the run's aligned timeline. Events are streamed to a temporary file and
renamed into place, so a large run never sits in memory as one JSON document.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

import polars as pl

from fabricpace._errors import InputError
from fabricpace.report.output import check_new_file, publish
from fabricpace.run.reader import DEFAULT_CHUNK_ROWS, RunData, StepChunks, load_run

STEP_TID, COLL_TID, OPS_TID = 1, 2, 3


def _meta_events(run: RunData) -> Iterator[dict[str, Any]]:
    info = {int(r["rank"]): r for r in run.ranks.iter_rows(named=True)} if run.ranks.height else {}
    ranks = sorted(set(run.steps["rank"].to_list()) | set(info))
    for r in ranks:
        row = info.get(r, {})
        where = ", ".join(f"{k} {row[k]}" for k in ("node", "host") if row.get(k) is not None)
        yield {"ph": "M", "name": "process_name", "pid": r, "tid": 0,
               "args": {"name": f"rank {r}" + (f" ({where})" if where else "")}}
        yield {"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}}
        for tid, label in ((STEP_TID, "steps"), (COLL_TID, "collectives"), (OPS_TID, "ops")):
            yield {"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": label}}


def _step_events(steps: pl.DataFrame) -> Iterator[dict[str, Any]]:
    extra = [c for c in ("compute_ns", "wait_ns", "comm_ns", "data_ns", "gc_ns", "paced_ns", "samples")
             if c in steps.columns]
    for row in steps.iter_rows(named=True):
        yield {"ph": "X", "cat": "step", "name": f"step {row['step']}", "pid": int(row["rank"]),
               "tid": STEP_TID, "ts": row["t_start_ns"] / 1000.0,
               "dur": max(row["t_end_ns"] - row["t_start_ns"], 0) / 1000.0,
               "args": {"step": row["step"], **{k: row[k] for k in extra if row[k] is not None}}}


def _collective_events(coll: pl.DataFrame) -> Iterator[dict[str, Any]]:
    if coll.height == 0:
        return
    coll = coll.with_columns(
        (pl.col("t_enter_ns").max().over(["group", "seq"]) - pl.col("t_enter_ns")).alias("skew_wait_ns"),
        (pl.col("t_exit_ns").min().over(["group", "seq"]) - pl.col("t_enter_ns").max().over(["group", "seq"]))
        .clip(lower_bound=0).alias("transfer_ns"),
    )
    for row in coll.iter_rows(named=True):
        yield {"ph": "X", "cat": "collective", "name": str(row["op"]), "pid": int(row["rank"]),
               "tid": COLL_TID, "ts": row["t_enter_ns"] / 1000.0,
               "dur": max(row["t_exit_ns"] - row["t_enter_ns"], 0) / 1000.0,
               "args": {"group": row["group"], "seq": row["seq"], "step": row["step"], "bytes": row["bytes"],
                        "skew_wait_ns": row["skew_wait_ns"], "transfer_ns": row["transfer_ns"]}}


def _op_events(ops: pl.DataFrame) -> Iterator[dict[str, Any]]:
    for row in ops.iter_rows(named=True):
        yield {"ph": "X", "cat": "op", "name": str(row["op"]), "pid": int(row["rank"]), "tid": OPS_TID,
               "ts": row["t_start_ns"] / 1000.0, "dur": max(row["dur_ns"], 0) / 1000.0,
               "args": {"step": row["step"]}}


def _write_events(fh: TextIO, events: Iterator[dict[str, Any]], first: bool) -> bool:
    for ev in events:
        fh.write(("" if first else ",\n") + json.dumps(ev, separators=(",", ":"), default=str))
        first = False
    return first


def export_perfetto(
    run_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    steps: tuple[int, int] | None = None,
    ops: bool = False,
) -> Path:
    """Write RUN_DIR as Chrome trace JSON to the new file OUT (atomically; never over a file); returns OUT."""
    path = check_new_file(out, "trace.json")
    # The collectives (one row per rank, collective and step) are streamed a chunk of steps at a time,
    # instances kept whole, so a run of any size exports in bounded memory.
    run = load_run(run_dir, tables=("ranks", "steps", "ops") if ops else ("ranks", "steps"))
    table = StepChunks(run_dir)
    seen = list(table.warnings)
    for w in dict.fromkeys([*run.warnings, *seen]):
        print(f"fabricpace: warning: {w}", file=sys.stderr)
    if run.steps.height == 0:
        raise InputError(
            f"{run_dir}: no step rows to export (steps/ missing, empty or unreadable); nothing was written"
        )
    s, o = run.steps, run.ops
    chunks: Iterable[pl.DataFrame]
    if steps is not None:
        lo, hi = steps
        s, o = (f.filter(pl.col("step").is_between(lo, hi)) for f in (s, o))
        if s.height == 0:
            raise InputError(f"--steps {lo}:{hi}: {run_dir} has no such steps")
        chunks = [table.read(lo, hi)]
    else:
        chunks = (f for _lo, _hi, f in table.chunks(DEFAULT_CHUNK_ROWS, whole=("group", "seq")))
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            fh.write('{"displayTimeUnit":"ms","otherData":' + json.dumps({
                "run_id": run.manifest.run_id, "source": run.manifest.source,
                "world_size": run.world_size, "exported_by": "fabricpace"}) + ',"traceEvents":[\n')
            first = _write_events(fh, _meta_events(run), True)
            first = _write_events(fh, _step_events(s.sort(["rank", "step"])), first)
            for c in chunks:
                first = _write_events(fh, _collective_events(c), first)
            for w in table.warnings[len(seen):]:  # chunks found unreadable while reading them
                print(f"fabricpace: warning: {w}", file=sys.stderr)
            if ops:
                _write_events(fh, _op_events(o), first)
            fh.write("\n]}\n")
        publish(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
