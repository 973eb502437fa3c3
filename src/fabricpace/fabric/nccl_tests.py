"""Parser for nccl-tests stdout logs (all_reduce_perf, all_gather_perf, reduce_scatter_perf, ...).

The format is the one nccl-tests prints (``src/common.cu``; ``src/util.cu`` from 2.17 on): optional
``# nccl-tests version ...`` and ``# Collective test starting: X_perf`` lines, ``# nThread T nGpus G ...``,
one ``#  Rank R [Group C] [Pid P] on HOST device D [bus id] NAME`` line per rank, a column header, then one
row per size: ``size count type redop [root] time algbw busbw #wrong time algbw busbw #wrong`` (out-of-place,
then in-place; ``root`` is missing before 2019, ``#wrong`` is ``N/A`` with ``-c 0``; ``redop`` is blank where
a test passes "" as the op name -- all_gather/alltoall in several versions and forks -- and absent from the
2019 all_gather layout ``size count type time ...``; columns the header names after these, such as rccl-tests'
``algo proto nchannels`` (``-A 1``), are carried and not read), with four
``i_min i_max i_p99 i_cv%`` columns after each ``#wrong`` under per-iteration timing and a date-time column
at the end with ``-S 1``; then the ``# Avg bus bandwidth`` trailer.

Logs come from clusters as launchers and log systems wrote them, so each line may carry prefixes, stacked
in any order: Open MPI 4/5 output tags and timestamps (``[1,0]<stdout>:``,
``Mon Jun 16 10:00:00 2025[1,0]<stdout>:``, ``[1,0][host:pid]<stdout>: ``), MPICH ``-prepend-rank``
(``[0] ``), Slurm ``srun -l`` (`` 0: ``), ``kubectl logs --timestamps`` and CRI log files
(``2025-06-18T10:00:00.123456789Z [stdout F] ``), SkyPilot/Ray (``(head, rank=0, pid=3808) ``). A prefix
not in that list still works: header lines are found by their text and result rows by their
``size count type`` start. ``NCCL INFO`` and launcher lines are skipped; CRLF line ends, UTF-16 files
(Windows PowerShell ``>``), terminal escape codes (colour) and tables copied from a rendered page
(``1024 | 512 | half | ...``) are read, also from gzip/bzip2/xz files. The ``-J`` JSON file of nccl-tests
2.17+ is read by ``nccl_tests_json``.

Read with a note (``NcclTestsLog.notes``): ``-d all`` / ``-o all`` (one sweep per type / op in one table:
the float/sum sweep is used), rows whose out-of-place block is blank (a fork's ``-O 0``, trace replay: the
in-place numbers are used), a run that failed or timed out after some rows (``Test NCCL failure``,
``Test timeout``: the rows before are used).

What is refused, with ``file:line`` and the fix: a row that starts like a result row but does not parse
(unless it is the last row of a log that stops there: a job killed mid-row, whose complete rows are kept),
a second nccl-tests header before any result (an nccl-tests built without ``MPI=1``, where every process
ran its own test; or a run of a sweep that failed before its first row: the line of its failure), ranks split
into groups (``NCCL_TESTS_SPLIT_MASK``), ranks spread unevenly over the hosts, a rank list that stops inside
a host (a pasted log cut short), an abridged rank list whose device indices do not count GPUs per node
(every rank prints ``device 0``) when neither the ranks listed, the file name nor the caller's hint tell
them (``nccl_tests_layout``), an empty file, rccl-tests' ``-x/-Z`` output files (no host names, so no
node count). Rows whose
out-of-place time is not a positive finite number (``inf``, ``nan``, ``0.00``) are not measurements: they
are dropped and counted in ``NcclTestsLog.dropped_rows``.

Several complete runs in one file (a sweep's output: all_reduce_perf then all_gather_perf, or one op at
several settings) are read by ``nccl_tests_runs.parse_logs``, one log per run, which every command uses;
``parse_log`` reads one run and refuses a second (``SecondRun``: the line, and the commands that split the
file there).

This module finds a log's lines and runs; the table's column layout and its rows are read by
``nccl_tests_table``.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fabricpace._errors import ParseError
from fabricpace.fabric.nccl_tests_layout import LayoutHint, abridged_per_node
from fabricpace.fabric.nccl_tests_table import NcclTestsRow, RowLayout, parse_row, row_layout

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
# C ctime() ("Mon Jun  2 10:00:00 2025"), Open MPI's timestamp; [ ] because _PREFIX is a verbose regex
_CTIME = r"[A-Z][a-z]{2}[ ][A-Z][a-z]{2}[ ][ \d]\d[ ]\d\d:\d\d:\d\d[ ]\d{4}"
# One launcher / log-system prefix at the start of a line; stripped repeatedly (they stack). In order:
# kubectl --timestamps / CRI log files; Open MPI output tags, 4.x (ORTE: "CTIME[1,0]<stdout>:") and 5.x
# (PMIx: "[CTIME][1,0]<stdout>: ", tag-detailed "[1,0][host:pid]<stdout>: ", tag-fullname
# "[prterun-h-1@1,0]<stdout>: ", rank "[0]<stdout>: "); MPICH/Intel MPI (Hydra) -prepend-rank "[0] ";
# SkyPilot/Ray "(head, rank=0, pid=3808) "; Slurm srun -l " 0: ".
_PREFIX = re.compile(
    r"""\s*(?:
      \d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?(?:\s+std(?:out|err)\s+[FP])?(?:\s|$)
    | (?:\[CTIME\]|CTIME)?(?:\[(?:[^\]\s]*,)?\d+\](?:\[[^\]\s]*:\d+\])?)?<std(?:out|err|diag)>:
    | \[\d+\](?:\s|$)
    | \([^()]*\bpid=\d+[^()]*\)(?:\s|$)
    | \d+:(?:\s|$)
    )""".replace("CTIME", _CTIME),
    re.X,
)
_RANK = re.compile(
    r"(?:^|#)\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?(?:Pid\s+\d+\s+)?on\s+(\S+)\s+device\s+(\d+)"
)
_HEADER = re.compile(r"(?:^|#)\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
# 2019-era all_gather/alltoall headers have no redop (and no root) column: "size count type time ..."
_COLUMNS = re.compile(r"\bsize\s+count\s+type\s+(?:redop|time)\b")
_AVG = re.compile(r"(?:^|#)\s*Avg bus bandwidth\s*:\s*(\S*)")
_STARTING = re.compile(r"Collective test starting:\s*(\S+)")
_OUT_OF_BOUNDS = re.compile(r"Out of bounds values\s*:\s*(\d+)")
_OP_IN_TEXT = re.compile(r"(all_reduce|all_gather|reduce_scatter|alltoall|broadcast|sendrecv|reduce)_perf")
# nccl-tests' type names across versions (NCCL 1: char/int); a row found behind an unknown prefix must
# start with "size count TYPE redop" so that numbers in launcher output are never taken for a row.
_TYPES = "int8|uint8|int32|uint32|int64|uint64|half|float|double|bfloat16|f8e4m3|f8e5m2|char|int"
_ROW_START = re.compile(r"\d+\s+\d+(?:\s|$)")
# the redop word is missing where the op name was "" (all_gather/alltoall of several nccl-tests versions)
_ROW_ANYWHERE = re.compile(r"(?<![\w.:-])\d+\s+\d+\s+(?:" + _TYPES + r")\s+(?:[A-Za-z_]\w*\s+)?-?\d")
# terminal escape sequences (colour, cursor) that log viewers and `script` captures leave in a file
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
# how nccl-tests reports a run that stopped: "HOST: Test NCCL failure common.cu:...", "Test timeout (30s)",
# "# TEST SKIPPED: <reason>" (2.28+: e.g. a device API the system lacks)
# share of a row's time that a row of 1/8 its size (or less) may take in a healthy run (stalled_pair)
_STALLED = 0.7
_FAILURE = re.compile(r"\bTest (?:NCCL |CUDA )?(?:failure|timeout)\b.*|\bTEST SKIPPED\b.*")


@dataclass(frozen=True)
class NcclTestsLog:
    """A parsed nccl-tests log. ``op`` is None when neither the text nor the file name tells it.

    ``truncated_at``: the line of a cut-off last row that was left out (the run was killed there);
    ``dropped_rows``: rows without a measured time (``inf``/``nan``/``0``) that were left out.
    """

    path: str
    op: str | None
    nranks: int | None
    nodes: int | None
    hosts: tuple[str, ...]
    rows: tuple[NcclTestsRow, ...]
    avg_busbw: float | None = None
    gpus_per_node: int | None = field(default=None)
    truncated_at: int | None = None
    dropped_rows: int = 0
    # "-d all" / "-o all": the table held several (type, redop) sweeps; ``rows`` is one of them
    # (float/sum when present), these are the others, e.g. ("int8/sum", "half/sum")
    other_sweeps: tuple[str, ...] = ()
    # rows whose out-of-place block was blank (a fork's -O 0, trace replay): their times are in-place
    inplace_only_rows: int = 0
    # a "Test NCCL failure" / "Test timeout" line after the rows: (line, text); the rows before it are kept
    failed_at: tuple[int, str] | None = None
    # one run of a file that holds several (nccl_tests_runs.parse_logs): (index from 1, first line, last line)
    run: tuple[int, int, int] | None = None
    # the "# Out of bounds values : N FAILED" trailer's N (0 for "0 OK", None without the trailer)
    out_of_bounds: int | None = None
    # how the node layout was assumed where the rank lines could not tell it (nccl_tests_layout), for a note
    assumed: str | None = None
    # the path suffix that tells this file from others of the same base name given with it
    # (nccl_tests_runs.distinct_names: 'n2.g4/all_reduce_output.dat.5'); None: the base name does
    shown: str | None = None

    @property
    def wrong_rows(self) -> tuple[NcclTestsRow, ...]:
        """Rows with a non-zero ``#wrong``: their results were wrong, so their times are not those of a
        healthy cluster; calibration and ``--compare`` leave them out."""
        return tuple(r for r in self.rows if r.wrong > 0)

    def stalled_pair(self) -> tuple[NcclTestsRow, NcclTestsRow] | None:
        """(smaller row, larger row): the pair of healthy rows, the larger at least 8x the smaller, where
        the smaller took the largest share of the larger's time, when that share is ``_STALLED`` or more.

        From 32 MiB per rank on, a healthy run's time grows with the size: on every clean log of
        tests/fabric/data an all-reduce row takes at most 48% of the time of a row 8x its size (0.13-0.36
        on most clusters). Two held-out Alps jobs did not (0.81: 64 MiB in 32.4 ms, 1 GiB in 40.1 ms; 1.03:
        256 MiB in 94.7 ms, 4 GiB in 92.2 ms) and their repeats were 2-14x faster: degraded jobs, which
        no model of the cluster predicts. Only sizes of 32 MiB per rank or more are checked: for
        all-gather, reduce-scatter and all-to-all that is size / ranks (a p5 all-gather at 256 ranks,
        latency-bound at 32-256 MiB of total size, takes 87%)."""
        if self.op in ("all_gather", "reduce_scatter", "all_to_all"):
            if not self.nranks:
                return None
            per_rank = self.nranks
        else:
            per_rank = 1
        rows = [r for r in self.rows if r.wrong == 0 and r.time_us > 0 and r.size // per_rank >= 32 << 20]
        pairs = [(a.time_us / b.time_us, a, b) for a in rows for b in rows if b.size >= 8 * a.size]
        if not pairs:
            return None
        share, a, b = max(pairs, key=lambda p: p[0])
        return (a, b) if share >= _STALLED else None

    @property
    def name(self) -> str:
        """The file's name, and which run of it this is when it holds several: 'sweep.log (run 2, lines
        38-75)'."""
        return self.file_name + self._run_suffix()

    @property
    def file_name(self) -> str:
        """The file's base name, or the shortest path suffix that tells it from the other files of that base
        name given with it (``shown``)."""
        return self.shown or Path(self.path).name

    @property
    def label(self) -> str:
        """``path`` as given, and which run of the file this is (for messages naming the file)."""
        return self.path + self._run_suffix()

    def _run_suffix(self) -> str:
        return "" if self.run is None else f" (run {self.run[0]}, lines {self.run[1]}-{self.run[2]})"

    def notes(self) -> list[str]:
        """What a reader of this log should know before fitting to it: rows left out, and why."""
        # a note with a line number names the file's line (the same in a file of several runs)
        name, file, out = self.name, self.file_name, []
        if self.assumed:
            out.append(f"note: {name}: {self.assumed}")
        if self.rows and self.other_sweeps:
            r = self.rows[0]
            out.append(
                f"note: {name}: the table holds {len(self.other_sweeps) + 1} type/op sweeps (-d all / -o "
                f"all); using the {r.type}/{r.redop} rows, leaving out {', '.join(self.other_sweeps)}"
            )
        if self.inplace_only_rows:
            out.append(
                f"note: {name}: {self.inplace_only_rows} rows have no out-of-place numbers (-O 0 or trace "
                "replay); their in-place times are used"
            )
        last = _human_bytes(self.rows[-1].size) if self.rows else "-"
        if self.failed_at is not None:
            line, text = self.failed_at
            out.append(
                f"note: {file}:{line}: the run failed here ({text!r}); using its {len(self.rows)} rows up to "
                f"{last}; rerun for the larger sizes"
            )
        elif self.truncated_at is not None:
            out.append(
                f"note: {file}:{self.truncated_at}: the log stops in the middle of this row (the job was "
                f"killed); using the {len(self.rows)} complete rows up to {last}"
            )
        if self.dropped_rows:
            out.append(
                f"note: {name}: {self.dropped_rows} rows without a measured time (inf, nan or 0 us) left out"
            )
        wrong = self.wrong_rows
        trailer = f"'Out of bounds values : {self.out_of_bounds} FAILED'" if self.out_of_bounds else ""
        if wrong:
            shown = ", ".join(f"{_human_bytes(r.size)} {r.wrong}" for r in wrong[:8])
            rows = "1 row reports" if len(wrong) == 1 else f"{len(wrong)} rows report"
            out.append(
                f"note: {name}: {rows} wrong results (out-of-place + in-place #wrong: {shown}"
                f"{', ...' if len(wrong) > 8 else ''}{'; ' + trailer if trailer else ''}); left out: wrong "
                "results usually point to a bad GPU, NIC or link, whose timings should not define the "
                "cluster (check the hardware and rerun)"
            )
        elif trailer:
            out.append(
                f"note: {name}: the run reports {trailer}, but no row's #wrong says which sizes; its timings "
                "are used, though wrong results usually point to a bad GPU, NIC or link (check and rerun)"
            )
        stalled = self.stalled_pair()
        if stalled is not None:
            a, b = stalled
            share = a.time_us / b.time_us
            out.append(
                f"note: {name}: {_human_bytes(a.size)} took {a.time_us:g} us, {share:.0%} of the "
                f"{b.time_us:g} us of {_human_bytes(b.size)} ({b.size // a.size}x the bytes): a run whose "
                "time stops growing with the size is degraded (congestion, retries, a failing link), and no "
                "model of the cluster predicts it; rerun the job before fitting or comparing with it"
            )
        return out

    def sizes(self) -> np.ndarray:
        return np.array([r.size for r in self.rows], dtype=np.int64)

    def times_us(self, *, inplace: bool = False) -> np.ndarray:
        return np.array([r.inplace_time_us if inplace else r.time_us for r in self.rows])

    def busbw(self, *, inplace: bool = False) -> np.ndarray:
        return np.array([r.inplace_busbw if inplace else r.busbw for r in self.rows])


def _human_bytes(n: int) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n} B"


def _op_from(text: str | None) -> str | None:
    if not text:
        return None
    m = _OP_IN_TEXT.search(text.lower())
    return _OP_ALIASES[m.group(1)] if m else None


def _op_from_name(name: str) -> str | None:
    """The op in a file name, e.g. n4_all_gather.log or allreduce-16n.txt."""
    key = name.lower().replace("-", "_")
    return next((_OP_ALIASES[k] for k in sorted(_OP_ALIASES, key=len, reverse=True) if k in key), None)


def _nodes_from_name(name: str) -> int | None:
    """'n4_all_reduce.log', 'allreduce-16nodes.txt', 'job-n-00032-N-0008.txt' -> 4, 16, 8 (when the log
    lists no ranks)."""
    slurm = _slurm_name(name)
    if slurm is not None:
        return slurm[1]
    m = re.search(r"(?:^|[^a-z0-9])n(\d+)(?:[^0-9]|$)|(\d+)[-_]?nodes?", name.lower())
    if not m:
        return None
    return int(m.group(1) or m.group(2))


# Slurm's letters, case and all: -n tasks, -N nodes. A job script that names its output after them
# ('job-n-00032-N-0008.txt', the CSCS Alps campaign's tables) gives both counts; without the case the
# lowercase 'n-00032' would read as 32 nodes.
_SLURM_TASKS_NODES = re.compile(r"(?<![A-Za-z0-9])n[-_]?(\d+)[-_]N[-_]?(\d+)(?![0-9])")
_SLURM_NODES_TASKS = re.compile(r"(?<![A-Za-z0-9])N[-_]?(\d+)[-_]n[-_]?(\d+)(?![0-9])")


def _slurm_name(name: str) -> tuple[int, int] | None:
    """(tasks, nodes) from a file name carrying Slurm's -n and -N counts, when they are consistent."""
    m = _SLURM_TASKS_NODES.search(name)
    tasks, nodes = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if not m:
        m = _SLURM_NODES_TASKS.search(name)
        if not m:
            return None
        nodes, tasks = int(m.group(1)), int(m.group(2))
    if nodes < 1 or tasks < nodes or tasks % nodes:
        return None
    return tasks, nodes


def _read_lines(p: Path) -> list[str]:
    """The file's lines: UTF-16 when it starts with a byte-order mark (PowerShell ``>``), else UTF-8; a
    gzip, bzip2 or xz file (archived job logs, ``.log.gz``) is decompressed first."""
    if p.is_dir():
        raise ParseError(f"{p}: a folder; give the nccl-tests logs in it ({p}/*.log)")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ParseError(f"{p}: cannot read ({exc.strerror or exc}); give a readable nccl-tests log") from exc
    for magic, name, decompress in (
        (b"\x1f\x8b", "gzip", gzip.decompress), (b"BZh", "bzip2", bz2.decompress),
        (b"\xfd7zXZ\x00", "xz", lzma.decompress),
    ):  # fmt: skip
        if raw.startswith(magic):
            try:
                raw = decompress(raw)
            except (OSError, EOFError, ValueError, lzma.LZMAError) as exc:  # a cut archive
                what = f"a {name} file that does not decompress ({exc})"
                raise ParseError(f"{p}: {what}; give the whole file") from exc
            break
    if raw[:2] in (b"\xff\xfe", b"\xfe\xff"):
        text = raw.decode("utf-16", errors="replace")
    else:
        text = raw.decode("utf-8-sig", errors="replace")
    return text.splitlines()  # \n, \r\n and \r alike


def _strip_prefixes(raw: str) -> str:
    line = _ANSI.sub("", raw) if "\x1b" in raw else raw
    if "|" in line:  # nccl-tests never prints '|': a table copied from a rendered page ('1024 | 512 | half')
        line = line.replace("|", " ")
    while (m := _PREFIX.match(line)) is not None and m.end() > 0:
        line = line[m.end() :]
    return line.strip()


def _canonical_op(p: Path, op: str | None) -> str | None:
    if op is None:
        return None
    key = op.lower().replace("-", "_")
    if key not in _OP_ALIASES:
        raise ParseError(f"{p}: op {op!r} unknown; use one of {', '.join(sorted(set(_OP_ALIASES.values())))}")
    return _OP_ALIASES[key]


class SecondRun(ParseError):
    """A second nccl-tests header in one file. ``rows``: result rows of the run before it (0: the header
    came before any result, which is not a second run); ``split``: the first line after that run's table
    (its last row or trailer), where the next run's own lines (command line, launcher output) begin.
    ``nccl_tests_runs.parse_logs`` splits a file there."""

    def __init__(self, message: str, *, rows: int, split: int, header: bool) -> None:
        super().__init__(message)
        # header: the next run announced itself (version, 'starting' or nThread line), not just a second
        # column header, which starts no run that could be read on its own
        self.rows, self.split, self.header = rows, split, header


def _second_run(
    p: Path, lineno: int, first: int, n_rows: int, what: str, split: int = 0, *, header: bool = True,
    failed: tuple[int, str] | None = None,
) -> SecondRun:
    """The error for a second nccl-tests header in one file (see the module docstring). ``split``: the
    first line after the first run's table (its last row or trailer), where the second run's own lines
    (its command line, launcher output) begin; ``failed``: the first run's failure line, if it said so."""
    if not n_rows and failed is not None:
        # a run of a sweep that failed before measuring ('Test NCCL failure', 'TEST SKIPPED'), then the next
        return SecondRun(
            f"{p}:{failed[0]}: the run whose header is at line {first} failed before any result "
            f"({failed[1]!r}), and another run starts at line {lineno}; rerun it, or delete its lines from "
            f"the file (up to line {lineno - 1})",
            rows=0, split=lineno, header=header,
        )
    if n_rows:
        at = split or lineno
        return SecondRun(
            f"{p}:{lineno}: a second nccl-tests run starts here ({what}) after {n_rows} result rows of the "
            f"first (line {first}); give one run per file: split the log at line {at} "
            f"(head -n {at - 1} {p.name} > run1.log; tail -n +{at} {p.name} > run2.log)",
            rows=n_rows, split=at, header=header,
        )
    return SecondRun(
        f"{p}:{lineno}: a second nccl-tests header ({what}; the first is at line {first}) before any "
        "result: every process ran its own test, so nccl-tests was built without MPI=1 (rebuild with "
        "'make MPI=1' and rerun), or the file holds several runs (give one complete run per file)",
        rows=0, split=lineno, header=header,
    )


def parse_log(
    path: str | Path, *, op: str | None = None, nodes: int | None = None, hint: LayoutHint | None = None
) -> NcclTestsLog:
    """Parse an nccl-tests stdout log. ``op`` / ``nodes`` override what the log says (or does not say).

    The op comes from (in order) ``op``, a ``*_perf`` name in the text, the file name. Nodes come from
    ``nodes`` or the distinct host names of the ``Rank`` lines (``-g 8`` / ``-t`` runs list one line per
    GPU under one process, so hosts, not processes, are counted); an abridged list is read by
    ``nccl_tests_layout``, where ``hint`` gives GPUs per node when neither the list nor the file name can;
    a table without rank lines takes its nodes from the file name (``n4_all_reduce.log``) and GPUs per
    node from ``hint`` (the log's ``assumed`` says what was assumed). Raises ParseError with ``file:line``.
    """
    p = Path(path)
    return parse_lines(p, _read_lines(p), op=op, nodes=nodes, hint=hint)


def parse_lines(
    p: Path, lines: list[str], *, op: str | None = None, nodes: int | None = None, start: int = 1,
    hint: LayoutHint | None = None,
) -> NcclTestsLog:
    """``parse_log`` on lines already read from ``p``: the whole file, or (``start`` > 1) the part of it that
    begins at line ``start`` (one run of several; ``nccl_tests_runs``), so that every ``file:line`` names
    the line of the file the user has."""
    found_op = _canonical_op(p, op)
    first = next((x.strip() for x in lines if x.strip()), "")
    if not first:
        raise ParseError(f"{p}: the file is empty; give the stdout of all_reduce_perf / all_gather_perf")
    if start == 1 and first.startswith("{"):  # nccl-tests -J file.json (2.17+)
        from fabricpace.fabric.nccl_tests_json import parse_json

        return parse_json(p, "\n".join(lines), op=found_op, nodes=nodes)
    if start == 1 and re.match(r"(?:numCycle,\s*)?collective,.*\bbusbw\b", first, re.I):  # rccl-tests -Z
        from fabricpace.fabric.nccl_tests_json import rccl_tests_output

        raise rccl_tests_output(p)
    ranks: dict[int, tuple[str, int]] = {}  # rank -> (host, device)
    rank_lines: dict[int, int] = {}  # rank -> its line
    groups: dict[int, int] = {}  # group (NCCL_TESTS_SPLIT_MASK colour) -> line of its first rank
    layout: RowLayout | None = None
    rows: list[NcclTestsRow] = []
    dropped = 0
    avg: float | None = None
    header_at: int | None = None  # line of the first "# nThread" header
    last_nccl = 0  # last line that was nccl-tests output (for "the run stopped after line N")
    pending: ParseError | None = None  # a bad row: fatal unless the log stops there (killed mid-row)
    pending_at = 0
    inplace_only = 0
    failed_at: tuple[int, str] | None = None
    out_of_bounds: int | None = None
    table_end = 0  # last line of the table: a row or a trailer line ('# Avg bus bandwidth', ...)
    for lineno, raw in enumerate(lines, start=start):
        line = _strip_prefixes(raw)
        if not line:
            continue
        if found_op is None and "_perf" in line:
            found_op = _op_from(line)
        # "size count ..." starts a row; a digit-led NCCL INFO line ("0666a154:88455:88455 [0] NCCL INFO",
        # hex host names are common) does not
        row_text: str | None = line if _ROW_START.match(line) else None
        if row_text is None:
            if (m := _STARTING.search(line)) is not None or "nccl-tests version" in line:
                if header_at is not None:  # 2.17+: a run announces itself before its nThread line
                    what = (
                        f"'Collective test starting: {m.group(1)}'" if m else "its 'nccl-tests version' line"
                    )
                    raise _second_run(p, lineno, header_at, len(rows), what, table_end + 1, failed=failed_at)
                last_nccl = lineno
                continue
            if _HEADER.search(line):
                if header_at is not None:
                    what = "its '# nThread' header"
                    raise _second_run(p, lineno, header_at, len(rows), what, table_end + 1, failed=failed_at)
                header_at = last_nccl = lineno
                continue
            if (m := _RANK.search(line)) is not None:
                rank, host, device = int(m.group(1)), m.group(3), int(m.group(4))
                if rank in ranks:
                    raise ParseError(
                        f"{p}:{lineno}: rank {rank} is listed twice ({ranks[rank][0]}, {host}): every "
                        "process ran its own test, so nccl-tests was built without MPI=1; rebuild with "
                        "'make MPI=1' and rerun"
                    )
                ranks[rank] = (host, device)
                rank_lines[rank] = lineno
                groups.setdefault(int(m.group(2) or 0), lineno)
                last_nccl = lineno
                continue
            if (m := _COLUMNS.search(line)) is not None:
                if rows:
                    what = "a second column header"
                    raise _second_run(
                        p, lineno, header_at or start, len(rows), what, table_end + 1, header=False
                    )
                layout = row_layout(line[m.start() :])
                last_nccl = lineno
                continue
            if "Out of bounds values" in line or "Collective test concluded" in line:
                if (m := _OUT_OF_BOUNDS.search(line)) is not None:
                    out_of_bounds = int(m.group(1))
                table_end = lineno
                continue
            if (m := _AVG.search(line)) is not None:
                table_end = lineno
                if pending is not None:
                    raise pending  # the bad row was not the end of the table
                if m.group(1):
                    try:
                        avg = float(m.group(1))
                    except ValueError as exc:
                        raise ParseError(
                            f"{p}:{lineno}: cannot read the average bus bandwidth in {line!r}"
                        ) from exc
                continue
            if header_at is not None and failed_at is None and (m := _FAILURE.search(line)) is not None:
                failed_at = (lineno, m.group(0).strip())
                continue
            if layout is not None and (m := _ROW_ANYWHERE.search(line)) is not None:
                row_text = line[m.start() :]  # a row behind a prefix this parser does not know
            else:
                continue  # launcher output, NCCL INFO lines, other '#' comments
        if layout is None:
            if header_at is not None or ranks:
                raise ParseError(
                    f"{p}:{lineno}: result row before the column header (# size count type redop ...); "
                    "give the complete nccl-tests output"
                )
            continue  # a number-led line of something else before any nccl-tests header
        try:
            row, no_out_of_place = parse_row(p, lineno, row_text, layout)
        except ParseError as exc:
            if pending is not None:
                raise pending from None
            pending, pending_at = exc, lineno
            continue
        if pending is not None:
            raise pending  # a good row after a bad one: the bad one is not a cut-off end
        if no_out_of_place:
            inplace_only += 1
        table_end = lineno
        if math.isfinite(row.time_us) and row.time_us > 0:
            rows.append(row)
        else:
            dropped += 1
    if pending is not None and not rows:
        raise pending
    if len(groups) > 1:
        split_at = min(line for g, line in groups.items() if g != 0)
        raise ParseError(
            f"{p}:{split_at}: ranks are split into {len(groups)} groups (NCCL_TESTS_SPLIT_MASK): each row "
            "times one group's communicator, not all ranks; rerun without NCCL_TESTS_SPLIT_MASK"
        )
    if not rows:
        if dropped:
            raise ParseError(
                f"{p}: no result row has a measured time ({dropped} rows with inf, nan or 0 us); "
                "rerun nccl-tests with iterations (-n) > 0"
            )
        if header_at is not None or ranks:
            why = (
                f"line {failed_at[0]}: {failed_at[1]!r}" if failed_at is not None
                else "the test failed or was killed before measuring"
            )  # fmt: skip
            raise ParseError(
                f"{p}:{last_nccl}: the run stopped after its header: no result rows follow this line "
                f"({why}); give the log of a run that completed"
            )
        raise ParseError(
            f"{p}: no nccl-tests result table found (expected '#  size  count  type  redop ...' and rows); "
            "give the stdout of all_reduce_perf / all_gather_perf"
        )
    if found_op is None:
        found_op = _op_from_name(p.name)
    rows, others = _one_sweep(rows)
    hosts = tuple(sorted({host for host, _ in ranks.values()}))
    nranks = (max(ranks) + 1) if ranks else None
    assumed: str | None = None
    if nodes is None and nranks is not None and len(ranks) == nranks:
        _check_even(p, ranks, rank_lines)  # a complete list is checked host by host
    if nodes is not None:
        n_nodes: int | None = nodes
    elif nranks is not None and len(ranks) < nranks:
        # an abridged rank list ("...") hides hosts: GPUs per node from the device indices where they count
        # GPUs, else from the ranks listed per host, the file name or the hint (nccl_tests_layout)
        per_node, assumed = abridged_per_node(
            p, ranks, rank_lines, nranks, name_nodes=_nodes_from_name(p.name), hint=hint
        )
        n_nodes = nranks // per_node
    else:
        n_nodes = len(hosts) or _nodes_from_name(p.name)
    gpn = nranks // n_nodes if nranks and n_nodes and nranks % n_nodes == 0 else None
    slurm = _slurm_name(p.name)
    if nranks is None and n_nodes and slurm is not None and slurm[1] == n_nodes:
        # a table without rank lines named after Slurm's -n and -N: both counts are the job's own
        gpn, nranks = slurm[0] // n_nodes, slurm[0]
        assumed = (
            f"no '#  Rank' lines: {n_nodes} nodes and {nranks} ranks ({gpn} per node) from the file name "
            "(Slurm's -N and -n)"
        )
    elif nranks is None and n_nodes and hint is not None:
        # a table without rank lines (a pasted or extracted table): nodes from the file name (or ``nodes``),
        # GPUs per node as the caller assumes them; the note says so
        gpn, nranks = hint.gpus_per_node, n_nodes * hint.gpus_per_node
        where = "as given" if nodes is not None else "from the file name"
        assumed = f"no '#  Rank' lines: {n_nodes} nodes {where}, {gpn} GPUs per node from {hint.source}"
    return NcclTestsLog(
        path=str(p),
        op=found_op,
        nranks=nranks,
        nodes=n_nodes,
        hosts=hosts,
        rows=tuple(rows),
        avg_busbw=avg,
        gpus_per_node=gpn,
        truncated_at=pending_at if pending is not None else None,
        dropped_rows=dropped,
        other_sweeps=others,
        inplace_only_rows=inplace_only,
        failed_at=failed_at,
        out_of_bounds=out_of_bounds,
        assumed=assumed,
    )


def _one_sweep(rows: list[NcclTestsRow]) -> tuple[list[NcclTestsRow], tuple[str, ...]]:
    """The rows of one (type, redop) sweep: all of them when there is one; with ``-d all`` / ``-o all``
    (one sweep per type and op, back to back in one table) the float/sum sweep, nccl-tests' default, or
    else the first. Sweeps time different arithmetic (int8 and f8 reductions run slower than float on
    the same bytes), so mixing them would blur the fit. Returns the rows and the other sweeps' names."""
    combos = list(dict.fromkeys((r.type, r.redop) for r in rows))
    if len(combos) <= 1:
        return rows, ()
    pick = next((c for c in combos if c[0] == "float" and c[1] in ("sum", "none")), combos[0])
    others = tuple(f"{t}/{o}" for t, o in combos if (t, o) != pick)
    return [r for r in rows if (r.type, r.redop) == pick], others


def _check_even(p: Path, ranks: dict[int, tuple[str, int]], rank_lines: dict[int, int]) -> None:
    """Refuse ranks spread unevenly over the hosts (12 on one, 4 on another): the model has one GPU count
    per node, and such a run's times belong to neither layout."""
    per_host: dict[str, list[int]] = {}
    for rank, (host, _) in sorted(ranks.items()):
        per_host.setdefault(host, []).append(rank)
    counts = {h: len(r) for h, r in per_host.items()}
    if len(set(counts.values())) <= 1:
        return
    usual = max(set(counts.values()), key=list(counts.values()).count)
    odd = next(h for h, c in counts.items() if c != usual)
    last = list(per_host)[-1]  # hosts in rank order
    if [h for h, c in counts.items() if c != usual] == [last] and counts[last] < usual:
        # the last host lists fewer ranks than every other one: a pasted list cut short, or a short node
        raise ParseError(
            f"{p}:{rank_lines[per_host[last][-1]]}: the rank list stops at rank {per_host[last][-1]}, "
            f"inside host {last} ({counts[last]} of the {usual} ranks the other hosts list): it was cut "
            "(give the complete log, every '#  Rank' line) or the last node ran fewer ranks (rerun with as "
            "many per node)"
        )
    spread = ", ".join(f"{h}: {c}" for h, c in list(counts.items())[:4]) + (", ..." * (len(counts) > 4))
    raise ParseError(
        f"{p}:{rank_lines[per_host[odd][0]]}: ranks are spread unevenly over the hosts ({spread}); the model "
        "needs the same GPUs on every node: rerun with as many ranks per node on each (mpirun -N / srun "
        "--ntasks-per-node)"
    )
