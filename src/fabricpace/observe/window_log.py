"""Rank 0's record of every window summary (``RUN/windows.parquet``), in bounded memory.

Every rank receives all ranks' summaries each window. Keeping them as Python objects for the whole run
costs ~1.5 MB per window at 2,048 ranks (3 GB per process after 100,000 steps at a 50-step window, on
every rank). Only rank 0 writes them: it keeps each window as one compact float64 matrix, hands a part
to the writer thread once ``part_rows`` rows are buffered (``RUN/windows/rank-00000/part-*.parquet``,
atomic like every chunk, so a killed job keeps them: every 32 windows at 2,048 ranks, never during
the run of a small job, whose windows cost nothing to keep) and at close streams the parts into
``windows.parquet`` one part at a time, then removes them.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fabricpace.observe.chunks import ChunkSink, windows_table
from fabricpace.run.window import WindowSummary, summary_matrix


class WindowLog:
    """Buffers rank 0's windows and writes them as parts, then as one file at close."""

    def __init__(self, sink: ChunkSink, *, part_rows: int = 65_536) -> None:
        self.sink = sink
        self.part_rows = part_rows  # 65,536 rows x 25 float64 = 13 MB at most in memory
        self._buffer: list[np.ndarray] = []
        self._rows = 0
        self.windows = 0

    def add(self, summaries: Sequence[WindowSummary]) -> None:
        """Keep one window (a failure turns writing off, like any chunk's; training goes on)."""
        if not self.sink.enabled:
            return
        try:
            self._buffer.append(summary_matrix(summaries))
            self._rows += len(summaries)
            self.windows += 1
            if self._rows >= self.part_rows:
                self._flush()
        except Exception as exc:
            self.sink.guard.fail("writing", exc)

    def _flush(self) -> None:
        if self._buffer:
            buf, self._buffer, self._rows = self._buffer, [], 0
            self.sink.submit({"windows": buf}, 0)

    def finish(self, run_dir: Path) -> None:
        """After the sink drained: the last part inline, then every part into windows.parquet."""
        if self._buffer:
            buf, self._buffer, self._rows = self._buffer, [], 0
            self.sink.write_now({"windows": buf}, 0)
        parts_dir = run_dir / "windows"
        parts = sorted(parts_dir.glob("rank-*/part-*.parquet"))
        if not parts:
            return
        out = run_dir / "windows.parquet"
        tmp = out.with_name(f".{out.name}.tmp")
        schema = windows_table(0, [], 0).schema
        writer: Any = pq.ParquetWriter(tmp, schema)
        try:
            for part in parts:
                writer.write_table(pa.Table.from_batches(pq.read_table(part).to_batches(), schema=schema))
        finally:
            writer.close()
        tmp.replace(out)
        shutil.rmtree(parts_dir, ignore_errors=True)
