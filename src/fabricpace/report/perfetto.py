"""Export a run directory as a Chrome trace JSON for Perfetto (ui.perfetto.dev) or chrome://tracing.

One process per rank (named with its node and host when known); thread 1 holds the steps, thread 2 the
collectives (enter → exit, with the skew wait and the transfer in args), thread 3 the ops when asked for
(and only then named). Every column of a row that the slice itself does not already show (rank = pid,
name, start, duration) goes into its args, writers' own columns included (the observer's ``gc_count``,
an nccl-tests import's ``algbw_gbps``, ``busbw_gbps``, ``inplace_time_us``): writers may add columns
freely, and a fixed list of them dropped those without a word. A collective whose completion the
observer did not see (DDP's hook-free mode records every bucket but the backward's last as an arrival
marker, ``t_exit = t_enter``) is an instant event at its arrival with ``completion: "not observed"``,
and its instance's transfer is null, not 0: a slice of zero length cannot be seen, and "transfer 0"
would be a claim. Times are µs on the run's aligned timeline. Events are streamed to a temporary file
and renamed into place, so a large run never sits in memory as one JSON document.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl

from fabricpace._errors import InputError
from fabricpace.report.output import check_new_file, publish
from fabricpace.run.reader import DEFAULT_CHUNK_ROWS, RunData, StepChunks, load_run

STEP_TID, COLL_TID, OPS_TID = 1, 2, 3
_SLICE_ROWS = 100_000


def _meta_events(run: RunData, ops: bool = False) -> Iterator[dict[str, Any]]:
    info = {int(r["rank"]): r for r in run.ranks.iter_rows(named=True)} if run.ranks.height else {}
    ranks = sorted(set(run.steps["rank"].to_list()) | set(info))
    for r in ranks:
        row = info.get(r, {})
        where = ", ".join(f"{k} {row[k]}" for k in ("node", "host") if row.get(k) is not None)
        yield {"ph": "M", "name": "process_name", "pid": r, "tid": 0,
               "args": {"name": f"rank {r}" + (f" ({where})" if where else "")}}
        yield {"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}}
        threads = ((STEP_TID, "steps"), (COLL_TID, "collectives"), *(((OPS_TID, "ops"),) if ops else ()))
        for tid, label in threads:
            yield {"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": label}}


def _events(frame: pl.DataFrame, cat: str, name: pl.Expr, tid: int, ts_ns: str, dur_ns: pl.Expr,
            args: list[pl.Expr]) -> pl.DataFrame:
    """Trace events ("X", complete) of one table as a frame: written by polars, not row by row (a
    64-rank, 300-step run's 3.8 M collective rows took 47 s through json.dumps)."""
    return frame.select(
        pl.lit("X").alias("ph"), pl.lit(cat).alias("cat"), name.cast(pl.String).alias("name"),
        pl.col("rank").cast(pl.Int64).alias("pid"), pl.lit(tid).alias("tid"),
        (pl.col(ts_ns) / 1000.0).alias("ts"), (dur_ns.clip(lower_bound=0).fill_null(0) / 1000.0).alias("dur"),
        pl.struct(args).alias("args"),
    )


def _rest(frame: pl.DataFrame, shown: tuple[str, ...]) -> list[pl.Expr]:
    """Every column of ``frame`` but those the event shows itself, in the table's order (the reader's
    own bookkeeping columns, named with a leading underscore, left out)."""
    return [pl.col(c) for c in frame.columns if c not in shown and not c.startswith("_")]


def _step_events(steps: pl.DataFrame) -> pl.DataFrame:
    # The step first, then the components in the table's order, then any writer's own (gc_count, noise_ns).
    args = [pl.col("step"), *_rest(steps, ("rank", "step", "t_start_ns", "t_end_ns"))]
    return _events(steps, "step", pl.format("step {}", pl.col("step")), STEP_TID, "t_start_ns",
                   pl.col("t_end_ns") - pl.col("t_start_ns"), args)


def _collective_events(coll: pl.DataFrame) -> list[pl.DataFrame]:
    """Slices for the collectives seen to complete, instant events for arrival markers."""
    inst = ["group", "seq"]
    last = pl.col("t_enter_ns").max().over(inst)
    stay = pl.col("t_exit_ns") - pl.col("t_enter_ns")
    seen = (stay.min().over(inst) > 0).fill_null(False)  # every row of the instance saw its completion
    transfer = pl.when(seen).then((pl.col("t_exit_ns").min().over(inst) - last).clip(lower_bound=0))
    own = ("rank", "op", "group", "seq", "step", "bytes", "t_enter_ns", "t_exit_ns")
    args = [pl.col("group").cast(pl.String), pl.col("seq"), pl.col("step"), pl.col("bytes"),
            (last - pl.col("t_enter_ns")).alias("skew_wait_ns"), transfer.alias("transfer_ns"),
            *_rest(coll, (*own, "skew_wait_ns", "transfer_ns"))]
    marker = (stay == 0).fill_null(False)
    c = coll.with_columns(marker.alias("_marker"))
    slices = _events(
        c.filter(~pl.col("_marker")), "collective", pl.col("op"), COLL_TID, "t_enter_ns", stay, args
    )
    marks = c.filter(pl.col("_marker"))
    if marks.height == 0:
        return [slices]
    instants = marks.select(
        pl.lit("i").alias("ph"), pl.lit("collective").alias("cat"),
        pl.col("op").cast(pl.String).alias("name"),
        pl.col("rank").cast(pl.Int64).alias("pid"), pl.lit(COLL_TID).alias("tid"),
        (pl.col("t_enter_ns") / 1000.0).alias("ts"), pl.lit("t").alias("s"),
        pl.struct([*args, pl.lit("not observed").alias("completion")]).alias("args"),
    )
    return [slices, instants]


def _op_events(ops: pl.DataFrame) -> pl.DataFrame:
    return _events(ops, "op", pl.col("op"), OPS_TID, "t_start_ns", pl.col("dur_ns"),
                   [pl.col("step"), *_rest(ops, ("rank", "step", "op", "t_start_ns", "dur_ns"))])


def _write_events(fh: BinaryIO, events: Iterable[dict[str, Any]] | pl.DataFrame, first: bool) -> bool:
    """Append events to the open traceEvents array; returns whether it is still empty."""
    if isinstance(events, pl.DataFrame):
        if events.height == 0:
            return first
        for part in events.iter_slices(_SLICE_ROWS):  # (~20 MB of JSON at a time, not the chunk's GBs)
            buf = io.BytesIO()
            part.write_ndjson(buf)
            # one JSON object per line, and JSON escapes newlines inside strings: ",\n" joins them
            body = buf.getvalue().rstrip(b"\n").replace(b"\n", b",\n")
            fh.write((b"" if first else b",\n") + body)
            first = False
        return False
    for ev in events:
        fh.write((b"" if first else b",\n") + json.dumps(ev, separators=(",", ":"), default=str).encode())
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
    # A trace shows every row there is: the reader's restriction to the steps every rank covers is
    # for comparing ranks (diagnose, report), not for looking at what each rank did.
    run = load_run(run_dir, tables=("ranks", "steps", "ops") if ops else ("ranks", "steps"), all_steps=True)
    table = StepChunks(run_dir, all_steps=True)
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
        with tmp.open("wb") as fh:
            fh.write(('{"displayTimeUnit":"ms","otherData":' + json.dumps({
                "run_id": run.manifest.run_id, "source": run.manifest.source,
                "world_size": run.world_size, "exported_by": "fabricpace"}) + ',"traceEvents":[\n').encode())
            first = _write_events(fh, _meta_events(run, ops=ops and o.height > 0), True)
            first = _write_events(fh, _step_events(s.sort(["rank", "step"])), first)
            for c in chunks:
                for events in _collective_events(c):
                    first = _write_events(fh, events, first)
            for w in table.warnings[len(seen):]:  # chunks found unreadable while reading them
                print(f"fabricpace: warning: {w}", file=sys.stderr)
            if ops:
                _write_events(fh, _op_events(o), first)
            fh.write(b"\n]}\n")
        publish(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
