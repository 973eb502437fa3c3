"""All-or-nothing output for importers: build the run directory under a temporary name, rename at the end.

A failed import (bad input, a crash, Ctrl-C) leaves nothing at the destination, and an existing
non-empty destination is never touched: the user's data is not lost or overwritten.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fabricpace._errors import InputError, RunDirError
from fabricpace.run.destination import check_new_dir


def check_destination(out: str | os.PathLike[str]) -> Path:
    """Refuse an existing non-empty destination (a file, or a folder with anything in it)."""
    return check_new_dir(out, option="", what="output directory")


def _make_parents(path: Path) -> list[Path]:
    """Create the missing folders above ``path`` (as simulate and lab run do for their --out); the ones
    created, deepest first, so a failed import can take them away again."""
    missing = [p for p in path.parents if not p.exists()][::-1]
    for p in missing:
        try:
            p.mkdir()
        except OSError as exc:
            raise InputError(f"{p}: cannot create the output's folder ({exc.strerror})") from exc
    return missing[::-1]


@contextmanager
def staged_dir(out: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling folder of ``out``; on success rename it to ``out``, else delete it
    (and the parent folders it created)."""
    dest = check_destination(out)
    created = _make_parents(dest)
    tmp = dest.parent / f".{dest.name}.importing-{uuid.uuid4().hex[:8]}"
    done = False
    try:
        tmp.mkdir()
        yield tmp
        check_destination(dest)  # someone may have created it meanwhile
        if dest.exists():
            dest.rmdir()  # empty folder: replaced by the finished run
        os.replace(tmp, dest)
        done = True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if not done:
            for p in created:  # deepest first; a folder someone else filled meanwhile stays
                try:
                    p.rmdir()
                except OSError:
                    break


def list_sources(src: str | os.PathLike[str], suffixes: tuple[str, ...], *, what: str) -> list[Path]:
    """SRC itself when it is a file, or the files of a folder holding only files with the given suffixes.

    A file the user names is read whatever its name (``run.log.gz``, ``nccl.stdout``, a PBS
    ``job.o12345``): the parser says whether it is one, as ``collective --calibrate`` does. The suffixes
    only pick the files of a folder: hidden files are ignored, and a folder with other files in it is
    "mixed" and refused, so that a stray file never turns silently into a rank.
    """
    path = Path(src)
    if not path.exists():
        raise InputError(f"{path}: does not exist; pass a {what} file or a folder of them")
    if path.is_file():
        return [path]
    files = sorted(p for p in path.iterdir() if not p.name.startswith("."))
    if not files:
        raise RunDirError(f"{path}: empty folder; expected {what} files ({', '.join(suffixes)})")
    wanted = [p for p in files if p.is_file() and p.name.endswith(suffixes)]
    others = [p for p in files if p not in wanted]
    if not wanted:
        raise RunDirError(f"{path}: no {what} files ({', '.join(suffixes)}) in this folder")
    if others:
        raise RunDirError(
            f"{path}: mixed folder: {others[0].name} is not a {what} file ({', '.join(suffixes)}); "
            "move it out or pass the files' own folder"
        )
    return wanted
