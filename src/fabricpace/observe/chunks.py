"""Writes the observer's rows as crash-safe Parquet chunks, off the training thread.

The main thread hands over finalized columns (numpy arrays, ``recorder.Colls`` and the probe's
``RoundsBlock``s, expanded to rows here) together with the time base of the moment; a daemon thread
converts them to the run-directory tables (times on the aligned timeline) and writes
each as one atomic part (``run.writer.write_table_atomic``: temp file + rename), so a SIGKILL at any
instant leaves only complete chunks. Any write failure (disk full, read-only directory, a run
directory removed while the job runs: it is created when the sink starts and never re-created) is
logged once and turns writing off; recording, window summaries and training carry on.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from fabricpace.observe._guard import Guard
from fabricpace.observe.recorder import merge_parts
from fabricpace.run import parts as run_parts
from fabricpace.run.schema import TABLES
from fabricpace.run.window import WINDOW_FIELDS
from fabricpace.run.writer import RunRoot, write_table_atomic


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


def _dictionary(codes: np.ndarray, names: tuple[str, ...]) -> pa.Array:
    """Codes into ``names`` -> the dictionary array ``pa.array(strings).dictionary_encode()`` would
    give (values in order of first appearance), so the parts stay byte-identical to row-built ones."""
    uniq, first = np.unique(codes, return_index=True)
    order = uniq[np.argsort(first)]
    remap = np.zeros(int(uniq.max()) + 1 if uniq.size else 1, dtype=np.int32)
    remap[order] = np.arange(order.size, dtype=np.int32)
    return pa.DictionaryArray.from_arrays(pa.array(remap[codes], type=pa.int32()),
                                          pa.array([names[i] for i in order.tolist()], type=pa.string()))


def steps_table(rank: int, rows: Any, base_ns: int) -> pa.Table:
    """Steps part from finalized step rows (n × 11 int64, ``recorder.STEP_FIELDS``; or row tuples)."""
    a = np.asarray(rows, dtype=np.int64).reshape(-1, 11)
    n = a.shape[0]
    return _table(
        "steps",
        {
            "rank": pa.array(np.full(n, rank, dtype=np.int32)),
            "step": pa.array(a[:, 0]),
            "t_start_ns": pa.array(a[:, 1] - base_ns),
            "t_end_ns": pa.array(a[:, 2] - base_ns),
            "compute_ns": pa.array(a[:, 3]),
            "wait_ns": pa.array(a[:, 4]),
            "comm_ns": pa.array(a[:, 5]),
            "data_ns": pa.array(a[:, 6]),
            "gc_ns": pa.array(a[:, 7]),
            "paced_ns": pa.array(a[:, 8]),
            "samples": pa.array(a[:, 9]),
        },
    ).append_column("gc_count", pa.array(a[:, 10]))


def collectives_table(rank: int, rows: Any, base_ns: int) -> pa.Table:
    """Collectives part from recorder parts (``Colls``/``RoundsBlock``, expanded here on the writer
    thread) or row tuples; never-completed exits are null."""
    c = merge_parts(rows)
    done = c.done
    return _table(
        "collectives",
        {
            "rank": pa.array(np.full(len(c), rank, dtype=np.int32)),
            "step": pa.array(c.step),
            "seq": pa.array(c.seq),
            "group": _dictionary(c.group, c.names),
            "op": _dictionary(c.op, c.names),
            "bytes": pa.array(c.nbytes),
            "t_enter_ns": pa.array(c.enter - np.int64(base_ns), type=pa.int64()),
            "t_exit_ns": pa.array(c.exit - np.int64(base_ns), type=pa.int64(),
                                  mask=None if done.all() else ~done),
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


def windows_table(rank: int, rows: list[np.ndarray], base_ns: int) -> pa.Table:
    """Window summaries part (rank 0): a list of (world × len(WINDOW_FIELDS)) float64 matrices."""
    a = np.concatenate(rows, axis=0) if rows else np.zeros((0, len(WINDOW_FIELDS)))
    cols = {
        name: pa.array(a[:, i].astype(np.int64) if name in _WINDOW_INTS else a[:, i])
        for i, name in enumerate(WINDOW_FIELDS)
    }
    return pa.table(cols)


_WINDOW_INTS = ("rank", "window", "first_step", "steps")


def _nrows(rows: Any) -> int:
    if isinstance(rows, list) and rows and not isinstance(rows[0], tuple):
        return sum(len(p) for p in rows)  # recorder parts
    return len(rows)


_BUILDERS = {
    "steps": steps_table, "collectives": collectives_table, "ops": ops_table, "windows": windows_table,
}
# The tables every rank writes a part of about every flush interval: the ones whose file count grows
# with ranks x run time (rank 0's window log writes a part per 65,536 rows).
_COMPACTED = ("steps", "collectives")


class ChunkSink:
    """Numbered atomic parts per table for one rank, written inline or by a background thread."""

    def __init__(self, run_dir: Path, rank: int, guard: Guard, *, threaded: bool, compact: int = 0) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.guard = guard
        self.compact = compact  # merge every `compact` parts of steps and collectives into one (0 = never)
        # The run directory is created here, at the start, and never again: a removed one turns
        # writing off instead of coming back with the rest of the run and a manifest calling it complete.
        self.root = RunRoot(run_dir)
        try:
            self.root.start()
        except Exception as exc:  # read-only, a file in the way: recording goes on without writing
            guard.fail("writing", exc)
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

    def submit(self, chunk: dict[str, Any], base_ns: int) -> None:
        """Hand over rows (table -> rows); returns at once in threaded mode."""
        if not self.enabled:
            return
        if self._queue is not None:
            self._queue.put((chunk, base_ns))
        else:
            self._write(chunk, base_ns)

    def write_now(self, chunk: dict[str, Any], base_ns: int) -> None:
        """Write rows on the calling thread (after ``close``: the last rows of rank 0's window log)."""
        self._write(chunk, base_ns)

    def _write(self, chunk: dict[str, Any], base_ns: int) -> None:
        if not self.enabled:
            return
        try:
            for name, rows in chunk.items():
                if _nrows(rows) == 0:
                    continue
                table = _BUILDERS[name](self.rank, rows, base_ns)
                path = self.run_dir / name / f"rank-{self.rank:05d}" / f"part-{self.parts[name]:06d}.parquet"
                write_table_atomic(path, table, root=self.root)
                self.parts[name] += 1
                self.rows_written[name] += len(rows)
                if name in _COMPACTED and self.compact > 1 and self.parts[name] % self.compact == 0:
                    self._merge(path.parent, self.parts[name])
        except Exception as exc:  # disk full, read-only, removed directory: stop writing, keep training
            self.guard.fail("writing", exc)

    def _merge(self, folder: Path, parts: int) -> None:
        """Merge the last ``compact`` parts of a folder into one (``run.parts``). A merge that fails
        leaves its parts as they are (every row still read once) and stops merging; writing goes on."""
        try:
            run_parts.merge_parts(folder, parts - self.compact, parts - 1, root=self.root)
        except Exception as exc:
            self.compact = 0
            self.guard.fail("merging parts", exc)

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
