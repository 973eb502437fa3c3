"""Files that hold several complete nccl-tests runs, read as one log per run.

Sweep tools and job scripts often write several runs into one file: Slurm sweep scripts run
all_reduce_perf, all_gather_perf, reduce_scatter_perf, ... one after the other into one job log, and a job
script may run all_reduce_perf at several settings into the same log. ``parse_logs`` returns one
``NcclTestsLog`` per run, each exactly what ``nccl_tests.parse_log`` returns for that run split off by hand.

Where a file is split: where a second run announces itself (its ``# nccl-tests version`` /
``# Collective test starting:`` / ``# nThread`` line) after the run before it has result rows; the split
line is the one after that run's table (its last row or trailer), so the next run's command line and
launcher output go with it (the line ``nccl_tests._second_run`` names). Each part is read by the one parser
(``nccl_tests.parse_lines``) with its line numbers counted in the whole file, so every ``file:line`` in an
error or note names the line of the file the user has.

Still refused, as by ``parse_log``: a second header before any result (an nccl-tests built without
``MPI=1``, where every process printed its own header; or a run that stopped before its first row), a
second column header without a run header before it, and every run the parser refuses on its own (cut,
broken, unevenly spread): no run of a file is dropped. A file with one run gives a list of one log, the
log ``parse_log`` gives. Logs of a file with several runs carry ``run`` (index, first and last line), which
their ``name`` and ``label`` show; ``runs_notes`` says once per file which runs were found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path, PurePath

from fabricpace.fabric.nccl_tests import (
    NcclTestsLog,
    SecondRun,
    _read_lines,
    _strip_prefixes,
    parse_lines,
)
from fabricpace.fabric.nccl_tests_layout import LayoutHint


def parse_logs(
    path: str | Path, *, op: str | None = None, nodes: int | None = None, hint: LayoutHint | None = None
) -> list[NcclTestsLog]:
    """One log per complete nccl-tests run in the file at ``path``, in file order (``op`` / ``nodes``
    override what every run says, ``hint`` gives GPUs per node where a run cannot tell, as in
    ``parse_log``). Raises ParseError with ``file:line``."""
    p = Path(path)
    lines = _read_lines(p)
    parts: list[tuple[int, int, NcclTestsLog]] = []  # (first line, last line, log)
    start = 1
    while True:
        try:
            log = parse_lines(p, lines[start - 1 :], op=op, nodes=nodes, start=start, hint=hint)
        except SecondRun as exc:
            if not (exc.rows and exc.header):
                raise  # not a second run: no MPI=1, a run without results, a bare second column header
            # the run before the split read alone; a second parse of its lines, so that the checks made at
            # the end of a log (rank list cut, ranks spread unevenly) run on it as on a file of its own
            end = exc.split - 1
            alone = parse_lines(p, lines[start - 1 : end], op=op, nodes=nodes, start=start, hint=hint)
            parts.append((start, end, alone))
            start = exc.split
            continue
        parts.append((start, len(lines), log))
        break
    if len(parts) == 1:
        return [parts[0][2]]
    return [replace(log, run=(i, *_span(lines, a, b))) for i, (a, b, log) in enumerate(parts, start=1)]


def _span(lines: list[str], first: int, last: int) -> tuple[int, int]:
    """The lines ``first..last`` without the blank and bare ``#`` lines at either end (what a user would
    call the run's lines)."""

    def empty(i: int) -> bool:
        return _strip_prefixes(lines[i - 1]) in ("", "#")

    while first < last and empty(first):
        first += 1
    while last > first and empty(last):
        last -= 1
    return first, last


def runs_notes(logs: Sequence[NcclTestsLog]) -> list[str]:
    """One note per file of several runs among ``logs``: which runs it holds, at which lines."""
    by_file: dict[str, list[NcclTestsLog]] = {}
    for log in logs:
        if log.run is not None:
            by_file.setdefault(log.path, []).append(log)
    out = []
    for runs in by_file.values():
        parts = []
        for log in runs:
            assert log.run is not None
            ranks = (
                f" ({log.nranks} ranks on {log.nodes} nodes)" if log.nranks and log.nodes
                else f" ({log.nodes} nodes)" if log.nodes else ""
            )  # fmt: skip
            parts.append(f"{log.op or 'unknown collective'} lines {log.run[1]}-{log.run[2]}{ranks}")
        what = f"{len(runs)} nccl-tests runs, each read as one log: {', '.join(parts)}"
        out.append(f"note: {runs[0].file_name}: {what}")
    return out


def shown_names(paths: Sequence[str]) -> dict[str, str]:
    """How to name each path in provenance and notes: its base name, or, where several paths share one
    (per-job folders that all hold 'all_reduce_output.dat.5'), the shortest suffix of each that tells them
    apart ('n2.g4.x/all_reduce_output.dat.5'), the whole path as given at most. Keys are ``str(Path(p))``,
    as ``NcclTestsLog.path`` holds them."""
    keys = list(dict.fromkeys(str(PurePath(p)) for p in paths))
    by_base: dict[str, list[str]] = {}
    for key in keys:
        by_base.setdefault(PurePath(key).name, []).append(key)
    out = {key: PurePath(key).name for key in keys}
    for same in by_base.values():
        if len(same) < 2:
            continue
        parts = {key: PurePath(key).parts for key in same}
        for k in range(2, max(len(x) for x in parts.values()) + 1):
            suffix = {key: str(PurePath(*parts[key][-k:])) for key in same}
            if len(set(suffix.values())) == len(same):
                break
        out.update(suffix)
    return out


def distinct_names(logs: Sequence[NcclTestsLog]) -> list[NcclTestsLog]:
    """``logs`` with ``shown`` set where base names collide (``shown_names``), so that a fit's source
    ('fit:n2.g4.x/all_reduce_output.dat.5,n8.g4.y/all_reduce_output.dat.5') and the notes say which file
    each came from."""
    shown = shown_names([lg.path for lg in logs])
    return [lg if shown[lg.path] == Path(lg.path).name else replace(lg, shown=shown[lg.path]) for lg in logs]
