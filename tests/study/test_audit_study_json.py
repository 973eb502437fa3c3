"""study --format json says where the study folder, study.json and the figures are, and what was run."""

from __future__ import annotations

import json
from pathlib import Path

SMALL = ["--backend", "sim", "--cluster", "single-switch", "--workload", "resnet-50", "--steps", "12",
         "--warmup", "2"]


def test_study_json_says_where_the_study_folder_is(cli, tmp_path):
    # Without --out the folder is runs/study-TIME (or -1, -2, ...): before, the JSON held the rows only,
    # and a script could not find study.json, the figures or the run directories.
    r = cli("study", *SMALL, "--nodes", "1,2", "--repeats", "1", "--format", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    study_dir = tmp_path / doc["study_dir"]
    assert study_dir.parent == tmp_path / "runs" and study_dir.name.startswith("study-")
    assert tmp_path / doc["study_json"] == study_dir / "study.json"
    assert (study_dir / "study.json").is_file()
    assert tmp_path / doc["figures"][0] == study_dir / "figures.html"
    assert doc["plan"]["nodes"] == [1, 2] and doc["plan"]["warmup"] == 2 and doc["plan"]["steps"] == 12
    assert doc["rows"] == json.loads((study_dir / "study.json").read_text())["rows"]


def test_study_json_without_figures_lists_none(cli, tmp_path):
    out = tmp_path / "s"
    r = cli("study", *SMALL, "--nodes", "1", "--repeats", "1", "--no-figures", "--format", "json",
            "--out", str(out))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["figures"] == [] and Path(doc["study_dir"]) == out and not (out / "figures.html").exists()
