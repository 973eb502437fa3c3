"""The result table of an nccl-tests text log: the row record, the layout its header names, one row read.

``row_layout`` reads the column header (``size count type redop root time algbw busbw #wrong ...``) into a
``RowLayout``: which optional columns this nccl-tests version or fork printed (``redop``, ``root``, the
per-iteration ``i_min i_max i_p99 i_cv%`` block, the ``-S 1`` date-time, ``#wrong`` counts, trailing
columns such as rccl-tests' ``algo proto nchannels``). ``parse_row`` reads one result line laid out that
way into an ``NcclTestsRow``, also when its redop is blank or its out-of-place block is missing, and
raises ``ParseError`` naming ``file:line`` when it does not fit. Finding the header and the rows among a
log's other lines is ``nccl_tests.parse_lines``'s part; the JSON file (``nccl_tests_json``) gives the
same rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from fabricpace._errors import ParseError

_BASE = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")
_PER_ITER = ("i_min", "i_max", "i_p99", "i_cv%")


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
    # values nccl-tests found wrong (#wrong of the out-of-place and in-place results together; 0 when the
    # log does not check them, -c 0, or has no #wrong column): a non-zero count means a bad GPU, NIC or link
    wrong: int = 0


@dataclass(frozen=True)
class RowLayout:
    """Where the numbers sit in a row, from the column header (which columns nccl-tests added)."""

    root: bool
    per_iter: bool
    timestamp: bool
    redop: bool = True
    # the header names '#wrong' columns (nccl-tests from 2019 on); older logs print a max 'error' there,
    # which a correct float reduction can leave above zero, so it is not read as a count
    wrong: bool = False
    # trailing columns the parser does not read (rccl-tests -A 1: algo proto nchannels)
    extra: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        half = _BASE[5:] + (_PER_ITER if self.per_iter else ())
        head = _BASE[:3] + (("redop",) if self.redop else ()) + (("root",) if self.root else ())
        return head + half + half + (("date", "time") if self.timestamp else ()) + self.extra

    @property
    def out_of_place(self) -> int:
        """Index of the out-of-place time column (algbw and busbw follow it)."""
        return 3 + int(self.redop) + int(self.root)

    @property
    def in_place(self) -> int:
        """Index of the in-place time column."""
        return self.out_of_place + (8 if self.per_iter else 4)


def row_layout(header: str) -> RowLayout:
    cols = header.split()
    lay = RowLayout(
        root="root" in cols, per_iter="i_min" in cols, timestamp="timestamp" in cols, redop="redop" in cols,
        wrong=any(c.endswith("#wrong") for c in cols),
    )
    # a header column beyond the known ones is an extra trailing row column ("timestamp" heads two: date time)
    known = len(lay.names) - (1 if lay.timestamp else 0)
    extra = tuple(c for c in cols[known:] if c != "timestamp")
    return replace(lay, extra=extra) if extra else lay


def _num(text: str) -> float:
    if text.upper() in ("N/A", "NAN", "-NAN", "-"):
        return math.nan
    return float(text)


def _count(text: str) -> int:
    """A #wrong value: the count, or 0 where it is not a number (N/A with -c 0)."""
    try:
        v = float(text)
    except ValueError:
        return 0
    return int(v) if math.isfinite(v) and v > 0 else 0


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_row(p: Path, lineno: int, text: str, lay: RowLayout) -> tuple[NcclTestsRow, bool]:
    """One result row laid out as ``lay`` and whether it had in-place numbers only; ParseError naming
    ``file:line`` if it does not fit."""
    parts = text.split()
    names = lay.names
    half = 8 if lay.per_iter else 4  # columns of one out-of-place or in-place block
    if lay.redop and len(parts) in (len(names) - 1, len(names) - 1 - half) and _is_number(parts[3]):
        # the op name was "" (all_gather/alltoall in several nccl-tests versions and forks print it with %6s):
        # the redop column is blank, so the row is one column short; the slot holds root or time, a number
        parts.insert(3, "none")
    inplace_only = len(parts) == len(names) - half
    if inplace_only:
        # the out-of-place block printed as blanks (writeBenchMarkLineNullBody: a fork's -O 0, trace replay):
        # the in-place block follows the root column; its numbers stand for the row
        at = lay.out_of_place
        parts = parts[:at] + parts[at : at + half] + parts[at:]
    if len(parts) != len(names):
        raise ParseError(
            f"{p}:{lineno}: expected {len(names)} columns ({' '.join(names)}), found {len(parts)}; "
            "fix or drop the line"
        )
    t_out, t_in = lay.out_of_place, lay.in_place
    try:
        row = NcclTestsRow(
            size=int(parts[0]),
            count=int(parts[1]),
            type=parts[2],
            redop=parts[3] if lay.redop else "none",
            root=int(parts[t_out - 1]) if lay.root else -1,
            time_us=_num(parts[t_out]),
            algbw=_num(parts[t_out + 1]),
            busbw=_num(parts[t_out + 2]),
            inplace_time_us=_num(parts[t_in]),
            inplace_algbw=_num(parts[t_in + 1]),
            inplace_busbw=_num(parts[t_in + 2]),
            # an in-place-only row's out-of-place block is a copy of its in-place one: count it once
            wrong=_count(parts[t_in + 3]) + (0 if inplace_only else _count(parts[t_out + 3]))
            if lay.wrong
            else 0,
        )
    except ValueError as exc:
        raise ParseError(f"{p}:{lineno}: cannot read a number in {text!r}; fix or remove this line") from exc
    if row.size < 0 or row.time_us < 0:
        raise ParseError(f"{p}:{lineno}: negative size or time in {text!r}; fix or remove this line")
    return row, inplace_only
