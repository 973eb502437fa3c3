"""Parser for nccl-tests stdout logs (all_reduce_perf, all_gather_perf, reduce_scatter_perf, ...).

The format is the one nccl-tests prints: a header of ``#`` comment lines (``# nThread 1 nGpus 1 minBytes
... maxBytes ...``, ``# Using devices``, one ``#  Rank  N Group G Pid P on HOST device D [...] NAME`` line
per rank), a two-line column header (with or without the ``root`` column, which older versions lack),
then one row per size: ``size count type redop [root] time algbw busbw #wrong time algbw busbw #wrong``
(out-of-place, then in-place), and the ``# Avg bus bandwidth`` trailer. Launcher prefixes such as
``[1,0]<stdout>:`` and interleaved ``NCCL INFO`` lines are tolerated. A row that starts like a result row
but does not parse is an error naming ``file:line``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fabricpace._errors import ParseError

# how nccl-tests names its binaries -> our op names (all_to_all is our name for alltoall)
_OP_ALIASES = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "sendrecv": "sendrecv",
}
_PREFIX = re.compile(r"^\s*\[\d+,\d+\]<std(?:out|err)>:")
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)")
_HEADER = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
_OP_IN_TEXT = re.compile(r"(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|sendrecv|reduce)_perf")


@dataclass(frozen=True)
class NcclTestsRow:
    """One result row: size in bytes, then out-of-place and in-place time (us), algbw and busbw (GB/s)."""

    size: int
    count: int
    type: str
    redop: str
    root: int
    time_us: float
    algbw: float
    busbw: float
    inplace_time_us: float
    inplace_algbw: float
    inplace_busbw: float


@dataclass(frozen=True)
class NcclTestsLog:
    """A parsed nccl-tests log. ``op`` is None when neither the text nor the file name tells it."""

    path: str
    op: str | None
    nranks: int | None
    nodes: int | None
    hosts: tuple[str, ...]
    rows: tuple[NcclTestsRow, ...]
    avg_busbw: float | None = None
    gpus_per_node: int | None = field(default=None)

    def sizes(self) -> np.ndarray:
        return np.array([r.size for r in self.rows], dtype=np.int64)

    def times_us(self, *, inplace: bool = False) -> np.ndarray:
        return np.array([r.inplace_time_us if inplace else r.time_us for r in self.rows])

    def busbw(self, *, inplace: bool = False) -> np.ndarray:
        return np.array([r.inplace_busbw if inplace else r.busbw for r in self.rows])


def _num(text: str) -> float:
    if text.upper() in ("N/A", "NAN", "-"):
        return math.nan
    return float(text)


def _op_from(text: str | None) -> str | None:
    if not text:
        return None
    m = _OP_IN_TEXT.search(text.lower())
    return _OP_ALIASES[m.group(1)] if m else None


def _nodes_from_name(name: str) -> int | None:
    """'n4_all_reduce.log', 'allreduce-16nodes.txt' -> 4, 16 (when the log lists no ranks)."""
    m = re.search(r"(?:^|[^a-z0-9])n(\d+)(?:[^0-9]|$)|(\d+)[-_]?nodes?", name.lower())
    if not m:
        return None
    return int(m.group(1) or m.group(2))


def parse_log(path: str | Path, *, op: str | None = None, nodes: int | None = None) -> NcclTestsLog:
    """Parse an nccl-tests stdout log. ``op`` / ``nodes`` override what the log says (or does not say).

    The op comes from (in order) ``op``, a ``*_perf`` command in the text, the file name. Nodes come from
    ``nodes`` or the distinct host names of the ``Rank`` lines. Raises ParseError with ``file:line``.
    """
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise ParseError(f"{p}: cannot read ({exc.strerror or exc}); give a readable nccl-tests log") from exc
    if op is not None:
        key = op.lower().replace("-", "_")
        if key not in _OP_ALIASES:
            raise ParseError(
                f"{p}: op {op!r} unknown; use one of {', '.join(sorted(set(_OP_ALIASES.values())))}"
            )
        op = _OP_ALIASES[key]

    ranks: dict[int, str] = {}
    devices: dict[int, int] = {}
    has_root: bool | None = None
    rows: list[NcclTestsRow] = []
    avg: float | None = None
    seen_header = False
    found_op = op
    for lineno, raw in enumerate(lines, start=1):
        line = _PREFIX.sub("", raw).strip()
        if not line:
            continue
        if found_op is None and "_perf" in line:
            found_op = _op_from(line)
        if line.startswith("#"):
            if _HEADER.match(line):
                seen_header = True
            m = _RANK.match(line)
            if m:
                ranks[int(m.group(1))] = m.group(2)
                devices[int(m.group(1))] = int(m.group(3))
                continue
            low = line.lower()
            if "redop" in low and "size" in low:
                has_root = "root" in low.split()
            elif low.startswith("# avg bus bandwidth"):
                try:
                    avg = float(line.split(":", 1)[1].split()[0])
                except (IndexError, ValueError) as exc:
                    raise ParseError(
                        f"{p}:{lineno}: cannot read the average bus bandwidth in {line!r}"
                    ) from exc
            continue
        if not line[0].isdigit():
            continue  # launcher output and NCCL INFO lines between the header and the table
        if has_root is None:
            if seen_header or ranks:
                raise ParseError(
                    f"{p}:{lineno}: result row before the column header (# size count type redop ...); "
                    "give the complete nccl-tests output"
                )
            continue  # a number-led line of something else before any nccl-tests header
        parts = line.split()
        expect = 13 if has_root else 12
        if len(parts) != expect:
            raise ParseError(
                f"{p}:{lineno}: expected {expect} columns (size count type redop{' root' if has_root else ''}"
                f" time algbw busbw #wrong time algbw busbw #wrong), found {len(parts)}; fix or drop the line"
            )
        try:
            base = 5 if has_root else 4
            row = NcclTestsRow(
                size=int(parts[0]),
                count=int(parts[1]),
                type=parts[2],
                redop=parts[3],
                root=int(parts[4]) if has_root else -1,
                time_us=_num(parts[base]),
                algbw=_num(parts[base + 1]),
                busbw=_num(parts[base + 2]),
                inplace_time_us=_num(parts[base + 4]),
                inplace_algbw=_num(parts[base + 5]),
                inplace_busbw=_num(parts[base + 6]),
            )
        except ValueError as exc:
            raise ParseError(
                f"{p}:{lineno}: cannot read a number in {line!r}; fix or remove this line"
            ) from exc
        if row.size < 0 or not row.time_us >= 0:
            raise ParseError(f"{p}:{lineno}: negative size or time in {line!r}")
        rows.append(row)
    if not rows:
        raise ParseError(
            f"{p}: no nccl-tests result table found (expected '#  size  count  type  redop ...' and rows); "
            "give the stdout of all_reduce_perf / all_gather_perf"
        )
    if found_op is None:  # the file name, e.g. n4_all_gather.log or allreduce-16n.txt
        name = p.name.lower().replace("-", "_")
        for key in sorted(_OP_ALIASES, key=len, reverse=True):
            if key in name:
                found_op = _OP_ALIASES[key]
                break
    hosts = tuple(sorted(set(ranks.values())))
    nranks = (max(ranks) + 1) if ranks else None
    if nodes is not None:
        n_nodes: int | None = nodes
    elif nranks is not None and len(ranks) < nranks:
        # an abridged rank list ("...") hides hosts: GPUs per node = highest device index + 1
        n_nodes = nranks // (max(devices.values()) + 1)
    else:
        n_nodes = len(hosts) or _nodes_from_name(p.name)
    gpn = nranks // n_nodes if nranks and n_nodes and nranks % n_nodes == 0 else None
    return NcclTestsLog(
        path=str(p),
        op=found_op,
        nranks=nranks,
        nodes=n_nodes,
        hosts=hosts,
        rows=tuple(rows),
        avg_busbw=avg,
        gpus_per_node=gpn,
    )
