"""Helpers shared by CLI verbs: list parsing, sizes, output formats."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fabricpace._errors import InputError

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1024,
    "KB": 1024,
    "KIB": 1024,
    "M": 1024**2,
    "MB": 1024**2,
    "MIB": 1024**2,
    "G": 1024**3,
    "GB": 1024**3,
    "GIB": 1024**3,
    "T": 1024**4,
    "TB": 1024**4,
    "TIB": 1024**4,
}


def parse_int_list(text: str, *, option: str) -> list[int]:
    """'2,4,8' -> [2, 4, 8]; positive integers only."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise InputError(f"{option} {text!r}: expected comma-separated integers such as 2,4,8") from exc
    if not values or any(v <= 0 for v in values):
        raise InputError(f"{option} {text!r}: expected positive integers such as 2,4,8")
    return values


def parse_size(text: str, *, option: str) -> int:
    """'32M' -> 33554432 (binary units, as nccl-tests uses)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise InputError(f"{option} {text!r}: expected a size such as 32M, 1G or 8G")
    value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise InputError(f"{option} {text!r}: size must be positive")
    return value


def parse_size_list(text: str, *, option: str) -> list[int]:
    return [parse_size(v, option=option) for v in text.split(",") if v.strip()]


FORMATS = ("table", "json", "csv", "text")


def check_format(value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InputError(f"--format {value!r}: choose one of {', '.join(allowed)}")
    return value


def count(n: int | None, noun: str, plural: str | None = None) -> str:
    """'1 rank', '4 ranks', '? ranks' (unknown): counts in text output read as English.

    ``plural`` for nouns that do not just take an s: ``count(2, "leaf", "leaves")``."""
    many = plural if plural is not None else noun + "s"
    if n is None:
        return f"? {many}"
    return f"{n} {noun if n == 1 else many}"


def check_output_path(path: Path, *, option: str) -> None:
    """Refuse, before any work, an output path with a file where a folder must be.

    ``-o notes.txt/report.html`` used to fail only when the file was written, after the work, with a
    NotADirectoryError traceback. Missing folders are left to each command (some create them, some
    ask the user to). Links are followed, as opening the path would.
    """
    for parent in path.parents:  # nearest first
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"{option} {path}: {parent} is a file, not a folder; choose another path")
            return


def check_writable(path: Path, *, option: str, creates_folders: bool, example: str | None = None) -> None:
    """Refuse, before any work, an output the command could not write: a file where a folder must be,
    a missing folder (``creates_folders=False``: the command does not create it) or a folder the user
    may not write in (permissions, a read-only filesystem).

    ``report -o ro/r.html`` and ``--save-calibration nodir/fit.yaml`` used to fail with a
    PermissionError / FileNotFoundError traceback (exit 1) when the file was written, after all the work.
    The folder the output goes into is checked: the output itself when it is an existing folder (an
    empty ``--out`` run directory), else the nearest folder above it that exists.
    """
    check_output_path(path, option=option)
    label = f"{option} {path}"
    if path.is_dir() and example is not None:
        raise InputError(f"{label}: is a folder; pass a file name such as {example}")
    if not creates_folders and not path.parent.is_dir():
        raise InputError(f"{label}: folder {path.parent} does not exist; create it first")
    folder = next((p for p in (path, *path.parents) if p.is_dir()), None)
    if folder is None:  # only a relative path with nothing above it: the working folder
        folder = Path(".")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(
            f"{label}: cannot write in {folder} (permission denied or read-only); choose another folder"
        )


def require_torch(what: str) -> None:
    """Refuse up front (exit 2) when ``what`` starts real ranks and torch is not installed.

    Without this the ranks start, each fails on ``import torch``, and the user gets exit 1 with a
    worker's traceback line after the rest of the command already ran.
    """
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise InputError(
            f"{what} starts real training ranks and needs torch; "
            "pip install '.[torch]' in the fabricpace checkout"
        )


def stderr_progress(enabled: bool = True) -> Any:
    """A rich progress bar (description, bar, n/total, elapsed) on stderr, for long CLI work.

    Off when stderr is not a terminal: a redirected bar only leaves a blank line in front of an
    error, which must be the one line the user sees; stdout (``--format json``) is never touched."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not (enabled and err.is_terminal),
    )


def human_size(n: int) -> str:
    """Bytes as nccl-tests' size column writes them: 32M, 1G, 4K, else the plain number."""
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def size_range_note(sizes: list[int], fitted: tuple[int, int] | None, *, what: str = "size(s)",
                    name: Callable[[int], str] = human_size) -> str | None:
    """A note naming ``sizes`` outside the size range of a calibration's rows (``tuning.calibrated_sizes``):
    the fit used only those rows, and its fixed cost (base_us) carries their fixed costs, which smaller
    sizes do not have (docs/cluster-files.md, "Sizes outside the calibrated range"). None when all are in
    it or the cluster was not calibrated."""
    if fitted is None:
        return None
    lo, hi = fitted
    out = [s for s in sizes if not lo <= s <= hi]
    if not out:
        return None
    names = ", ".join(name(s) for s in out[:8]) + (", ..." if len(out) > 8 else "")
    why = []
    if any(s < lo for s in out):
        why.append(
            "below it the fitted fixed cost dominates (on the H100 InfiniBand logs 1-8 MiB came out 30-99% "
            "too slow)"
        )
    if any(s > hi for s in out):
        why.append("above it no measured row checks the model")
    return (
        f"note: {what} {names} outside the calibrated range {human_size(lo)}..{human_size(hi)} (the rows "
        f"the fit used): {'; '.join(why)}; treat them as rough (docs/cluster-files.md)"
    )
