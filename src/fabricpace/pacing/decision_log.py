"""Rank 0's ``RUN/pacing.parquet``: decisions appended as parts on a writer thread, one table at close.

The pacer used to rewrite the whole ``pacing.parquet`` after every window with a decision, and joined
the previous write on the training thread first: a 200,000-step run with comm gating kept made 1,512
decisions and wrote the file 1,512 times, each time with every earlier row (O(n²) rows written), and
any slow write held the training thread at the next decision.

Now the training thread only queues the new decisions (``add``: one queue put; and when pacing is
dropped mid-run it does not wait for the writer either, ``close(timeout_s=0)``). A daemon thread
writes each batch as a part, ``RUN/pacing/rank-00000/part-NNNNNN.parquet`` (atomic, like every chunk),
so a killed job keeps what was written, and joins the parts into ``pacing.parquet`` whenever the rows
in parts reach the rows already joined (the file is rewritten at 1, 2, 4, 8 ... rows: at most about
twice the decisions' rows in all, and once the writer has handled its queue ``pacing.parquet`` holds
at least half of them — between writing a part and joining it, briefly less). ``close`` joins the
rest and removes ``pacing/``: a closed run has one ``pacing.parquet`` with every decision, as before
(0 rows when pacing decided nothing).

``pacing.parquet``'s schema metadata ``fabricpace.pacing_parts`` names the last part it holds: after
a crash, ``load_run`` reads ``pacing.parquet`` and the parts left in ``pacing/`` after that one, so
it has every decision that reached a part (and warns that some came from leftover parts).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Sequence
from pathlib import Path

from fabricpace.pacing.state import Decision
from fabricpace.run.schema import PACING_PARTS_KEY

log = logging.getLogger("fabricpace.pacing")

PARTS_KEY = PACING_PARTS_KEY  # schema metadata: the last part joined into pacing.parquet


def decisions_table(decisions: Sequence[Decision]):  # type: ignore[no-untyped-def]
    """The ``pacing`` table of ``decisions`` (contract columns, in order)."""
    from fabricpace.run.writer import to_table

    return to_table("pacing", {
        "step": [d.step for d in decisions],
        "rank": [d.rank for d in decisions],
        "policy": [d.policy for d in decisions],
        "action": [d.action for d in decisions],
        "value": [d.value for d in decisions],
        "reason": [d.reason for d in decisions],
    })


class DecisionLog:
    """Writes one rank's decisions under ``run_dir`` without blocking the caller (see module doc)."""

    def __init__(self, run_dir: str | Path, rank: int = 0) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "pacing.parquet"
        self.parts_dir = self.run_dir / "pacing" / f"rank-{rank:05d}"
        self._queue: queue.SimpleQueue[list[Decision] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.failed = False
        self.closed = False
        # Writer-thread state: parts written and not yet joined, rows joined, the next part's number.
        self._parts: list[tuple[Path, int]] = []
        self._joined_rows = 0
        self._next_part = 0
        self.parts_written = 0  # (for tests and the benchmark)
        self.joins = 0
        self.rows_written = 0  # rows written to parts and to pacing.parquet, all told

    # ------------------------------------------------------------------ caller (training thread)
    def add(self, decisions: Sequence[Decision]) -> None:
        """Queue ``decisions`` for writing (returns at once)."""
        if not decisions or self.failed or self.closed:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fabricpace-pacing-write", daemon=True)
                self._thread.start()
        self._queue.put(list(decisions))

    def close(self, timeout_s: float = 10.0) -> bool:
        """Write what is queued, join every part into pacing.parquet and remove the parts; waits at
        most ``timeout_s`` (a hung disk must not hang the job's exit; the observer's close_timeout_s
        default). ``timeout_s=0``: do not wait (pacing dropped mid-run, on the training thread): the
        writer finishes on its own thread. False when it did not finish in time."""
        if self.closed:
            return True
        self.closed = True
        with self._lock:
            thread = self._thread
        if thread is None:  # no decision: pacing.parquet with 0 rows (pacing was on, decided nothing)
            if not self.failed:
                try:
                    from fabricpace.run.writer import write_table_atomic

                    write_table_atomic(self.path, decisions_table([]))
                except Exception as exc:
                    self.failed = True
                    log.warning("could not write pacing.parquet (%s)", exc)
            return True
        self._queue.put(None)
        if timeout_s <= 0:
            return False
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("pacing.parquet: the writer did not finish within %.0f s; its parts stay in %s",
                        timeout_s, self.parts_dir)
            return False
        return True

    # ------------------------------------------------------------------ writer thread
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch: list[Decision] = []
            stop = item is None
            if item is not None:
                batch.extend(item)
            while not stop:  # everything queued meanwhile goes into the same part
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stop = True
                else:
                    batch.extend(more)
            if not self.failed:
                try:
                    if batch:
                        self._write_part(batch)
                    if stop or sum(n for _, n in self._parts) >= max(1, self._joined_rows):
                        self._join()
                    if stop:
                        self._remove_parts_dir()
                except Exception as exc:  # a full disk must not stop training; decisions stay in memory
                    self.failed = True
                    log.warning("could not write pacing.parquet (%s); decisions stay in memory, "
                                "no further warnings", exc)
            if stop:
                return

    def _write_part(self, batch: list[Decision]) -> None:
        from fabricpace.run.writer import write_table_atomic

        path = self.parts_dir / f"part-{self._next_part:06d}.parquet"
        write_table_atomic(path, decisions_table(batch))
        self._next_part += 1
        self._parts.append((path, len(batch)))
        self.parts_written += 1
        self.rows_written += len(batch)

    def _join(self) -> None:
        """pacing.parquet := its rows + every part's, in order; then the joined parts are removed."""
        if not self._parts:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        from fabricpace.run.writer import write_table_atomic

        tables = []
        if self.path.is_file() and self._joined_rows:
            tables.append(pq.read_table(self.path))
        tables += [pq.read_table(p) for p, _ in self._parts]
        table = pa.concat_tables([t.replace_schema_metadata(None) for t in tables], promote_options="default")
        last = self._parts[-1][0].stem.split("-")[-1]
        table = table.replace_schema_metadata({PARTS_KEY: last.encode()})
        write_table_atomic(self.path, table)
        self.joins += 1
        self.rows_written += table.num_rows
        self._joined_rows = table.num_rows
        parts, self._parts = self._parts, []
        for p, _ in parts:
            with contextlib.suppress(OSError):
                p.unlink()

    def _remove_parts_dir(self) -> None:
        for d in (self.parts_dir, self.parts_dir.parent):
            with contextlib.suppress(OSError):
                d.rmdir()  # only when empty: nothing but joined parts is ever removed
