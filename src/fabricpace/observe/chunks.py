"""Writes the observer's rows as crash-safe Parquet chunks, off the training thread.

The main thread hands over whole buffers (a list swap) together with the time base of the moment;
a daemon thread converts them to the run-directory tables (times on the aligned timeline) and writes
each as one atomic part (``run.writer.write_table_atomic``: temp file + rename), so a SIGKILL at any
instant leaves only complete chunks. Any write failure (disk full, read-only directory) is logged
once and turns writing off; recording, window summaries and training carry on.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from fabricpace.observe._guard import Guard
from fabricpace.run.schema import TABLES
from fabricpace.run.writer import write_table_atomic


def _times(values: list[Any], base_ns: int) -> pa.Array:
    """Local stamps -> aligned int64 ns; None (never completed) stays null."""
    mask = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
    raw = np.fromiter((0 if v is None else v for v in values), dtype=np.int64, count=len(values))
    return pa.array(raw - np.int64(base_ns), type=pa.int64(), mask=mask if mask.any() else None)


def _table(name: str, columns: dict[str, Any]) -> pa.Table:
    schema, _ = TABLES[name]
    arrays, fields = [], []
    for f in schema:
        col = columns[f.name]
        arr = col if isinstance(col, pa.Array) else pa.array(col, type=f.type.value_type
                                                             if pa.types.is_dictionary(f.type) else f.type)
        if pa.types.is_dictionary(f.type) and not pa.types.is_dictionary(arr.type):
            arr = arr.dictionary_encode()
        arrays.append(arr)
        fields.append(pa.field(f.name, arr.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def steps_table(rank: int, rows: list[tuple[Any, ...]], base_ns: int) -> pa.Table:
    cols = list(zip(*rows, strict=True))
    n = len(rows)
    i64 = [np.asarray(c, dtype=np.int64) for c in cols]
    return _table(
        "steps",
        {
            "rank": pa.array(np.full(n, rank, dtype=np.int32)),
            "step": pa.array(i64[0]),
            "t_start_ns": pa.array(i64[1] - base_ns),
            "t_end_ns": pa.array(i64[2] - base_ns),
            "compute_ns": pa.array(i64[3]),
            "wait_ns": pa.array(i64[4]),
            "comm_ns": pa.array(i64[5]),
            "data_ns": pa.array(i64[6]),
            "gc_ns": pa.array(i64[7]),
            "paced_ns": pa.array(i64[8]),
            "samples": pa.array(i64[9]),
        },
    ).append_column("gc_count", pa.array(i64[10]))


def collectives_table(rank: int, rows: list[tuple[Any, ...]], base_ns: int) -> pa.Table:
    step, seq, group, op, nbytes, enter, exit_ = (list(c) for c in zip(*rows, strict=True))
    return _table(
        "collectives",
        {
            "rank": pa.array(np.full(len(rows), rank, dtype=np.int32)),
            "step": pa.array(np.asarray(step, dtype=np.int64)),
            "seq": pa.array(np.asarray(seq, dtype=np.int64)),
            "group": group,
            "op": op,
            "bytes": pa.array(np.asarray(nbytes, dtype=np.int64)),
            "t_enter_ns": _times(enter, base_ns),
            "t_exit_ns": _times(exit_, base_ns),
        },
    )


def ops_table(rank: int, rows: list[tuple[Any, ...]], base_ns: int) -> pa.Table:
    step, op, start, dur = (list(c) for c in zip(*rows, strict=True))
    return _table(
        "ops",
        {
            "rank": pa.array(np.full(len(rows), rank, dtype=np.int32)),
            "step": pa.array(np.asarray(step, dtype=np.int64)),
            "op": op,
            "t_start_ns": pa.array(np.asarray(start, dtype=np.int64) - base_ns),
            "dur_ns": pa.array(np.asarray(dur, dtype=np.int64)),
        },
    )


_BUILDERS = {"steps": steps_table, "collectives": collectives_table, "ops": ops_table}


class ChunkSink:
    """Numbered atomic parts per table for one rank, written inline or by a background thread."""

    def __init__(self, run_dir: Path, rank: int, guard: Guard, *, threaded: bool) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.guard = guard
        self.parts = dict.fromkeys(_BUILDERS, 0)
        self.rows_written = dict.fromkeys(_BUILDERS, 0)
        self._queue: queue.Queue[Any] | None = None
        self._thread: threading.Thread | None = None
        if threaded:
            self._queue = queue.Queue()
            self._thread = threading.Thread(target=self._loop, name="fabricpace-writer", daemon=True)
            self._thread.start()

    @property
    def enabled(self) -> bool:
        return self.guard.ok("writing")

    def submit(self, chunk: dict[str, list[tuple[Any, ...]]], base_ns: int) -> None:
        """Hand over rows (table -> rows); returns at once in threaded mode."""
        if not self.enabled:
            return
        if self._queue is not None:
            self._queue.put((chunk, base_ns))
        else:
            self._write(chunk, base_ns)

    def _write(self, chunk: dict[str, list[tuple[Any, ...]]], base_ns: int) -> None:
        if not self.enabled:
            return
        try:
            for name, rows in chunk.items():
                if not rows:
                    continue
                table = _BUILDERS[name](self.rank, rows, base_ns)
                path = self.run_dir / name / f"rank-{self.rank:05d}" / f"part-{self.parts[name]:06d}.parquet"
                write_table_atomic(path, table)
                self.parts[name] += 1
                self.rows_written[name] += len(rows)
        except Exception as exc:  # disk full, read-only, removed directory: stop writing, keep training
            self.guard.fail("writing", exc)

    def _loop(self) -> None:
        assert self._queue is not None
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._write(*item)

    def close(self, timeout_s: float) -> bool:
        """Drain and stop the writer; False when it did not finish within the timeout."""
        if self._queue is None or self._thread is None:
            return True
        self._queue.put(None)
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
