"""Every verb that creates a folder refuses a file, a non-empty folder or a broken link there, in one
line with exit 2, and leaves it as it was (a file or a dangling link gave tracebacks before)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fabricpace._errors import RunDirError
from fabricpace.run.destination import check_new_dir

VERBS = {
    "simulate": ["simulate", "--scenario", "paper", "--nodes", "4", "--steps", "30", "--out"],
    "study": ["study", "--scenario", "paper", "--repeats", "1", "--out"],
    "demo": ["demo", "--quick", "--out"],
    "lab run": ["lab", "run", "--scenario", "healthy", "--backend", "local", "--out"],
    "import": ["import", "kineto", str(Path(__file__).parents[1] / "importers" / "data" / "real_gloo"), "-o"],
}


def _destinations(tmp_path: Path) -> dict[str, Path]:
    afile = tmp_path / "afile"
    afile.write_text("mine")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    return {"a file": afile, "a non-empty folder": full, "a broken link": dangling}


def test_check_new_dir(tmp_path: Path) -> None:
    for kind, path in _destinations(tmp_path).items():
        with pytest.raises(RunDirError, match=str(path)):
            check_new_dir(path)
        assert os.path.lexists(path), kind
    empty = tmp_path / "empty"
    empty.mkdir()
    assert check_new_dir(empty) == empty
    assert check_new_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"


@pytest.mark.parametrize("verb", list(VERBS))
def test_every_verb_refuses_what_is_there(cli, tmp_path: Path, verb: str) -> None:  # type: ignore[no-untyped-def]
    for kind, path in _destinations(tmp_path).items():
        r = cli(*VERBS[verb], str(path))
        assert r.returncode == 2, (verb, kind, r.stderr[-800:])
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, (verb, kind, r.stderr)
        assert str(path) in r.stderr, (verb, kind, r.stderr)
    assert (tmp_path / "afile").read_text() == "mine"
    full = tmp_path / "full"
    assert (full / "keep.txt").read_text() == "mine" and len(list(full.iterdir())) == 1
    assert os.readlink(tmp_path / "dangling") == str(tmp_path / "nowhere")
