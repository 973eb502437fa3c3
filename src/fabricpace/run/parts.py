"""Part files of chunked tables: their names, which of them hold a rank's rows, and merging them.

A rank writes its rows of a chunked table as ``part-000000.parquet``, ``part-000001.parquet``, ... The
observer writes a part about every 15 seconds so that a killed job loses little; over a day that is
~5,800 files per rank and table (11.8 million for 1,024 ranks), which shared file systems list and
open slowly. So every ``K`` consecutive parts are merged into one file named by the numbers it covers,
``part-000000-000063.parquet`` (one row group per merged part, so step statistics per row group stay as
fine as before), and then removed. A process killed between the merged file's rename and the last
removal leaves both: a merged file supersedes every part whose number it covers, so no row is read twice
and none is lost at any instant.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

import pyarrow.parquet as pq

from fabricpace.run.writer import RunRoot

_NAME = re.compile(r"part-(\d+)(?:-(\d+))?\.parquet")


def part_span(name: str) -> tuple[int, int] | None:
    """(first, last) part number a file name covers: ``part-000012.parquet`` -> (12, 12),
    ``part-000000-000063.parquet`` -> (0, 63); None for any other name (or a range that runs backwards)."""
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) is not None else first
    return (first, last) if last >= first else None


def live_parts(names: Iterable[str]) -> list[tuple[int, int, str]]:
    """The part files of one rank's folder that hold its rows, as (first, last, name) in order: a part
    covered by a merged file (left behind by a merge that was cut short) is dropped. Names that are not
    parts are ignored."""
    spans = sorted(
        ((s[0], s[1], n) for n in names if (s := part_span(n)) is not None), key=lambda t: (t[0], -t[1])
    )
    out: list[tuple[int, int, str]] = []
    reach = -1  # the last number covered by a file kept so far (each starts at or before this one)
    for first, last, name in spans:
        if last <= reach:
            continue
        out.append((first, last, name))
        reach = last
    return out


def merge_parts(folder: Path, first: int, last: int, *, root: RunRoot | None = None) -> Path | None:
    """Merge ``part-FIRST`` .. ``part-LAST`` of ``folder`` into ``part-FIRST-LAST.parquet`` (each part one
    row group), then remove them; None (nothing changed) when none of them is there or their columns
    differ.

    Written to a temporary name and renamed, like every part; only then are the parts removed, so at
    any instant every row is in a file that readers take (``live_parts``)."""
    paths = [p for i in range(first, last + 1) if (p := folder / f"part-{i:06d}.parquet").exists()]
    if not paths:
        return None
    tables = [pq.read_table(p) for p in paths]
    schema = tables[0].schema
    if any(not t.schema.equals(schema) for t in tables[1:]):
        return None  # (columns added on the way: such parts stay as they are)
    out = folder / f"part-{first:06d}-{last:06d}.parquet"
    if root is not None:
        root.check()
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as w:
            for t in tables:
                w.write_table(t)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    for p in paths:
        p.unlink(missing_ok=True)
    return out
